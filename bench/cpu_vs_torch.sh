#!/bin/sh
# cpu_vs_torch.sh - alloy against PyTorch on the CPU: the char_gpt and MLP training steps (forward,
# backward, AdamW; same model op for op, same batch) in fp32, bf16 AMP and f16 AMP, at each thread
# count with the same count on both sides, processes interleaved (alloy, torch, alloy, torch ...).
# Prints per-step CPU time (user + system, all threads) and wall time, the medians of the timed
# steps, for each side, and the ratio alloy / PyTorch per row (< 1: alloy is faster).
#
# usage: bench/cpu_vs_torch.sh [--build DIR] [--python EXE] [--rounds N] [--steps N] [--warmup N]
#                              [--threads "1 2"] [--models "char_gpt mlp"] [--dtypes "f32 bf16 f16"]
#                              [--torch-f16 auto|yes|no] [--batch N]
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
#   --batch    sequences (char_gpt) or rows (mlp) on both sides; 0 (the default) keeps each model's
#              own (32 sequences, 256 rows): the MLP's targets are at --batch 1024
#   --torch-f16  PyTorch's f16 rows; auto (the default) runs them only on a CPU with AVX512_FP16 or
#              AMX_FP16: elsewhere torch's f16 autocast on the CPU has no fast kernels (on an AMD
#              EPYC Zen 5 with AVX512_BF16 it took 900 ms/step on char_gpt, 10x its fp32)
#   --omp-wait   OMP_WAIT_POLICY values for PyTorch's rows at 2 or more threads, each its own row
#              (default "passive"; "passive active" reports both). With the default (active)
#              policy PyTorch's OpenMP threads spin while a partner is descheduled, which on a
#              loaded machine measures the load (3-8x its quiet CPU time at 2 threads, load 8-13).
#              1-thread rows run with the first value. alloy uses no OpenMP.
# Threads: alloy gets ALLOY_NUM_THREADS, PyTorch torch.set_num_threads, both OMP_NUM_THREADS,
# OPENBLAS_NUM_THREADS and MKL_NUM_THREADS, all the same count. Each process also reports how many
# of its threads ran during the timed steps (at least 1% of its CPU time there, from
# /proc/self/task); the table shows the most seen in any round, and a line warns where that is
# more than the row's thread count. Every table is printed with the CPU's model name, family,
# model and ISA flags, the commit and the load average.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=build python=python3 rounds=2 steps=20 warmup=5 threads="1 2" models="char_gpt mlp" dtypes="f32 bf16 f16"
torch_f16=auto omp_wait=passive batch=0
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "cpu_vs_torch.sh: $1 wants a value (see the comment at the top)" >&2; exit 2; }
    case $1 in
    --build) build=$2 ;; --python) python=$2 ;; --rounds) rounds=$2 ;; --steps) steps=$2 ;;
    --warmup) warmup=$2 ;; --threads) threads=$2 ;; --models) models=$2 ;; --dtypes) dtypes=$2 ;;
    --torch-f16) torch_f16=$2 ;; --omp-wait) omp_wait=$2 ;; --batch) batch=$2 ;;
    *) echo "cpu_vs_torch.sh: unknown option $1 (see the comment at the top)" >&2; exit 2 ;;
    esac
    shift 2
done
alloy=$build/bench/step_bench
batch_args=
[ "$batch" = 0 ] || batch_args="--batch $batch"
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
for w in $omp_wait; do
    case $w in passive | active) ;; *) echo "cpu_vs_torch.sh: --omp-wait wants passive and/or active, got $w" >&2; exit 2 ;; esac
done
first_wait=${omp_wait%% *}
# The CPU, named in every table: lscpu's model name, family and model, and the ISA flags that
# decide which kernels run (alloy's and PyTorch's).
isa=
for f in avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_fp16; do
    if grep -qw "$f" /proc/cpuinfo; then isa="$isa $f"; else isa="$isa no-$f"; fi
done
cpu="$(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p'), $(nproc) CPUs;$isa)"
commit="alloy $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$here" diff --quiet HEAD 2>/dev/null || echo ' with local changes')"
echo "date $(date -u '+%Y-%m-%d %H:%M UTC'); $cpu; $commit; torch ${torch_version:-none};" \
    "OPENBLAS_CORETYPE ${OPENBLAS_CORETYPE:-unset}; batch ${batch_args:-each model's default}; load $(cut -d' ' -f1-3 /proc/loadavg)"

# run SIDE MODEL DTYPE THREADS ROUND [WAIT]: one process (PyTorch's with OMP_WAIT_POLICY=WAIT);
# appends "MODEL DTYPE THREADS SIDE WALL CPU RAN" to the results, SIDE alloy or torch-WAIT.
run() {
    side=$1 model=$2 dtype=$3 n=$4 round=$5 wait=${6:-}
    if [ "$side" = alloy ]; then
        set -- env ALLOY_NUM_THREADS="$n" "$alloy"
    else
        side=torch-$wait
        set -- env OMP_WAIT_POLICY="$(echo "$wait" | tr a-z A-Z)" "$python" "$here/step_torch.py" --threads "$n"
    fi
    # shellcheck disable=SC2086 # batch_args: nothing, or --batch and its value
    if OMP_NUM_THREADS=$n OPENBLAS_NUM_THREADS=$n MKL_NUM_THREADS=$n \
        "$@" --model "$model" --dtype "$dtype" --steps "$steps" --warmup "$warmup" $batch_args >"$tmp.out" 2>&1 &&
        line=$(grep '^step_ms' "$tmp.out"); then
        ran=$(awk '$1 == "threads" { print $2 }' "$tmp.out")
        echo "$line" | awk -v k="$model $dtype $n $side" -v ran="${ran:--1}" '{ print k, $2, $3, ran }' >>"$tmp.res"
        echo "$line" | awk -v k="round $round: $side $model $dtype, $n thread(s)" -v t="$(awk '$1 == "threads" { print $2 " ran of " $3 }' "$tmp.out")" \
            '{ printf "%-56s wall %8.2f ms  cpu %8.2f ms  threads %s\n", k, $2, $3, t }'
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
                [ "$torch_ok" = 0 ] || [ "$dtype:$torch_f16" = f16:no ] && continue
                if [ "$n" = 1 ]; then
                    run torch "$model" "$dtype" "$n" "$r" "$first_wait"
                else
                    for w in $omp_wait; do run torch "$model" "$dtype" "$n" "$r" "$w"; done
                fi
            done
        done
    done
    r=$((r + 1))
done

echo
echo "$cpu; $commit; torch ${torch_version:-none}; OPENBLAS_CORETYPE ${OPENBLAS_CORETYPE:-unset}; load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
echo "ms/step, the best of $rounds round(s) of each side's median over $steps timed steps ($warmup warm-up steps first)."
echo "CPU = process user + system time of all threads: the robust number on this shared machine"
echo "(other processes' load moves wall time, much less CPU time). ratio = alloy / PyTorch (< 1: alloy faster);"
echo "AMP/fp32 = alloy's AMP CPU time over its own fp32's. OMP wait = PyTorch's OMP_WAIT_POLICY;"
echo "threads ran = the most threads of each process that had >= 1% of its CPU time in a round's timed steps."
awk -v threads="$threads" -v models="$models" -v dtypes="$dtypes" -v torch_ok="$torch_ok" -v torch_f16="$torch_f16" \
    -v waits="$omp_wait" -v first_wait="$first_wait" '
function best(a, k) { return (k in a) ? a[k] : -1 }
function ms(v, torch, dtype) {
    if (v >= 0) return sprintf("%.1f", v)
    if (torch && !torch_ok) return "skipped"
    return torch && dtype == "f16" && torch_f16 == "no" ? "not run" : "failed"
}
function ratio(a, b) { return (a < 0 || b < 0) ? "-" : sprintf("%.2f", a / b) }
function nran(k) { return (k in ran) ? ran[k] : "?" }
{
    k = $1 " " $2 " " $3 " " $4
    if (!(k in wall) || $5 < wall[k]) wall[k] = $5
    if (!(k in cpu) || $6 < cpu[k]) cpu[k] = $6
    if (!(k in ran) || $7 > ran[k]) ran[k] = $7
    if ($7 > $3) over[k] = $7
}
END {
    printf "| threads | model | dtype | OMP wait | alloy CPU | torch CPU | CPU ratio | alloy wall | torch wall | wall ratio | threads ran alloy / torch | alloy AMP/fp32 |\n"
    printf "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    nt = split(threads, T, " "); nm = split(models, M, " "); nd = split(dtypes, D, " "); nw = split(waits, W, " ")
    for (i = 1; i <= nt; i++) for (j = 1; j <= nm; j++) for (l = 1; l <= nd; l++) {
      no_torch = !torch_ok || (D[l] == "f16" && torch_f16 == "no")
      for (v = 1; v <= (T[i] == 1 || no_torch ? 1 : nw); v++) {
        w = T[i] == 1 || no_torch ? first_wait : W[v]
        a = M[j] " " D[l] " " T[i] " alloy"; t = M[j] " " D[l] " " T[i] " torch-" w; f = M[j] " f32 " T[i] " alloy"
        printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s / %s | %s |\n", T[i], M[j], D[l],
            T[i] == 1 || no_torch ? "-" : w,
            ms(best(cpu, a), 0, D[l]), ms(best(cpu, t), 1, D[l]), ratio(best(cpu, a), best(cpu, t)),
            ms(best(wall, a), 0, D[l]), ms(best(wall, t), 1, D[l]), ratio(best(wall, a), best(wall, t)),
            nran(a), no_torch ? "-" : nran(t), D[l] == "f32" ? "" : ratio(best(cpu, a), best(cpu, f))
      }
    }
    for (k in over) {
        split(k, K, " ")
        printf "warning: %s %s %s, %s thread(s) asked: %d threads ran\n", K[4], K[1], K[2], K[3], over[k]
    }
}' "$tmp.res"
