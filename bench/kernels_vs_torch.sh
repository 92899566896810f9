#!/bin/sh
# kernels_vs_torch.sh - alloy's elementwise and row kernels beside PyTorch's at the same instruction-set
# level: alloy's AVX-512 and AVX2 clones (bench/ew_isa, bench/row_isa: every level in one process,
# the same bits) against PyTorch at its AVX-512 capability and again with ATEN_CPU_CAPABILITY=avx2 and
# ONEDNN_MAX_CPU_ISA=AVX2 (bench/ew_torch.py), processes interleaved round by round, one thread each.
# Prints per round each side's ns per element, then a table of the medians and the ratios
# alloy / PyTorch per level (< 1: alloy is faster), headed by the CPU's model, family, model, ISA
# flags, the commit and the load average. A level the CPU lacks shows "-" on both sides.
#
# usage: bench/kernels_vs_torch.sh [--build DIR] [--python EXE] [--rounds N] [--widths "64 128 256"]
#                                  [--ew-ops "gelu gelu_grad"] [--row-ops "softmax ..."]
#   --build    a build with the benchmarks (default build): meson setup build -Dbench=true
#   --python   the interpreter with torch (default python3); without torch the script says why and stops
#   --rounds   interleaved rounds (default 3)
#   --widths   row lengths of the row kernels, 4096 rows each (default "64 128 256")
#   --ew-ops   elementwise ops over 1,000,003 elements (default "gelu gelu_grad")
#   --row-ops  row ops (default "softmax softmax_grad layer_norm layer_norm_grad cross_entropy cross_entropy_grad")
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=build python=python3 rounds=3 widths="64 128 256" ew_ops="gelu gelu_grad"
row_ops="softmax softmax_grad layer_norm layer_norm_grad cross_entropy cross_entropy_grad"
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "kernels_vs_torch.sh: $1 wants a value (see the comment at the top)" >&2; exit 2; }
    case $1 in
    --build) build=$2 ;; --python) python=$2 ;; --rounds) rounds=$2 ;; --widths) widths=$2 ;;
    --ew-ops) ew_ops=$2 ;; --row-ops) row_ops=$2 ;;
    *) echo "kernels_vs_torch.sh: unknown option $1 (see the comment at the top)" >&2; exit 2 ;;
    esac
    shift 2
done
for b in ew_isa row_isa; do
    [ -x "$build/bench/$b" ] || { echo "kernels_vs_torch.sh: no $build/bench/$b; build it: meson setup $build -Dbench=true && ninja -C $build" >&2; exit 2; }
done
if ! "$python" -c 'import torch' 2>/dev/null; then
    echo "kernels_vs_torch.sh: \`$python -c 'import torch'\` failed; PyTorch is needed for the other side" >&2
    exit 2
fi
tmp=${TMPDIR:-/tmp}/kernels_vs_torch.$$
trap 'rm -f "$tmp".*' EXIT
: >"$tmp.res"
export OMP_NUM_THREADS=1 ALLOY_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
avx2_env="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"
# PyTorch's own level: its AVX-512 column only where it runs AVX-512 kernels
torch_level=$("$python" -c 'import torch; print(torch.backends.cpu.get_cpu_capability())' 2>/dev/null || echo unknown)
torch512() { [ "$torch_level" = AVX512 ] && "$python" "$@" 2>/dev/null || true; }
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512bw|avx512_bf16|avx512_fp16|amx_bf16)$' | tr '\n' ' ')
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ') model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | cut -d: -f2 | tr -d ' '); $flags)"
echo "commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown), PyTorch $("$python" -c 'import torch; print(torch.__version__)') (its level here: $torch_level), load $(cut -d' ' -f1-3 /proc/loadavg)"

# alloy's rows: "op <v4> <v3> <baseline> same-bits"; torch's: "op<TAB>ns". Results go to $tmp.res as
# "shape op side value".
alloy_rows() { # shape, then the benchmark's output on stdin
    # a level this CPU lacks prints "-" (no AVX-512: only the AVX2 column)
    awk -v shape="$1" -v ops=" $2 " '$1 != "op" && index(ops, " " $1 " ") {
        if ($2 ~ /^[0-9.]+$/) print shape, $1, "alloy_avx512", $2
        if ($3 ~ /^[0-9.]+$/) print shape, $1, "alloy_avx2", $3 }' >>"$tmp.res"
}
torch_rows() { # shape, side, ops, then the script's output on stdin
    awk -v shape="$1" -v side="$2" -v ops=" $3 " 'NF == 2 && index(ops, " " $1 " ") && $2 ~ /^[0-9.]+$/ {
        print shape, $1, side, $2 }' >>"$tmp.res"
}
r=1
while [ "$r" -le "$rounds" ]; do
    echo "round $r: $(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1 /proc/loadavg)"
    # shellcheck disable=SC2086
    "$build/bench/ew_isa" 1000003 $ew_ops | alloy_rows ew "$ew_ops"
    torch512 "$here/ew_torch.py" 1000003 | torch_rows ew torch_avx512 "$ew_ops"
    env $avx2_env "$python" "$here/ew_torch.py" 1000003 2>/dev/null | torch_rows ew torch_avx2 "$ew_ops"
    for w in $widths; do
        "$build/bench/row_isa" 4096 "$w" | alloy_rows "rows$w" "$row_ops"
        torch512 "$here/ew_torch.py" --rows 4096 "$w" | torch_rows "rows$w" torch_avx512 "$row_ops"
        env $avx2_env "$python" "$here/ew_torch.py" --rows 4096 "$w" 2>/dev/null | torch_rows "rows$w" torch_avx2 "$row_ops"
    done
    r=$((r + 1))
done
"$python" - "$tmp.res" <<'EOF'
import collections, statistics, sys
v = collections.defaultdict(list)
order = []
for line in open(sys.argv[1]):
    shape, op, side, x = line.split()
    if (shape, op) not in order:
        order.append((shape, op))
    v[(shape, op, side)].append(float(x))
def med(k):
    return statistics.median(v[k]) if v[k] else None
def cell(x):
    return "-" if x is None else "%.3f" % x
def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else "%.2f" % (a / b)
print()
print("ns per element, medians of the rounds; ratio = alloy / PyTorch at the same level")
print("| op | shape | alloy AVX-512 | PyTorch AVX-512 | ratio | alloy AVX2 | PyTorch AVX2 | ratio |")
print("|---|---|---|---|---|---|---|---|")
for shape, op in order:
    a5, t5 = med((shape, op, "alloy_avx512")), med((shape, op, "torch_avx512"))
    a2, t2 = med((shape, op, "alloy_avx2")), med((shape, op, "torch_avx2"))
    where = "1,000,003 elements" if shape == "ew" else "4096 rows of " + shape[4:]
    print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (op, where, cell(a5), cell(t5), ratio(a5, t5),
                                                         cell(a2), cell(t2), ratio(a2, t2)))
EOF
