#!/bin/sh
# option_cost_cpu.sh CHAR_GPT OPTION [ROUNDS]: what a 0/1 option costs char_gpt's CPU step (f16 AMP, one thread),
# e.g. amp_check (the overflow locator) or amp_stats (range statistics): user CPU time per step with the option
# off and on (its ALLOY_* variable), run alternately ROUNDS times (default 5). Each figure is
# (t(45 steps) - t(5 steps)) / 40 from /usr/bin/time's user seconds, so the compile, the validation loss and
# the sampling at the end cancel; CPU time, not wall clock, because the machine is shared.
set -eu
bin=$1 option=$2 rounds=${3:-5} n1=5 n2=45
var=ALLOY_$(echo "$option" | tr '[:lower:]' '[:upper:]')
cpu() { # VALUE STEPS -> user seconds
    /usr/bin/time -f %U env ALLOY_NUM_THREADS=1 ALLOY_DEVICE=cpu "$var=$1" "$bin" --steps "$2" \
        --log-every 1000 --eval-every 0 2>&1 >/dev/null | tail -1
}
r=1
while [ "$r" -le "$rounds" ]; do
    for c in 0 1; do
        a=$(cpu "$c" "$n1") b=$(cpu "$c" "$n2")
        echo "round $r $option=$c ms/step $(echo "$a $b" | awk -v d=$((n2 - n1)) '{printf "%.1f", 1000 * ($2 - $1) / d}')"
    done
    r=$((r + 1))
done
