#!/bin/sh
# tools/gpu-kit-run.sh [KIT] [OUT]: runs a kit that tools/gpu-kit.sh packed (copied into it as run.sh; KIT
# defaults to this script's folder; `tools/gpu-check.sh --kit KIT [OUT]` calls it) in stages, each under its own
# `timeout`, printing each stage's result and appending it to OUT/gpu-check.txt as it goes (OUT defaults to
# KIT/../gpu-check-out), so a run cut short still reports the stages it finished:
#   device     nvidia-smi: the GPU, its driver and memory (PASS), or SKIP with why there is none
#   suite      bin/test_cuda gpu (the cuda_gpu suite) with LD_LIBRARY_PATH=KIT/lib
#   char_gpt   bin/char_gpt --device cuda, f16 AMP, 300 steps (val_loss must be below 1.8)
#   cost       bin/gpu_step --cost: the cost model's modelled step (runs without a GPU)
#   gpu_step   bin/gpu_step on the GPU with ALLOY_PROFILE (its profile table in OUT/), the model beside
#   gpt2       as gpu_step for GPT-2 B8, when the kit's cache holds it (tools/gpu-kit.sh --gpt2)
# Every stage uses KIT/cache as ALLOY_CACHE_DIR. Needs neither meson nor pkg-config (it says whether they are
# there). Without a GPU every GPU stage is SKIP with the reason (a binary is still started, which checks that
# it loads with the kit's libraries), never PASS. Stage time limits add up to 300 s.
# Exit status: 0 when no stage failed, 1 otherwise.
set -u
here=$(cd "$(dirname "$0")" && pwd)
kit=${1:-$here}
[ -d "$kit/bin" ] || { echo "gpu-check: $kit is no kit (no bin/; tools/gpu-kit.sh makes one)"; exit 1; }
kit=$(cd "$kit" && pwd)
out=${2:-$kit/../gpu-check-out}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
report=$out/gpu-check.txt
status=0
row() { # row STAGE RESULT: printed and appended at once
    printf '| %s | %s |\n' "$1" "$2" | tee -a "$report"
    case $2 in FAIL*) status=1 ;; esac
}
note() { printf '%s\n' "$*" | tee -a "$report"; }
{
    echo "# alloy GPU check (kit), started $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    sed -n 1,4p "$kit/MANIFEST.txt" 2>/dev/null | sed 's/^/# kit: /'
    echo
    echo "| stage | result |"
    echo "|---|---|"
} | tee "$report"

cuda=${CUDA_PATH:-/usr/local/cuda}
export LD_LIBRARY_PATH="$kit/lib:$cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ALLOY_CACHE_DIR=$kit/cache
tools=""
for t in pkg-config meson ninja nvcc; do
    command -v $t >/dev/null 2>&1 && tools="$tools $t: yes," || tools="$tools $t: no,"
done
row tools "${tools# } none needed with --kit"
first_line() { grep -v '^ *$' "$1" | tail -1 | tr '|' '/' | cut -c1-200; }
# stage NAME SECONDS LOG COMMAND...: runs it under timeout; sets rc (124: timed out)
stage() {
    name=$1 limit=$2 log=$3; shift 3
    t0=$(date +%s)
    timeout -k 5 "$limit" "$@" >"$log" 2>&1
    rc=$?
    took=$(($(date +%s) - t0))
}

# ---- device facts ----
gpu="" why=""
if ! command -v nvidia-smi >/dev/null 2>&1; then why="no nvidia-smi on PATH"
else
    stage device 20 "$out/device.log" nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
    if [ $rc -eq 0 ] && [ -s "$out/device.log" ]; then gpu=$(head -1 "$out/device.log")
    else why="nvidia-smi lists no GPU: $(first_line "$out/device.log")"
    fi
fi
if [ -n "$gpu" ]; then row device "PASS: $gpu; $(nproc) cores"
else row device "SKIP: $why; $(nproc) cores"
fi

# ---- the GPU suite ----
stage suite 100 "$out/test_cuda_gpu.log" "$kit/bin/test_cuda" gpu
case $rc in
0) row "suite (test_cuda gpu)" "PASS: $(grep -c '^\[       OK \]' "$out/test_cuda_gpu.log") tests, $took s" ;;
77) row "suite (test_cuda gpu)" "SKIP: $(sed -n 's/^SKIP: //p' "$out/test_cuda_gpu.log" | head -1)" ;;
124 | 137) row "suite (test_cuda gpu)" "FAIL: timed out after 100 s (log: test_cuda_gpu.log)" ;;
*) row "suite (test_cuda gpu)" "FAIL: exit $rc: $(first_line "$out/test_cuda_gpu.log")" ;;
esac
grep -h "on the GPU:" "$out/test_cuda_gpu.log" 2>/dev/null | sed 's/^/   /' | tee -a "$report"

# ---- char_gpt, 300 steps ----
if [ ! -x "$kit/bin/char_gpt" ]; then row char_gpt "SKIP: the kit has no bin/char_gpt"
elif [ -z "$gpu" ]; then
    stage char_gpt 10 "$out/char_gpt.log" "$kit/bin/char_gpt" --help
    [ $rc -eq 0 ] && row char_gpt "SKIP: no GPU ($why); the binary starts" ||
        row char_gpt "FAIL: no GPU, and bin/char_gpt --help exits $rc: $(first_line "$out/char_gpt.log")"
else
    stage char_gpt 40 "$out/char_gpt.log" "$kit/bin/char_gpt" --device cuda --steps 300 --log-every 1 --text "$kit/data/GPL-3"
    val=$(awk '/^val_loss/ { v = $2 } END { print v }' "$out/char_gpt.log")
    last=$(awk '/^step / { loss = $4 } END { print loss }' "$out/char_gpt.log")
    toks=$(awk '/^step / && $2 > 10 { print $10 }' "$out/char_gpt.log" | sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }')
    if [ $rc -eq 0 ] && [ -n "$val" ] && awk -v v="$val" 'BEGIN { exit !(v < 1.8) }'; then
        row char_gpt "PASS: 300 steps in $took s, last loss $last, val_loss $val (< 1.8), median ${toks:-?} tok/s"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then row char_gpt "FAIL: timed out after 40 s (log: char_gpt.log)"
    else row char_gpt "FAIL: exit $rc, val_loss ${val:--}: $(first_line "$out/char_gpt.log")"
    fi
fi

# ---- the benchmark: the cost model (no GPU needed), then the step profiled on the GPU ----
bench() { # bench MODEL LIMIT: the cost model's figures, then the run with ALLOY_PROFILE
    model=$1 lim=$2
    stage cost 30 "$out/cost-$model.log" "$kit/bin/gpu_step" --model "$model" --dtype f16 --cost
    if [ $rc -eq 0 ]; then
        row "cost ($model f16)" "PASS: $(sed -n 's/^modelled *//p' "$out/cost-$model.log" | head -1), $(sed -n 's/^launches *\([0-9]*\).*/\1 launches/p' "$out/cost-$model.log" | head -1) ($(sed -n 's/^# device [^:]*: //p' "$out/cost-$model.log" | head -1); cost-$model.log)"
    else row "cost ($model f16)" "FAIL: exit $rc: $(first_line "$out/cost-$model.log")"
    fi
    if [ -z "$gpu" ]; then row "gpu_step ($model f16)" "SKIP: no GPU ($why)"; return; fi
    stage gpu_step "$lim" "$out/gpu_step-$model.log" env ALLOY_PROFILE=10 "$kit/bin/gpu_step" --model "$model" \
        --dtype f16 --steps 10 --warmup 3
    res=$(grep '^result' "$out/gpu_step-$model.log" | tail -1)
    if [ $rc -eq 0 ] && [ -n "$res" ]; then
        ms=$(echo "$res" | tr '\t' '\n' | sed -n 's/^ms=//p')
        lo=$(echo "$res" | tr '\t' '\n' | sed -n 's/^model_ms_lo=//p')
        hi=$(echo "$res" | tr '\t' '\n' | sed -n 's/^model_ms_hi=//p')
        first=$(echo "$res" | tr '\t' '\n' | sed -n 's/^first_s=//p')
        row "gpu_step ($model f16)" "PASS: $ms ms/step measured, $lo-$hi ms modelled, first step $first s (profile: gpu_step-$model.log)"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then row "gpu_step ($model f16)" "FAIL: timed out after $lim s"
    else row "gpu_step ($model f16)" "FAIL: exit $rc: $(first_line "$out/gpu_step-$model.log")"
    fi
}
if [ ! -x "$kit/bin/gpu_step" ]; then
    row "cost (mlp f16)" "SKIP: the kit has no bin/gpu_step"
    row "gpu_step (mlp f16)" "SKIP: the kit has no bin/gpu_step"
else bench mlp 40
fi
if [ -x "$kit/bin/gpu_step" ] && grep -q '^cache: .*gpt2: yes' "$kit/MANIFEST.txt" 2>/dev/null; then bench gpt2 40
else row "gpt2" "SKIP: the kit's cache has no GPT-2 (tools/gpu-kit.sh --gpt2)"
fi

note ""
note "# finished $(date -u '+%Y-%m-%d %H:%M:%S UTC'); logs in $out"
[ $status -eq 0 ] && echo "gpu-check: no stage failed" || echo "gpu-check: FAILED (logs in $out)"
exit $status
