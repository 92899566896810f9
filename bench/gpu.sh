#!/bin/sh
# bench/gpu.sh [options] [OUT]: alloy against PyTorch on a GPU, one command on a machine with an NVIDIA GPU,
# meson, ninja and PyTorch (no network needed). Builds bench/gpu_step (build-bench/: release, CUDA required,
# benchmarks on, no tests), then for each model and dtype runs, interleaved, alloy (bench/gpu_step.c) and
# PyTorch (bench/gpu_torch.py: eager, torch.compile, torch.compile mode="reduce-overhead") on the same shapes,
# optimizer (AdamW; fused in PyTorch) and loss scaling (f16: dynamic scaler / GradScaler), TF32 off; each timed
# after warm-up, median of the timed steps. Prints one table (bench/gpu_report.py) of ms/step, tokens or samples/s,
# achieved TFLOP/s, peak device memory, first step (compile) and warm-up time, alloy / best PyTorch, and beside
# each alloy row the cost model's step time for the same compiled step on this GPU's constants (modelled, not
# measured: docs/cuda.md, "The cost model"), and writes it to OUT/gpu-bench.txt (OUT defaults to gpu-bench/); every process's output goes to OUT/logs/.
#
# options:
#   --quick              tiny shapes, 3 timed steps, on the CPU (device=cpu, torch on the CPU, one thread each
#                        unless OMP_NUM_THREADS / ALLOY_NUM_THREADS say otherwise), PyTorch eager only unless
#                        --torch-modes says more: checks this script's logic on a machine without a GPU
#   --models LIST        char_gpt,mlp,gpt2,gpt2_flash (default: all four)
#   --dtypes LIST        f32,f16,bf16 (default: all three)
#   --torch-modes LIST   eager,compile,reduce-overhead (default: all three; --quick: eager)
#   --steps N, --warmup N  timed steps (default 20; --quick 3) and warm-up runs (default 5; --quick 2)
#   --build DIR          build directory (default build-bench/); an existing one is reused
#   --python EXE         the interpreter with torch (default python3)
#   --timeout S          seconds each process may take before it is killed (default 300)
#   --budget S           start no run once S seconds have passed since the script began (the rest are listed
#                        as skipped), so a machine lent for a fixed time still returns a table (default: none)
# Exit status: 0 when every run produced a result, 1 when any failed (the table says which), 2 when there is
# no GPU (not --quick) or the build failed.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
quick=0 models=char_gpt,mlp,gpt2,gpt2_flash dtypes=f32,f16,bf16 modes="" steps="" warmup=""
build=$root/build-bench python=python3 timeout_s=300 budget_s=0 out=""
started=$(date +%s)
while [ $# -gt 0 ]; do
    case $1 in
    --quick) quick=1 ;;
    --models) models=$2; shift ;;
    --dtypes) dtypes=$2; shift ;;
    --torch-modes) modes=$2; shift ;;
    --steps) steps=$2; shift ;;
    --warmup) warmup=$2; shift ;;
    --build) build=$2; shift ;;
    --python) python=$2; shift ;;
    --timeout) timeout_s=$2; shift ;;
    --budget) budget_s=$2; shift ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu.sh: unknown option $1 (see --help)"; exit 2 ;;
    *) out=$1 ;;
    esac
    shift
done
if [ $quick = 1 ]; then
    device=cpu quickflag=--quick
    : "${modes:=eager}" "${steps:=3}" "${warmup:=2}"
    # one thread each: on a small shared machine PyTorch's default threads spin against each other
    # (a 6-MFLOP step took 600 ms instead of 3); OMP_NUM_THREADS / ALLOY_NUM_THREADS set outside win
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" ALLOY_NUM_THREADS="${ALLOY_NUM_THREADS:-1}"
else
    device=cuda quickflag=""
    : "${modes:=eager,compile,reduce-overhead}" "${steps:=20}" "${warmup:=5}"
fi
out=${out:-$root/gpu-bench}
mkdir -p "$out/logs" || exit 2
out=$(cd "$out" && pwd)
results=$out/results.tsv
: >"$results"
say() { printf '== %s\n' "$*"; }

# ---- the GPU (not --quick): fail at once, clearly, without one ----
gpu="cpu (--quick)"
if [ $quick = 0 ]; then
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
        echo "gpu.sh: no NVIDIA GPU here (nvidia-smi is missing or lists none); bench/gpu.sh --quick checks the scripts on the CPU"
        exit 2
    fi
    gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
    cuda=""
    if [ -n "${CUDA_PATH:-}" ] && [ -x "$CUDA_PATH/bin/nvcc" ]; then cuda=$CUDA_PATH
    elif command -v nvcc >/dev/null 2>&1; then cuda=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    elif [ -x /usr/local/cuda/bin/nvcc ]; then cuda=/usr/local/cuda
    fi
    if [ -z "$cuda" ]; then
        echo "gpu.sh: no CUDA toolkit (CUDA_PATH, nvcc on PATH or /usr/local/cuda): its headers build alloy's CUDA backend"
        exit 2
    fi
    export CUDA_PATH=$cuda PATH="$cuda/bin:$PATH"
    export LD_LIBRARY_PATH="$cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
say "GPU: $gpu"

# ---- build gpu_step ----
cudaopt=-Dcuda=enabled
[ $quick = 1 ] && cudaopt=-Dcuda=auto
if [ ! -e "$build/build.ninja" ]; then
    say "meson setup $build"
    if ! meson setup "$build" -Dbench=true -Dtests=disabled -Dbuildtype=release $cudaopt >"$out/logs/build.log" 2>&1; then
        echo "gpu.sh: meson setup failed; see $out/logs/build.log"; tail -20 "$out/logs/build.log"; exit 2
    fi
fi
say "ninja -C $build bench/gpu_step"
if ! ninja -C "$build" bench/gpu_step >>"$out/logs/build.log" 2>&1; then
    echo "gpu.sh: the build failed; see $out/logs/build.log"; tail -30 "$out/logs/build.log"; exit 2
fi
if [ $quick = 0 ] && ! "$build/bench/gpu_step" --model mlp --quick --steps 1 --warmup 1 >"$out/logs/device-check.log" 2>&1; then
    echo "gpu.sh: alloy cannot run on the GPU: $(tail -1 "$out/logs/device-check.log")"
    exit 2
fi

# ---- the runs: per model and dtype, alloy then PyTorch ----
status=0
run() { # run LOG COMMAND...: appends the command's result lines to results.tsv; a failure becomes a result line
    log=$1; shift
    if [ "$budget_s" -gt 0 ] && [ $(($(date +%s) - started)) -ge "$budget_s" ]; then
        printf 'result\t%s\tfailed=skipped: the %s s budget was spent\n' "$TAGS" "$budget_s" >>"$results"
        echo "   skipped: the $budget_s s budget was spent"
        status=1
        return
    fi
    timeout -k 10 "$timeout_s" "$@" >"$log" 2>&1
    rc=$?
    grep '^result' "$log" >>"$results"
    if ! grep -q '^result' "$log" || [ $rc -ne 0 ]; then
        status=1
        why=$(grep -v '^result' "$log" | grep -v '^ *$' | tail -1 | tr '\t' ' ' | cut -c1-200)
        [ $rc -eq 124 ] && why="timed out after $timeout_s s"
        grep -q '^result' "$log" || printf 'result\t%s\tfailed=exit %s: %s\n' "$TAGS" "$rc" "$why" >>"$results"
    fi
    grep '^result' "$log" | tr '\t' ' ' | cut -c1-160 | sed 's/^/   /'
    grep -q '^result' "$log" || echo "   failed (exit $rc): see $log"
}
for model in $(echo "$models" | tr ',' ' '); do
    for dtype in $(echo "$dtypes" | tr ',' ' '); do
        say "$model $dtype: alloy"
        TAGS=$(printf "impl=alloy\tmodel=%s\tdtype=%s\tmode=-" "$model" "$dtype")
        run "$out/logs/alloy-$model-$dtype.log" "$build/bench/gpu_step" --model "$model" --dtype "$dtype" \
            --device $device --steps "$steps" --warmup "$warmup" $quickflag
        say "$model $dtype: PyTorch $modes"
        TAGS=$(printf "impl=torch\tmodel=%s\tdtype=%s\tmode=%s" "$model" "$dtype" "$modes")
        run "$out/logs/torch-$model-$dtype.log" "$python" "$root/bench/gpu_torch.py" --model "$model" --dtype "$dtype" \
            --device $device --modes "$modes" --steps "$steps" --warmup "$warmup" $quickflag
    done
done

# ---- the table ----
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
title="alloy against PyTorch, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit, $gpu"
python3 "$root/bench/gpu_report.py" "$results" --title "$title" >"$out/gpu-bench.txt" || status=1
cat "$out/gpu-bench.txt"
[ $status -eq 0 ] && echo "gpu.sh: done ($out/gpu-bench.txt)" || echo "gpu.sh: some runs failed (logs in $out/logs)"
exit $status
