#!/bin/sh
# run_alloyc_examples.sh ALLOYC DIR: alloyc prints every examples/ir/*.ir coloured by AMP and as a
# whole AMP training step, and what it prints parses back to the same text; --print-after=fuse,schedule,plan
# shows the fusion groups, the steps and the memory plan.
set -eu
alloyc=$1 dir=$2 tmp=${TMPDIR:-/tmp}/alloyc_examples.$$
trap 'rm -f "$tmp".*' EXIT
for ir in "$dir"/*.ir; do
    "$alloyc" print --amp=f16 "$ir" >"$tmp.amp.ir"
    grep -q '!amp=allow' "$tmp.amp.ir" || { echo "$ir: no node runs in f16"; exit 1; }
    grep -q 'cross_entropy(.*!amp=deny' "$tmp.amp.ir" || { echo "$ir: the loss is not f32"; exit 1; }
    "$alloyc" print "$tmp.amp.ir" >"$tmp.again.ir"
    cmp -s "$tmp.amp.ir" "$tmp.again.ir" || { echo "$ir: printed AMP IR does not round-trip"; exit 1; }
    "$alloyc" print --train --amp=f16 --scaler=dynamic --optimizer=adamw "$ir" >"$tmp.train.ir"
    for want in 'output "grad:' 'update "scaler.scale"' 'update "optim.step"' 'found_inf('; do
        grep -q "$want" "$tmp.train.ir" || { echo "$ir: training step lacks $want"; exit 1; }
    done
    # after fuse: the group table (a row group with the softmax or the
    # cross_entropy_grad, a gemm group, the multi group ending in found_inf);
    # after schedule the steps, after plan the arena: comments, so the printed IR still parses
    "$alloyc" print --train --amp=f16 --scaler=dynamic --optimizer=adamw --print-after=fuse,schedule,plan "$ir" \
        >"$tmp.groups"
    for want in '^# group [0-9]* row ' '^# group [0-9]* gemm ' '^#   %[0-9]* = found_inf(' \
                '^# schedule: [0-9]* steps' '^# step [0-9]* row @%[0-9]* ' '^# step [0-9]* multi .*| found_inf %' \
                '^# plan: arena [0-9]* bytes, peak live [0-9]* bytes' '^# slot %[0-9]* @[0-9]* +[0-9]*$'; do
        grep -q "$want" "$tmp.groups" || { echo "$ir: --print-after=fuse,schedule,plan lacks $want"; exit 1; }
    done
    sed -n '1,/^}/p' "$tmp.groups" >"$tmp.fused_only.ir"
    "$alloyc" print "$tmp.fused_only.ir" >/dev/null || { echo "$ir: the IR printed after fuse does not parse"; exit 1; }
    echo "$ir: ok ($(grep -c '!amp=allow' "$tmp.amp.ir") f16 nodes, $(wc -l <"$tmp.train.ir") lines as a training step)"
done
