#!/bin/sh
# data_parallel.sh - char_gpt's training throughput on the CPU with 1 process and with 2 data-parallel ranks
# (mpirun -np 2 --data-parallel), and with 2 ranks under ZeRO-1 (--zero), one thread each, the same global batch;
# then the collective steps' share of a rank's step from the profile option, without and with ZeRO-1. Prints the
# tok/s of each run's last line and the profile's collective rows.
#
# usage: bench/data_parallel.sh [BUILD_DIR] [STEPS]   (default build, 60 steps; char_gpt's default model, batch 32)
set -eu
build=${1:-build} steps=${2:-60}
prog=$build/examples/char_gpt
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ALLOY_DEVICE=cpu ALLOY_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM ALLOY_DEVICE ALLOY_NUM_THREADS
args="--steps $steps --log-every $steps --eval-every 0"
one=$("$prog" $args | sed -n 's/^step .* tok\/s \([0-9]*\) .*/\1/p')
two=$(mpirun -np 2 --oversubscribe "$prog" $args --data-parallel | sed -n 's/^step .* tok\/s \([0-9]*\) .*/\1/p')
zero=$(mpirun -np 2 --oversubscribe "$prog" $args --data-parallel --zero | sed -n 's/^step .* tok\/s \([0-9]*\) .*/\1/p')
echo "1 process:             $one tok/s"
echo "2 ranks (--data-parallel): $two tok/s"
echo "2 ranks (--data-parallel --zero): $zero tok/s"
# the profile of rank 0's last step: its total and its collective steps' rows
ALLOY_PROFILE=$steps mpirun -np 2 --oversubscribe --tag-output "$prog" $args --data-parallel 2>&1 >/dev/null |
    sed -n 's/^\[1,0\]<stderr>://p' | grep -E "graph 'char_gpt',|collective" 
echo "ZeRO-1:"
ALLOY_PROFILE=$steps mpirun -np 2 --oversubscribe --tag-output "$prog" $args --data-parallel --zero 2>&1 >/dev/null |
    sed -n 's/^\[1,0\]<stderr>://p' | grep -E "graph 'char_gpt',|collective"
