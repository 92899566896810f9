#!/bin/sh
# tests/gpu_kit_test.sh SRC BUILD: the GPU kit's logic without a GPU: tools/gpu-kit.sh --quick packs a kit from BUILD
# into a temp folder, tools/gpu-check.sh --kit runs it, and the report must hold every stage, SKIP (never PASS)
# for those that need a GPU, the cost model's figures, and a kit under 48 MiB whose binaries find every library
# they need outside a base system in its lib/. Then a kit whose suite binary fails must report FAIL and exit 1.
# Exit 77 (a skip) without the CUDA toolkit's nvcc and NVRTC, which fill the kit's kernel cache.
set -u
src=$1 build=$2
cuda=${CUDA_PATH:-/usr/local/cuda}
if [ ! -x "$cuda/bin/nvcc" ] || ! ls "$cuda"/lib64/libnvrtc.so* >/dev/null 2>&1; then
    echo "SKIP: no CUDA toolkit with NVRTC at $cuda (CUDA_PATH): it fills the kit's kernel cache"
    exit 77
fi
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fails=0
check() { # check WHAT CONDITION...: one assertion, printed
    what=$1; shift
    if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; fails=$((fails + 1)); fi
}
has() { grep -q -- "$1" "$2"; }

CUDA_PATH=$cuda sh "$src/tools/gpu-kit.sh" "$tmp/kit" --build "$build" --quick >"$tmp/kit.log" 2>&1
rc=$?
cat "$tmp/kit.log"
[ $rc -eq 0 ] || { echo "FAILED: tools/gpu-kit.sh exited $rc"; exit 1; }
bytes=$(du -sb "$tmp/kit" | cut -f1)
check "the kit is $bytes bytes, at most 48 MiB" [ "$bytes" -le $((48 * 1024 * 1024)) ]
check "gpu-kit.sh printed the size" has "kit: $tmp/kit, $bytes bytes" "$tmp/kit.log"
check "the kit carries libcmocka.so.0" [ -f "$tmp/kit/lib/libcmocka.so.0" ]
check "the kernel cache holds sm_90 entries" [ "$(ls "$tmp/kit/cache" | grep -c '\.kernel$')" -gt 0 ]
check "the kit has its run script" [ -x "$tmp/kit/run.sh" ]
for bin in "$tmp"/kit/bin/*; do
    LD_LIBRARY_PATH="$tmp/kit/lib" ldd "$bin" >"$tmp/ldd.txt" 2>&1
    check "$(basename "$bin") finds cmocka/liballoy in the kit's lib/ and misses nothing" \
        sh -c "! grep -q 'not found' '$tmp/ldd.txt' && ! grep -E 'libcmocka|liballoy' '$tmp/ldd.txt' | grep -qv '$tmp/kit/lib/'"
done

gpu=0
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && gpu=1
sh "$src/tools/gpu-check.sh" --kit "$tmp/kit" "$tmp/out" >"$tmp/run.log" 2>&1
rc=$?
cat "$tmp/run.log"
report=$tmp/out/gpu-check.txt
check "gpu-check.sh --kit exits 0" [ $rc -eq 0 ]
check "the report says meson/pkg-config are not needed" has '^| tools | .*none needed with --kit' "$report"
for stage in 'device' 'suite (test_cuda gpu)' 'char_gpt' 'gpu_step (mlp f16)' 'gpt2'; do
    if [ $gpu = 0 ]; then
        check "stage '$stage' is SKIP without a GPU" has "^| $stage | SKIP: " "$report"
    else
        check "stage '$stage' is in the report" has "^| $stage | " "$report"
    fi
done
if [ $gpu = 0 ]; then
    check "no stage says PASS but the cost model" sh -c "! grep '| PASS' '$report' | grep -qv '^| cost '"
    check "the suite's SKIP gives the reason" has '^| suite (test_cuda gpu) | SKIP: no GPU to run the CUDA backend on: ' "$report"
fi
if [ -x "$tmp/kit/bin/gpu_step" ]; then
    check "the cost model's step time is reported" has '^| cost (mlp f16) | PASS: [0-9.]* - [0-9.]* ms per step, [0-9]* launches' "$report"
else
    check "the cost stage says why it is skipped" has '^| cost (mlp f16) | SKIP: the kit has no bin/gpu_step' "$report"
fi
check "the report ends with its finish line" has '^# finished ' "$report"

# a failing stage: the suite binary replaced by one that exits 3
printf '#!/bin/sh\necho "the device faulted" >&2\nexit 3\n' >"$tmp/kit/bin/test_cuda"
chmod +x "$tmp/kit/bin/test_cuda"
sh "$src/tools/gpu-check.sh" --kit "$tmp/kit" "$tmp/out2" >"$tmp/run2.log" 2>&1
rc=$?
check "a failing stage makes gpu-check.sh --kit exit 1" [ $rc -eq 1 ]
check "the failing stage is FAIL with its exit and last line" \
    has '^| suite (test_cuda gpu) | FAIL: exit 3: the device faulted |' "$tmp/out2/gpu-check.txt"
check "the stages after it still report" has '^| gpt2 | ' "$tmp/out2/gpu-check.txt"
sh "$src/tools/gpu-check.sh" --kit "$tmp/nowhere" >"$tmp/run3.log" 2>&1
rc=$?
check "a folder that is no kit is refused (exit 1, saying why)" sh -c "[ $rc -eq 1 ] && grep -q 'is no kit' '$tmp/run3.log'"

[ $fails -eq 0 ] && echo "gpu_kit: all checks passed" || echo "gpu_kit: $fails checks failed"
[ $fails -eq 0 ]
