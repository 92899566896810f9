#!/bin/sh
# run_alloyc_examples.sh ALLOYC DIR: alloyc prints every examples/ir/*.ir coloured by AMP and as a
# whole AMP training step, and what it prints parses back to the same text.
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
    echo "$ir: ok ($(grep -c '!amp=allow' "$tmp.amp.ir") f16 nodes, $(wc -l <"$tmp.train.ir") lines as a training step)"
done
