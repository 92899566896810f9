#!/bin/sh
# cpu_vs_torch.sh - alloy against PyTorch on the CPU: the char_gpt and MLP training steps (forward,
# backward, AdamW; same model op for op, same batch) in fp32, bf16 AMP and f16 AMP, at each thread
# count with the same count on both sides, processes interleaved (alloy, torch, alloy, torch ...).
# Prints per-step CPU time (user + system, all threads) and wall time, the medians of the timed
# steps, for each side, and the ratio alloy / PyTorch per row (< 1: alloy is faster).
#
# usage: bench/cpu_vs_torch.sh [--build DIR] [--python EXE] [--rounds N] [--steps N] [--warmup N]
#                              [--threads "1 2"] [--models "char_gpt mlp"] [--dtypes "f32 bf16 f16"]
#                              [--torch-f16 auto|yes|no]
#   --build    a build with the benchmarks (default build):
#                meson setup build -Dbench=true && ninja -C build bench/step_bench
#   --python   the interpreter with torch (default python3). PyTorch is for the benchmark only,
#              e.g. in its own virtual environment:
#                python3 -m venv /tmp/torch-venv
#                /tmp/torch-venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu
#                bench/cpu_vs_torch.sh --python /tmp/torch-venv/bin/python
#              Without torch the PyTorch columns say "skipped" and the reason is printed.
#   --rounds   times each process runs (default 2); the table shows each side's best round
#   --steps, --warmup   timed and untimed steps per process (defaults 20 and 5)
#   --torch-f16  PyTorch's f16 rows; auto (the default) runs them only on a CPU with AVX512_FP16 or
#              AMX_FP16: elsewhere torch's f16 autocast on the CPU has no fast kernels (on an AMD
#              EPYC Zen 5 with AVX512_BF16 it took 900 ms/step on char_gpt, 10x its fp32)
# Threads: alloy gets ALLOY_NUM_THREADS, PyTorch torch.set_num_threads, both OMP_NUM_THREADS,
# OPENBLAS_NUM_THREADS and MKL_NUM_THREADS, all the same count. Other variables pass through to
# both sides: on a loaded machine PyTorch's OpenMP threads spin while their partner is descheduled
# (3-8x its quiet CPU time at 2 threads, load 8-13); OMP_WAIT_POLICY=PASSIVE bench/cpu_vs_torch.sh
# measures it without that (alloy uses no OpenMP).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=build python=python3 rounds=2 steps=20 warmup=5 threads="1 2" models="char_gpt mlp" dtypes="f32 bf16 f16"
torch_f16=auto
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "cpu_vs_torch.sh: $1 wants a value (see the comment at the top)" >&2; exit 2; }
    case $1 in
    --build) build=$2 ;; --python) python=$2 ;; --rounds) rounds=$2 ;; --steps) steps=$2 ;;
    --warmup) warmup=$2 ;; --threads) threads=$2 ;; --models) models=$2 ;; --dtypes) dtypes=$2 ;;
    --torch-f16) torch_f16=$2 ;;
    *) echo "cpu_vs_torch.sh: unknown option $1 (see the comment at the top)" >&2; exit 2 ;;
    esac
    shift 2
done
alloy=$build/bench/step_bench
[ -x "$alloy" ] || { echo "cpu_vs_torch.sh: no $alloy; build it: meson setup $build -Dbench=true && ninja -C $build bench/step_bench" >&2; exit 2; }
tmp=${TMPDIR:-/tmp}/cpu_vs_torch.$$
trap 'rm -f "$tmp".*' EXIT
: >"$tmp.res"

torch_ok=1
if ! torch_version=$("$python" -c 'import torch; print(torch.__version__)' 2>"$tmp.err"); then
    torch_ok=0
    echo "PyTorch rows skipped: \`$python -c 'import torch'\` failed: $(tail -n 1 "$tmp.err")"
    echo "  install it for the benchmark only: python3 -m venv /tmp/torch-venv &&"
    echo "  /tmp/torch-venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu,"
    echo "  then rerun with --python /tmp/torch-venv/bin/python"
fi
case $torch_f16 in
auto) if grep -qwE 'avx512_fp16|amx_fp16' /proc/cpuinfo; then torch_f16=yes; else torch_f16=no
      echo "PyTorch f16 rows not run: this CPU has no AVX512_FP16 or AMX_FP16, so torch's f16 autocast has no fast kernels (--torch-f16 yes runs them)"; fi ;;
yes | no) ;;
*) echo "cpu_vs_torch.sh: --torch-f16 wants auto, yes or no, got $torch_f16" >&2; exit 2 ;;
esac
echo "date $(date -u '+%Y-%m-%d %H:%M UTC'); $(lscpu | sed -n 's/^Model name: *//p'), family $(lscpu | sed -n 's/^CPU family: *//p'), $(nproc) CPUs;" \
    "alloy $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?'); torch ${torch_version:-none}; load $(cut -d' ' -f1-3 /proc/loadavg)"

# run SIDE MODEL DTYPE THREADS ROUND: one process; appends "MODEL DTYPE THREADS SIDE WALL CPU" to the results.
run() {
    side=$1 model=$2 dtype=$3 n=$4 round=$5
    if [ "$side" = alloy ]; then
        set -- env ALLOY_NUM_THREADS="$n" "$alloy"
    else
        set -- "$python" "$here/step_torch.py" --threads "$n"
    fi
    if OMP_NUM_THREADS=$n OPENBLAS_NUM_THREADS=$n MKL_NUM_THREADS=$n \
        "$@" --model "$model" --dtype "$dtype" --steps "$steps" --warmup "$warmup" >"$tmp.out" 2>&1 &&
        line=$(grep '^step_ms' "$tmp.out"); then
        echo "$line" | awk -v k="$model $dtype $n $side" '{ print k, $2, $3 }' >>"$tmp.res"
        echo "$line" | awk -v k="round $round: $side $model $dtype, $n thread(s)" '{ printf "%-48s wall %8.2f ms  cpu %8.2f ms\n", k, $2, $3 }'
    else
        echo "round $round: $side $model $dtype, $n thread(s) failed:"
        sed 's/^/  /' "$tmp.out" | tail -n 5
    fi
}

r=1
while [ "$r" -le "$rounds" ]; do
    for n in $threads; do
        for model in $models; do
            for dtype in $dtypes; do
                run alloy "$model" "$dtype" "$n" "$r"
                [ "$torch_ok" = 0 ] || [ "$dtype:$torch_f16" = f16:no ] || run torch "$model" "$dtype" "$n" "$r"
            done
        done
    done
    r=$((r + 1))
done

echo
echo "ms/step, the best of $rounds round(s) of each side's median over $steps timed steps ($warmup warm-up steps first)."
echo "CPU = process user + system time of all threads: the robust number on this shared machine"
echo "(other processes' load moves wall time, much less CPU time). ratio = alloy / PyTorch (< 1: alloy faster);"
echo "AMP/fp32 = alloy's AMP CPU time over its own fp32's."
echo "At 2 or more threads CPU time also counts each side's threads spinning while they wait for a"
echo "descheduled partner thread: on a loaded machine it grows with the load for both sides."
awk -v threads="$threads" -v models="$models" -v dtypes="$dtypes" -v torch_ok="$torch_ok" -v torch_f16="$torch_f16" '
function best(a, k) { return (k in a) ? a[k] : -1 }
function ms(v, torch, dtype) {
    if (v >= 0) return sprintf("%.1f", v)
    if (torch && !torch_ok) return "skipped"
    return torch && dtype == "f16" && torch_f16 == "no" ? "not run" : "failed"
}
function ratio(a, b) { return (a < 0 || b < 0) ? "-" : sprintf("%.2f", a / b) }
{
    k = $1 " " $2 " " $3 " " $4
    if (!(k in wall) || $5 < wall[k]) wall[k] = $5
    if (!(k in cpu) || $6 < cpu[k]) cpu[k] = $6
}
END {
    printf "| threads | model | dtype | alloy CPU | torch CPU | CPU ratio | alloy wall | torch wall | wall ratio | alloy AMP/fp32 |\n"
    printf "|---|---|---|---|---|---|---|---|---|---|\n"
    nt = split(threads, T, " "); nm = split(models, M, " "); nd = split(dtypes, D, " ")
    for (i = 1; i <= nt; i++) for (j = 1; j <= nm; j++) for (l = 1; l <= nd; l++) {
        a = M[j] " " D[l] " " T[i] " alloy"; t = M[j] " " D[l] " " T[i] " torch"; f = M[j] " f32 " T[i] " alloy"
        printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", T[i], M[j], D[l],
            ms(best(cpu, a), 0, D[l]), ms(best(cpu, t), 1, D[l]), ratio(best(cpu, a), best(cpu, t)),
            ms(best(wall, a), 0, D[l]), ms(best(wall, t), 1, D[l]), ratio(best(wall, a), best(wall, t)),
            D[l] == "f32" ? "" : ratio(best(cpu, a), best(cpu, f))
    }
}' "$tmp.res"
echo "load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
