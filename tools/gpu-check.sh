#!/bin/sh
# tools/gpu-check.sh [OUT]: the GPU check, one command on a machine with an NVIDIA GPU (network not
# needed). Builds alloy in build-gpu/ (release, CUDA required, tests on; cmocka from tools/deps/ when
# the machine has none), runs every test suite (the cuda_gpu suite runs the CUDA backend on the GPU
# against the CPU), trains char_gpt (f16 AMP, 300 steps) and mlp_csv on the GPU, times PyTorch on
# the same char_gpt model (bench/char_gpt_gpu.py, when torch is installed), and prints a table that
# it also writes to OUT/gpu-check.txt (OUT defaults to gpu-check/); logs go to OUT too.
# Exit status: 0 when every check passed, 1 otherwise.
# tools/gpu-check.sh --kit KIT [OUT]: runs a kit that tools/gpu-kit.sh packed elsewhere, in stages that each
# report as they finish, building nothing (no meson, pkg-config or cmocka needed): tools/gpu-kit-run.sh.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = --kit ]; then
    [ $# -ge 2 ] || { echo "usage: tools/gpu-check.sh --kit KIT [OUT]"; exit 2; }
    shift
    exec sh "$root/tools/gpu-kit-run.sh" "$@"
fi
for t in meson pkg-config; do
    command -v $t >/dev/null 2>&1 && continue
    echo "gpu-check: no $t on PATH: building here needs meson and pkg-config (for cmocka); on a machine"
    echo "without them, pack a kit elsewhere (tools/gpu-kit.sh KIT) and run tools/gpu-check.sh --kit KIT"
    exit 1
done
out=${1:-$root/gpu-check}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
build=$root/build-gpu
log=$out/build-and-test.log
report=$out/gpu-check.txt
: >"$log"
status=0
say() { printf '== %s\n' "$*"; }
row() { printf '| %s | %s |\n' "$1" "$2" >>"$report.tmp"; }
: >"$report.tmp"

# ---- CUDA: CUDA_PATH, nvcc on PATH, or /usr/local/cuda ----
cuda=""
if [ -n "${CUDA_PATH:-}" ] && [ -x "$CUDA_PATH/bin/nvcc" ]; then cuda=$CUDA_PATH
elif command -v nvcc >/dev/null 2>&1; then cuda=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
elif [ -x /usr/local/cuda/bin/nvcc ]; then cuda=/usr/local/cuda
fi
if [ -z "$cuda" ]; then
    echo "gpu-check: no CUDA toolkit (CUDA_PATH, nvcc on PATH or /usr/local/cuda)"
    exit 1
fi
export CUDA_PATH=$cuda PATH="$cuda/bin:$PATH"
export LD_LIBRARY_PATH="$cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
say "CUDA toolkit: $cuda"
if command -v nvidia-smi >/dev/null 2>&1; then
    gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
else
    gpu="(no nvidia-smi)"
fi
say "GPU: $gpu"

# ---- cmocka: the machine's, or Debian 12's packages carried in tools/deps ----
if ! pkg-config --exists cmocka 2>/dev/null; then
    deps=$build-deps
    rm -rf "$deps" && mkdir -p "$deps"
    for deb in "$root"/tools/deps/libcmocka*.deb; do
        dpkg -x "$deb" "$deps" || { echo "gpu-check: cannot unpack $deb (dpkg -x)"; exit 1; }
    done
    pcdir=$deps/usr/lib/x86_64-linux-gnu/pkgconfig
    sed -i "s|/usr|$deps/usr|g" "$pcdir/cmocka.pc"
    export PKG_CONFIG_PATH="$pcdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH"
    say "cmocka: unpacked from tools/deps into $deps"
fi

# ---- build ----
setup="meson setup $build -Dtests=enabled -Dcuda=enabled -Dbuildtype=release"
[ -e "$build/meson-private/coredata.dat" ] && setup="$setup --reconfigure"
say "$setup"
if ! $setup >>"$log" 2>&1 || ! meson compile -C "$build" >>"$log" 2>&1; then
    echo "gpu-check: the build failed; see $log"
    tail -30 "$log"
    exit 1
fi

# ---- tests ----
say "meson test -C $build"
cores=$(nproc 2>/dev/null || echo 4)
meson test -C "$build" --print-errorlogs --num-processes "$cores" >>"$log" 2>&1
counts=$(python3 - "$build/meson-logs/testlog.json" <<'EOF'
import json, sys
ok = bad = skip = 0
gpu = "missing"
failed = []
for line in open(sys.argv[1]):
    if not line.strip():
        continue
    t = json.loads(line)
    r = t.get("result")
    if t.get("name") == "cuda_gpu":
        gpu = r
    if r in ("OK", "EXPECTEDFAIL"):
        ok += 1
    elif r == "SKIP":
        skip += 1
    else:
        bad += 1
        failed.append(t.get("name"))
print(f"{ok} passed, {bad} failed, {skip} skipped" + (f" ({', '.join(failed)})" if failed else ""))
print(gpu)
EOF
) || counts="no test log
missing"
tests_line=$(echo "$counts" | sed -n 1p)
gpu_suite=$(echo "$counts" | sed -n 2p)
row "meson test (every suite)" "$tests_line"
row "cuda_gpu: the CUDA backend on the GPU against the CPU" "$gpu_suite"
case $tests_line in *" 0 failed"*) ;; *) status=1 ;; esac
[ "$gpu_suite" = OK ] || status=1
grep -h "on the GPU:" "$build/meson-logs/testlog.txt" 2>/dev/null | sed 's/^/   /' >"$out/cuda_gpu_numbers.txt"

# ---- char_gpt on the GPU: f16 AMP, 300 steps ----
say "char_gpt --device cuda --steps 300"
"$build/examples/char_gpt" --device cuda --steps 300 --log-every 1 >"$out/char_gpt_cuda.log" 2>&1
rc=$?
device=$(sed -n 's/^device: //p' "$out/char_gpt_cuda.log" | head -1)
last=$(awk '/^step / { loss = $4 } END { print loss }' "$out/char_gpt_cuda.log")
val=$(awk '/^val_loss/ { v = $2 } END { print v }' "$out/char_gpt_cuda.log")
toks=$(awk '/^step / && $2 > 10 { print $10 }' "$out/char_gpt_cuda.log" | sort -n |
    awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }')
ms=$(awk -v t="${toks:-0}" 'BEGIN { if (t > 0) printf "%.3f", 32 * 64 / t * 1000; else print "-" }')
if [ $rc -eq 0 ] && [ -n "$val" ] && awk -v v="$val" 'BEGIN { exit !(v < 1.8) }'; then verdict=pass; else verdict=FAIL; status=1; fi
row "char_gpt f16 AMP on $device" "$verdict: 300 steps, last loss $last, val_loss $val (< 1.8), median $toks tok/s = $ms ms/step"

# ---- mlp_csv on the GPU ----
say "mlp_csv --device cuda"
"$build/examples/mlp_csv" --device cuda >"$out/mlp_csv_cuda.log" 2>&1
rc=$?
acc=$(sed -n 's/^test_accuracy //p' "$out/mlp_csv_cuda.log" | tail -1)
if [ $rc -eq 0 ] && [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a > 0.9) }'; then verdict=pass; else verdict=FAIL; status=1; fi
row "mlp_csv (synthetic shells, f32) on the GPU" "$verdict: test_accuracy $acc (> 0.9)"

# ---- PyTorch on the same char_gpt model ----
say "bench/char_gpt_gpu.py"
python3 "$root/bench/char_gpt_gpu.py" --compile >"$out/char_gpt_torch.log" 2>&1
head -1 "$out/char_gpt_torch.log" | sed 's/^/   /'
while IFS="$(printf '\t')" read -r kind name value; do
    [ "$kind" = ms_per_step ] || continue
    ratio=$(awk -v a="$ms" -v b="$value" 'BEGIN { if (a + 0 > 0) printf "alloy f16 / this: %.2f", a / b; else print "" }')
    row "PyTorch char_gpt, $name" "$value ms/step ($ratio)"
done <"$out/char_gpt_torch.log"
grep -q ms_per_step "$out/char_gpt_torch.log" || row "PyTorch char_gpt" "$(head -1 "$out/char_gpt_torch.log")"

{
    echo "# alloy GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "# GPU: $gpu"
    echo
    echo "| check | result |"
    echo "|---|---|"
    cat "$report.tmp"
    if [ -s "$out/cuda_gpu_numbers.txt" ]; then
        echo
        echo "cuda_gpu suite measurements:"
        cat "$out/cuda_gpu_numbers.txt"
    fi
} >"$report"
rm -f "$report.tmp"
cat "$report"
[ $status -eq 0 ] && echo "gpu-check: passed" || echo "gpu-check: FAILED (logs in $out)"
exit $status
