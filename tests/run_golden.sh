#!/bin/sh
# run_golden.sh ALLOYC DIR: golden IR tests. Each DIR/NAME.ir starts with a line "# args: ..." (alloyc
# print's options: the passes to run and to print); alloyc print ARGS NAME.ir must write exactly
# DIR/NAME.expected (pass times in the "# after PASS (N ms)" lines are left out). With
# ALLOY_GOLDEN_UPDATE=1 it writes the .expected files instead (review the diff before committing).
set -u
alloyc=$1 dir=$2 tmp=${TMPDIR:-/tmp}/golden.$$
trap 'rm -f "$tmp"' EXIT
pass=0 fail=0
for ir in "$dir"/*.ir; do
    name=${ir%.ir}
    args=$(sed -n '1s/^# args: *//p' "$ir")
    # shellcheck disable=SC2086 # the args line is a list of options
    if ! "$alloyc" print $args "$ir" 2>&1 | sed -E 's/^(# (after|before) [a-z_]+) \([0-9.]+ ms\)$/\1/' >"$tmp"; then
        echo "$ir: alloyc print $args failed"
        fail=$((fail + 1))
        continue
    fi
    if [ "${ALLOY_GOLDEN_UPDATE:-0}" = 1 ]; then
        cp "$tmp" "$name.expected"
        echo "$ir: wrote $(basename "$name.expected")"
    elif [ ! -f "$name.expected" ]; then
        echo "$ir: no $(basename "$name.expected") (ALLOY_GOLDEN_UPDATE=1 writes it)"
        fail=$((fail + 1))
    elif ! diff -u "$name.expected" "$tmp"; then
        echo "$ir: output differs from $(basename "$name.expected") (above: - expected, + got)"
        fail=$((fail + 1))
    else
        pass=$((pass + 1))
    fi
done
echo "golden: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
