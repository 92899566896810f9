#!/bin/sh
# tools/gpu-kit.sh OUT_DIR [--build DIR] [--gpt2] [--quick]: packs, on any machine with the CUDA toolkit (no GPU
# needed), one folder that a bare GPU machine (Ubuntu 24.04, CUDA 13 driver, OpenBLAS; no cmocka, meson or
# network) runs with `OUT_DIR/run.sh` (the same as `tools/gpu-check.sh --kit OUT_DIR`):
#   bin/test_cuda   the GPU suite (`test_cuda gpu`, the cuda_gpu test)
#   bin/gpu_step    the GPU benchmark (bench/gpu_step.c)
#   bin/char_gpt    the char_gpt example, data/GPL-3 its text
#   lib/            the shared libraries those need that such a machine lacks (libcmocka.so.0; each binary's
#                   ldd is checked against a list of what a base system + the CUDA driver has)
#   cache/          the kernel cache (ALLOY_CACHE_DIR) filled for sm_90: char_gpt's and the MLPs' training
#                   steps (alloyc compile, and gpu_step --export-cuda for the benchmark's own graphs: the
#                   cubins a run reads; --cost --arch would cache only ptxas' logs);
#                   --gpt2 adds GPT-2 124M B8 and its attention-op form B32 (about 60-80 CPU-s each)
#   run.sh, MANIFEST.txt
# The binaries come from --build DIR (default build/, built with tests on); the benchmark needs -Dbench=true, so
# when DIR lacks it a second build directory DIR-kit-bench is configured for gpu_step alone (--quick leaves
# gpu_step out instead). --quick fills the cache with mlp_classifier.ir's step alone (seconds of NVRTC: for the
# test of the kit's logic). Prints the kit's size; fails (exit 1) past
# 48 MiB or when a binary needs a library that is neither carried nor on the list.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out="" build=$root/build gpt2=0 quick=0
while [ $# -gt 0 ]; do
    case $1 in
    --build) build=$2; shift ;;
    --gpt2) gpt2=1 ;;
    --quick) quick=1 ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu-kit: unknown option $1 (see --help)"; exit 2 ;;
    *) out=$1 ;;
    esac
    shift
done
[ -n "$out" ] || { echo "usage: tools/gpu-kit.sh OUT_DIR [--build DIR] [--gpt2] [--quick]"; exit 2; }
limit=$((48 * 1024 * 1024))
say() { printf '== %s\n' "$*"; }
die() { echo "gpu-kit: $*"; exit 1; }

cuda=""
if [ -n "${CUDA_PATH:-}" ] && [ -x "$CUDA_PATH/bin/nvcc" ]; then cuda=$CUDA_PATH
elif command -v nvcc >/dev/null 2>&1; then cuda=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
elif [ -x /usr/local/cuda/bin/nvcc ]; then cuda=/usr/local/cuda
fi
[ -n "$cuda" ] || die "no CUDA toolkit (CUDA_PATH, nvcc on PATH or /usr/local/cuda): it builds the CUDA backend and NVRTC fills the kernel cache"
export CUDA_PATH=$cuda LD_LIBRARY_PATH="$cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- the binaries ----
[ -e "$build/build.ninja" ] || die "$build is no meson build directory (meson setup $build -Dtests=enabled)"
build=$(cd "$build" && pwd)
say "ninja -C $build tests/test_cuda examples/char_gpt tools/alloyc"
ninja -C "$build" tests/test_cuda examples/char_gpt tools/alloyc >/dev/null || die "the build failed in $build"
bench=$build
if ! grep -q 'bench/gpu_step' "$build/build.ninja" && [ $quick = 1 ]; then
    bench=""
    say "gpu_step left out: $build has no benchmarks (-Dbench=true), and --quick configures no second build"
elif ! grep -q 'bench/gpu_step' "$build/build.ninja"; then
    bench=$build-kit-bench
    if [ ! -e "$bench/build.ninja" ]; then
        say "meson setup $bench -Dbench=true (gpu_step; $build has no benchmarks)"
        meson setup "$bench" -Dbench=true -Dtests=disabled -Dcuda=enabled -Dbuildtype=release >"$bench.log" 2>&1 ||
            { tail -20 "$bench.log"; die "meson setup $bench failed; see $bench.log"; }
    fi
fi
if [ -n "$bench" ]; then
    say "ninja -C $bench bench/gpu_step"
    ninja -C "$bench" bench/gpu_step >/dev/null || die "the build of gpu_step failed in $bench"
fi

rm -rf "$out" && mkdir -p "$out/bin" "$out/lib" "$out/cache" "$out/data" || die "cannot make $out"
out=$(cd "$out" && pwd)
bins="$build/tests/test_cuda $build/examples/char_gpt${bench:+ $bench/bench/gpu_step}"
cp $bins "$out/bin/" || die "cannot copy the binaries"
cp /usr/share/common-licenses/GPL-3 "$out/data/GPL-3" 2>/dev/null || printf 'to be or not to be, that is the question\n%.0s' $(seq 400) >"$out/data/GPL-3"
cp "$root/tools/gpu-kit-run.sh" "$out/run.sh" && chmod +x "$out/run.sh" || die "cannot copy tools/gpu-kit-run.sh"

# ---- the libraries: what a bare Ubuntu 24.04 + CUDA 13 driver + OpenBLAS machine has stays out; the rest
# (cmocka, liballoy where the binary links it, OpenMPI's libraries where liballoy was built with MPI) goes in.
# The binaries in the build find them by their own rpath; the copies by LD_LIBRARY_PATH=KIT/lib.
on_base() {
    case $1 in
    linux-vdso.so.* | ld-linux-x86-64.so.* | libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | \
        libgcc_s.so.* | libstdc++.so.* | libz.so.* | libudev.so.* | libopenblas*.so.* | libblas.so.* | libgfortran.so.* | \
        libquadmath.so.* | libcuda.so.* | libnvrtc*.so.* | libcublas*.so.* | libcudart.so.*) return 0 ;;
    esac
    return 1
}
for bin in $bins; do
    ldd "$bin" | while read -r name arrow path _; do
        [ "$arrow" = "=>" ] || continue
        on_base "$name" && continue
        [ "$path" = "not" ] && die "$(basename "$bin") needs $name, which this machine cannot find either"
        [ -e "$out/lib/$name" ] || { cp -L "$path" "$out/lib/$name" && echo "   lib/$name (from $path, for $(basename "$bin"))"; }
    done || exit 1
done

# ---- the kernel cache for sm_90 ----
export ALLOY_CACHE_DIR=$out/cache LD_LIBRARY_PATH="$out/lib:$LD_LIBRARY_PATH"
scratch=$(mktemp -d) || die "mktemp failed"
trap 'rm -rf "$scratch"' EXIT
fill() { # fill WHAT COMMAND...: one compile into the cache, timed
    t0=$(date +%s)
    "$@" >"$scratch/fill.log" 2>&1 || { tail -5 "$scratch/fill.log"; die "filling the cache ($1 ...) failed"; }
    echo "   $what: $(($(date +%s) - t0)) s"
}
say "kernel cache for sm_90 ($out/cache)"
alloyc=$build/tools/alloyc
what="mlp_classifier f16 AMP (alloyc compile)"
fill "$alloyc" compile "$root/examples/ir/mlp_classifier.ir" --train --amp=f16 --scaler=dynamic \
    --optimizer=adamw --arch sm_90 -o "$scratch/mlp"
if [ $quick = 0 ]; then
    what="char_gpt f16 AMP (alloyc compile)"
    fill "$alloyc" compile "$root/examples/ir/char_gpt.ir" --train --amp=f16 --scaler=dynamic --optimizer=adamw \
        --arch sm_90 -o "$scratch/char_gpt"
    for model in char_gpt mlp; do
        what="gpu_step $model f16 (--export-cuda --arch sm_90)"
        fill "$out/bin/gpu_step" --model "$model" --dtype f16 --arch sm_90 --export-cuda "$scratch/$model"
    done
    if [ $gpt2 = 1 ]; then
        for model in gpt2 gpt2_flash; do
            what="gpu_step $model f16 (--export-cuda --arch sm_90)"
            fill "$out/bin/gpu_step" --model "$model" --dtype f16 --arch sm_90 --export-cuda "$scratch/$model"
        done
    fi
fi

# ---- the manifest and the size ----
bytes=$(du -sb "$out" | cut -f1)
{
    echo "alloy GPU kit, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "built on: $(uname -srm); CUDA toolkit $cuda; NVRTC $(ls "$cuda"/lib64/libnvrtc.so.* 2>/dev/null | head -1 | sed 's|.*/||')"
    echo "cache: sm_90; $(ls "$out/cache" | grep -c '\.kernel$') entries; gpt2: $([ $gpt2 = 1 ] && echo yes || echo no); quick: $([ $quick = 1 ] && echo yes || echo no)"
    echo "size: $bytes bytes"
    (cd "$out" && find . -type f ! -path './cache/*' ! -name MANIFEST.txt | sort | while read -r f; do
        printf '%10s  %s\n' "$(wc -c <"$f")" "$f"
    done)
} >"$out/MANIFEST.txt"
bytes=$(du -sb "$out" | cut -f1)
say "kit: $out, $bytes bytes ($(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }') MiB; limit 48 MiB)"
[ "$bytes" -le $limit ] || die "the kit is $bytes bytes, over the 48 MiB limit"
exit 0
