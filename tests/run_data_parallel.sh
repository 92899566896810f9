#!/bin/sh
# run_data_parallel.sh - meson test of data-parallel training: test_data_parallel under mpirun -np 2 on one machine
# (tests/test_data_parallel.c says what it checks), then its dead-peer case (rank 1 never runs the step: rank 0's
# run must fail within its 1 s timeout, not hang; the outer `timeout` catches a hang). Exit 77 (skipped) with the reason when the build has no MPI or
# no mpirun.
#
# With ALLOYC and the tests' data directory, also alloyc train --data-parallel on train_mlp.ir: one rank writes the
# checkpoint a plain alloyc train writes, byte for byte; two ranks train and their checkpoint resumes in one process;
# two ZeRO-1 ranks (--zero) write the plain two ranks' checkpoint, byte for byte.
#
# usage: run_data_parallel.sh MPIRUN TEST_DATA_PARALLEL [RANKS [ALLOYC DATA_DIR OUT_DIR]]
#   (RANKS 2, the default, also runs the dead-peer case)
set -u
mpirun=$1 prog=$2 ranks=${3:-2} alloyc=${4:-} data=${5:-} out=${6:-}
if [ -z "$prog" ]; then
    echo "skipped: alloy was built without MPI (install libopenmpi-dev openmpi-bin; -Dmpi=enabled)"
    exit 77
fi
if [ -z "$mpirun" ]; then
    echo "skipped: no mpirun or mpiexec on PATH (install openmpi-bin)"
    exit 77
fi
# Open MPI refuses root (CI runs as root) without these; more ranks than cores need --oversubscribe; the
# device is the CPU (collectives run on the CPU backend)
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ALLOY_DEVICE=cpu ALLOY_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM ALLOY_DEVICE ALLOY_NUM_THREADS
# the sanitizer build: Open MPI keeps about 3,300 allocations (116 kB) until the process exits, in plugins it has
# unloaded by then, which LeakSanitizer reports without a name to suppress them by; leaks stay the other suites' to
# catch, address and undefined-behaviour errors stay on here
ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
export ASAN_OPTIONS
opts=""
if "$mpirun" --version 2>/dev/null | grep -q "Open MPI"; then opts="--oversubscribe"; fi
"$mpirun" -np "$ranks" $opts "$prog" || exit 1
if [ "$ranks" = 2 ]; then
    timeout 60 "$mpirun" -np 2 $opts "$prog" dead-peer || { echo "FAIL: the dead-peer case failed or hung"; exit 1; }
    # rank 1 killed (SIGKILL) after the compile: the job ends, no hang (mpirun ends it, non-zero, when it sees the
    # dead rank; rank 0 may have returned its timeout's error first)
    killed=$(timeout 60 "$mpirun" -np 2 $opts "$prog" killed-peer 2>&1)
    rc=$?
    if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
        echo "$killed"
        echo "FAIL: a killed peer: exit status $rc (0: nothing noticed it; 124: hung)"
        exit 1
    fi
    echo "ok:   a killed peer ends the job (mpirun's status $rc)"
    echo "$killed" | grep -o "dead peer:.*" || true
fi
[ -n "$alloyc" ] || exit 0
tmp=$out/data_parallel_alloyc
rm -rf "$tmp" && mkdir -p "$tmp" || exit 1
set -- "$data/train_mlp.ir" --feed "$data/train_mlp_feeds.safetensors" --params "$data/train_mlp_params.safetensors" \
    --steps 6 --log-every 3
"$alloyc" train "$@" --checkpoint "$tmp/one.st" >"$tmp/one.out" 2>&1 || { cat "$tmp/one.out"; exit 1; }
"$mpirun" -np 1 "$alloyc" train "$@" --checkpoint "$tmp/dp1.st" --data-parallel >"$tmp/dp1.out" 2>&1 ||
    { cat "$tmp/dp1.out"; exit 1; }
cmp "$tmp/one.st" "$tmp/dp1.st" || { echo "FAIL: alloyc train --data-parallel on one rank wrote another checkpoint"; exit 1; }
echo "ok:   alloyc train --data-parallel on one rank: the plain run's checkpoint, byte for byte"
"$mpirun" -np 1 "$alloyc" train "$@" --checkpoint "$tmp/z1.st" --data-parallel --zero >"$tmp/z1.out" 2>&1 ||
    { cat "$tmp/z1.out"; exit 1; }
cmp "$tmp/one.st" "$tmp/z1.st" || { echo "FAIL: alloyc train --data-parallel --zero on one rank wrote another checkpoint"; exit 1; }
echo "ok:   alloyc train --data-parallel --zero on one rank: the plain run's checkpoint, byte for byte"
"$mpirun" -np 2 $opts "$alloyc" train "$@" --checkpoint "$tmp/dp2.st" --data-parallel >"$tmp/dp2.out" 2>&1 ||
    { cat "$tmp/dp2.out"; exit 1; }
grep -q "^data-parallel over 2 ranks$" "$tmp/dp2.out" && grep -q "^saved $tmp/dp2.st at step 6$" "$tmp/dp2.out" ||
    { cat "$tmp/dp2.out"; echo "FAIL: alloyc train --data-parallel on two ranks"; exit 1; }
cp "$tmp/dp2.st" "$tmp/dp2_step6.st" || exit 1 # the resume below writes step 7 over dp2.st
"$alloyc" train "$data/train_mlp.ir" --feed "$data/train_mlp_feeds.safetensors" --steps 1 --checkpoint "$tmp/dp2.st" \
    >"$tmp/resume.out" 2>&1 && grep -q "^resumed from $tmp/dp2.st at step 6$" "$tmp/resume.out" ||
    { cat "$tmp/resume.out"; echo "FAIL: one process does not resume from the two ranks' checkpoint"; exit 1; }
echo "ok:   alloyc train --data-parallel on two ranks; one process resumes from their checkpoint"
# ZeRO-1 (no clipping: the same bits): two ranks write the plain two ranks' checkpoint, byte for byte
"$mpirun" -np 2 $opts "$alloyc" train "$@" --checkpoint "$tmp/z2.st" --data-parallel --zero >"$tmp/z2.out" 2>&1 ||
    { cat "$tmp/z2.out"; exit 1; }
cmp "$tmp/dp2_step6.st" "$tmp/z2.st" || { echo "FAIL: alloyc train --data-parallel --zero wrote another checkpoint"; exit 1; }
echo "ok:   alloyc train --data-parallel --zero on two ranks: the plain two ranks' checkpoint, byte for byte"
cat "$tmp/dp2.out"
