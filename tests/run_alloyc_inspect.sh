#!/bin/sh
# run_alloyc_inspect.sh ALLOYC IR_DIR DATA_DIR - alloyc's inspection flags on char_gpt.ir's f16 training step:
# --dump-dir (a file per stage, also next to compile's kernel sources when NVRTC is there), --time-passes
# (stdout with --print-after, else stderr), --emit=dot, --emit=memory-svg, --emit=svg (with Graphviz's dot
# when it is on the PATH, and the error naming it when it is not), and the usage errors of --emit.
set -u
alloyc=$1 dir=$2 data=$3
ir=$dir/char_gpt.ir
tmp=$(mktemp -d "${TMPDIR:-/tmp}/alloyc_inspect.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
unset ALLOY_DUMP_DIR ALLOY_TIME_PASSES ALLOY_PRINT_AFTER ALLOY_PRINT_BEFORE
export ALLOY_CACHE_DIR="$tmp/cache"
step="--train --amp=f16 --scaler=dynamic --optimizer=adamw"
stages="input verify random lower_norm attention amp autodiff data_parallel grad_scaler optimizer simplify dce remat fuse schedule plan"

fail() {
    echo "FAIL: $*"
    exit 1
}

# --dump-dir: GRAPH.NN-STAGE.ir for every stage, nothing else
# shellcheck disable=SC2086 # $step is a list of options
"$alloyc" print "$ir" $step --dump-dir "$tmp/dump" >"$tmp/ir.txt" 2>"$tmp/err" || fail "print --dump-dir: $(cat "$tmp/err")"
n=0
for s in $stages; do
    f=$tmp/dump/char_gpt.$(printf %02d $n)-$s.ir
    [ -s "$f" ] || fail "--dump-dir wrote no $f"
    n=$((n + 1))
done
[ "$(ls "$tmp/dump" | wc -l)" -eq 16 ] || fail "--dump-dir holds $(ls "$tmp/dump" | wc -l) files, want 16"
# the last stage's IR is what print prints (after its header and options lines)
sed -n '/^graph /,/^}$/p' "$tmp/dump/char_gpt.15-plan.ir" | cmp -s - "$tmp/ir.txt" || fail "15-plan.ir's IR is not print's"
# a dump is an IR file alloyc reads
"$alloyc" print "$tmp/dump/char_gpt.06-autodiff.ir" >/dev/null 2>"$tmp/err" || fail "06-autodiff.ir does not read back: $(cat "$tmp/err")"

# --time-passes: on stderr alone, on stdout with --print-after
"$alloyc" print "$ir" $step --time-passes >"$tmp/out" 2>"$tmp/err" || fail "print --time-passes: $(cat "$tmp/err")"
grep -q '^# pass times: graph char_gpt, ' "$tmp/err" || fail "--time-passes wrote no table to stderr"
[ "$(grep -c '^#   ' "$tmp/err")" -eq 16 ] || fail "--time-passes: not a heading and 15 rows: $(cat "$tmp/err")"
cmp -s "$tmp/out" "$tmp/ir.txt" || fail "--time-passes changed stdout"
"$alloyc" print "$ir" $step --time-passes --print-after=plan >"$tmp/out" 2>"$tmp/err" || fail "print --time-passes --print-after"
[ -s "$tmp/err" ] && fail "--time-passes --print-after wrote to stderr: $(cat "$tmp/err")"
grep -q '^# pass times: graph char_gpt, ' "$tmp/out" || fail "--time-passes --print-after: no table on stdout"
ALLOY_TIME_PASSES=1 "$alloyc" print "$ir" >/dev/null 2>"$tmp/err" || fail "ALLOY_TIME_PASSES=1"
grep -q '^# pass times: ' "$tmp/err" || fail "ALLOY_TIME_PASSES=1 printed no table"

# --emit=dot: a digraph with a node statement per IR node; printed passes go to stderr, not into the DOT
"$alloyc" print "$ir" $step --emit=dot --print-after=amp >"$tmp/g.dot" 2>"$tmp/err" || fail "--emit=dot: $(cat "$tmp/err")"
[ "$(head -n 1 "$tmp/g.dot")" = 'digraph "char_gpt" {' ] || fail "--emit=dot does not start with the digraph"
grep -q '^# after amp' "$tmp/err" || fail "--emit=dot --print-after=amp: the IR after amp is not on stderr"
nodes=$(grep -c '^  %' "$tmp/ir.txt")
[ "$(grep -cE '^ +n[0-9]+ \[label=' "$tmp/g.dot")" -eq "$nodes" ] || fail "--emit=dot: not $nodes node statements"

# --emit=memory-svg: an SVG alloy draws, a slot rectangle per "# slot" line of a value with bytes
"$alloyc" print "$ir" $step --emit=memory-svg >"$tmp/m.svg" 2>"$tmp/err" || fail "--emit=memory-svg: $(cat "$tmp/err")"
head -n 2 "$tmp/m.svg" | grep -q '^<svg ' || fail "--emit=memory-svg is not an SVG"
slots=$(grep -c '^# slot .* +[1-9]' "$tmp/dump/char_gpt.15-plan.ir")
[ "$(grep -c '<rect class="slot"' "$tmp/m.svg")" -eq "$slots" ] || fail "--emit=memory-svg: not $slots slot rectangles"

# --emit=svg: the error naming dot without it on the PATH; Graphviz's drawing with it
PATH=/nonexistent "$alloyc" print "$ir" --emit=svg >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "--emit=svg without dot: exit status is not 1"
grep -q "^alloyc: --emit=svg needs Graphviz's dot on the PATH" "$tmp/err" || fail "--emit=svg without dot: $(cat "$tmp/err")"
[ -s "$tmp/out" ] && fail "--emit=svg without dot wrote to stdout"
if command -v dot >/dev/null 2>&1; then
    "$alloyc" print "$ir" $step --emit=svg >"$tmp/g.svg" 2>"$tmp/err" || fail "--emit=svg: $(cat "$tmp/err")"
    [ -s "$tmp/err" ] && fail "--emit=svg wrote to stderr: $(cat "$tmp/err")"
    [ "$(grep -c 'class="node"' "$tmp/g.svg")" -eq "$nodes" ] || fail "--emit=svg: not $nodes drawn nodes"
    svg="drawn by $(command -v dot)"
else
    svg="not drawn (Graphviz's dot is not on the PATH)"
fi

# usage errors: exit status 2
expect_usage() {
    "$alloyc" "$@" >/dev/null 2>"$tmp/err"
    [ $? -eq 2 ] || fail "alloyc $*: exit status is not 2"
}
expect_usage print "$ir" --emit=png
grep -q "emit of print wants ir, dot, svg or memory-svg, got 'png'" "$tmp/err" || fail "--emit=png: $(cat "$tmp/err")"
expect_usage run "$ir" --emit=dot --out "$tmp/y.safetensors"
grep -q "is an option of 'print' and 'compile', not 'run'" "$tmp/err" || fail "run --emit: $(cat "$tmp/err")"
expect_usage compile "$ir" --emit=dot --arch sm_80 -o "$tmp/k"
expect_usage print "$ir" --dump-dir a --dump-dir b

# compile: the stages land next to the kernel sources (when NVRTC is there)
if "$alloyc" compile "$data/mlp2.ir" --arch sm_80 -o "$tmp/k" --dump-dir "$tmp/kdump" >/dev/null 2>"$tmp/err"; then
    [ -s "$tmp/kdump/alloy_m0.cu" ] && [ -s "$tmp/kdump/mlp2.15-plan.ir" ] || fail "compile --dump-dir: $(ls "$tmp/kdump")"
    kernels="with kernel sources"
elif grep -q 'NVRTC is not available' "$tmp/err"; then
    kernels="no NVRTC: compile's dump not checked"
else
    fail "compile --dump-dir: $(cat "$tmp/err")"
fi
echo "alloyc inspect: 11 dumps, pass times, DOT ($nodes nodes), memory SVG ($slots slots), SVG $svg; $kernels"
