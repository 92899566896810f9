#!/bin/sh
# run_data_parallel_cuda.sh - meson test of data-parallel training on the CUDA backend over NCCL, with neither a GPU
# nor NCCL: test_data_parallel_cuda under mpirun -np 2 on the emulated device, ALLOY_NCCL naming the emulated NCCL
# (tests/cuda_emu/emu_nccl.c). tests/test_data_parallel_cuda.c says what it checks. Exit 77 (skipped) with the reason
# when the build has no MPI, no mpirun or no CUDA.
#
# usage: run_data_parallel_cuda.sh MPIRUN TEST_DATA_PARALLEL_CUDA EMU_NCCL
set -u
mpirun=$1 prog=$2 nccl=$3
if [ -z "$prog" ]; then
    echo "skipped: alloy was built without MPI or without CUDA (-Dmpi=enabled, the CUDA toolkit's headers)"
    exit 77
fi
if [ -z "$mpirun" ]; then
    echo "skipped: no mpirun or mpiexec on PATH (install openmpi-bin)"
    exit 77
fi
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ALLOY_NUM_THREADS=1 ALLOY_NCCL=$nccl
export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM ALLOY_NUM_THREADS ALLOY_NCCL
ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 # Open MPI's own allocations (run_data_parallel.sh)
export ASAN_OPTIONS
opts=""
if "$mpirun" --version 2>/dev/null | grep -q "Open MPI"; then opts="--oversubscribe"; fi
exec "$mpirun" -np 2 $opts "$prog"
