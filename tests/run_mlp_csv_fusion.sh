#!/bin/sh
# run_mlp_csv_fusion.sh MLP_CSV: the mlp_csv example trains to the same result with and without
# fusion groups: fp32 prints the same lines (fused f32 groups give the unfused bits), f16 AMP skips
# the same steps and ends within rounding (final loss within 2%, test accuracy within 1.5 points).
set -eu
mlp=$1 tmp=${TMPDIR:-/tmp}/mlp_csv_fusion.$$
trap 'rm -f "$tmp".*' EXIT
"$mlp" --amp off --epochs 8 >"$tmp.f32.fused"
ALLOY_NO_FUSE=1 "$mlp" --amp off --epochs 8 >"$tmp.f32.unfused"
cmp -s "$tmp.f32.fused" "$tmp.f32.unfused" || { echo "fp32: fused and unfused runs differ"; diff "$tmp.f32.fused" "$tmp.f32.unfused"; exit 1; }
"$mlp" >"$tmp.f16.fused"
ALLOY_NO_FUSE=1 "$mlp" >"$tmp.f16.unfused"
last() { grep '^epoch' "$1" | tail -1; }
f=$(last "$tmp.f16.fused") u=$(last "$tmp.f16.unfused")
echo "f16 AMP fused:   $f"
echo "f16 AMP unfused: $u"
echo "$f $u" | awk '{
    # epoch N loss L test_accuracy A scale S skipped K, twice
    lf = $4; af = $6; kf = $10; lu = $14; au = $16; ku = $20
    if (kf != ku) { print "skipped steps differ: " kf " fused, " ku " unfused"; exit 1 }
    d = lf - lu; if (d < 0) d = -d
    if (d > 0.02 * lu) { print "final loss differs by more than 2%"; exit 1 }
    d = af - au; if (d < 0) d = -d
    if (d > 0.015) { print "test accuracy differs by more than 1.5 points"; exit 1 }
}'
echo "fp32: identical output; f16 AMP: same skipped steps, loss and accuracy within rounding"
