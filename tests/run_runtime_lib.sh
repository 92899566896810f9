#!/bin/sh
# run_runtime_lib.sh - meson test that liballoy-runtime holds no compiler: none of the symbols (functions and data,
# hidden ones included) that the full library's pass, codegen and NVRTC objects define (and the compiler-side files
# of runtime/: the CUDA backend's JIT half, bundle writing, the graph's building and compiling calls) is in the
# runtime's shared library or static archive but the runtime's own stand-ins for them, no symbol is named like them
# (pass_*, *nvrtc*, *emit*, cg_*), nothing in the archive refers to one, no libnvrtc.so name is in it (nothing could
# dlopen NVRTC), the CUDA backend is there (in a CUDA build: it runs a bundle's images), and the shared library
# exports the bundle calls alone and needs no liballoy.so. The same checks run on the full library first and must
# find the compiler there, so they can fail.
#
# The compiler's objects follow from the tree: every object of src/passes/ and src/codegen/, and the
# compiler-side files of src/runtime/ that src/runtime/meson.build names (alloy_runtime_compiler_sources,
# given here after FULL_A); the stand-ins (alloy_runtime_own_sources) come after --standins.
#
# usage: run_runtime_lib.sh RUNTIME_SO RUNTIME_A FULL_A COMPILER_FILE... --standins STANDIN_FILE...
set -u
so=$1 ar=$2 full=$3
shift 3
# a source path .../src/runtime/graph/builder.c -> its object's name in the archives, src_runtime_graph_builder.c.o,
# as an alternative of an ERE
objects() {
    sep=''
    for f in "$@"; do
        printf '%s%s' "$sep" "$(printf '%s' "src/${f##*/src/}" | tr '/' '_' | sed 's/[.]/[.]/g')[.]o"
        sep='|'
    done
}
compiler_files='' standin_files=''
while [ $# -gt 0 ] && [ "$1" != --standins ]; do compiler_files="$compiler_files $1"; shift; done
[ $# -gt 0 ] && shift
standin_files="$*"
# shellcheck disable=SC2086
compiler_re=$(objects $compiler_files)
# shellcheck disable=SC2086
standin_re=$(objects $standin_files)
tmp=${TMPDIR:-/tmp}/runtime_lib.$$
trap 'rm -f "$tmp".*' EXIT
failures=0
check() {
    name=$1
    shift
    if "$@"; then
        echo "ok:   $name"
    else
        echo "FAIL: $name"
        failures=$((failures + 1))
    fi
}

# The runtime's own stand-ins for compiler files (compile_bundle.c, cuda_jit_none.c, driver_jit_none.c): the
# same names as the full library's, refusing.
nm -A --defined-only "$ar" 2>/dev/null | grep -E ":($standin_re):" |
    awk '$(NF-1) == "T" { print $NF }' | sort -u >"$tmp.standins"
# The compiler's objects in the full archive: passes/ and codegen/ by folder, and runtime/'s compiler-side files.
nm -A --defined-only "$full" 2>/dev/null |
    grep -E ":(src_(passes|codegen)_[a-z0-9_]+[.]c[.]o|$compiler_re):" |
    awk '$(NF-1) ~ /^[TDBR]$/ { print $NF }' | sort -u | comm -23 - "$tmp.standins" >"$tmp.compiler"
check "the full library's compiler objects define symbols ($(wc -l <"$tmp.compiler"))" [ "$(wc -l <"$tmp.compiler")" -gt 200 ]
check "pass_run_pipeline is one of them" grep -qx pass_run_pipeline "$tmp.compiler"
check "the compiler-side files of runtime/ are named ($(echo $compiler_files | wc -w)), builder.c among them" \
    sh -c "echo '$compiler_re' | grep -q 'src_runtime_graph_builder'"
check "and define symbols: alloy_input (builder.c) is one" grep -qx alloy_input "$tmp.compiler"
check "the stand-ins are named ($(echo $standin_files | wc -w))" [ -n "$standin_re" ]

nm "$so" 2>/dev/null | awk '{ print $NF }' | sort -u >"$tmp.so"
nm --defined-only "$ar" 2>/dev/null | awk 'NF == 3 { print $3 }' | sort -u >"$tmp.ar"
nm --undefined-only "$ar" 2>/dev/null | awk '{ print $NF }' | sort -u >"$tmp.undef"
check "the runtime .so has a symbol table ($(wc -l <"$tmp.so") symbols)" [ "$(wc -l <"$tmp.so")" -gt 500 ]
check "the runtime archive defines symbols ($(wc -l <"$tmp.ar"))" [ "$(wc -l <"$tmp.ar")" -gt 500 ]
check "the runtime defines bundle_decode and the CPU backend" sh -c "grep -qx bundle_decode '$tmp.so' && grep -qx cpu_backend_open '$tmp.ar'"

# graph_compile_ir is both libraries' entry point: the pipeline in liballoy (compile_ir.c), a refusal here
check "the runtime's graph_compile_ir is compile_bundle.c's" sh -c "nm -A --defined-only '$ar' | grep -q 'compile_bundle.c.o:.* T graph_compile_ir$'"
# none of the compiler's symbols, by name or pattern
comm -12 "$tmp.compiler" "$tmp.so" >"$tmp.in_so"
comm -12 "$tmp.compiler" "$tmp.ar" >"$tmp.in_ar"
comm -12 "$tmp.compiler" "$tmp.undef" >"$tmp.refs"
check "no compiler symbol in the .so: $(tr '\n' ' ' <"$tmp.in_so")" [ ! -s "$tmp.in_so" ]
check "no compiler symbol in the archive: $(tr '\n' ' ' <"$tmp.in_ar")" [ ! -s "$tmp.in_ar" ]
check "nothing in the archive refers to one: $(tr '\n' ' ' <"$tmp.refs")" [ ! -s "$tmp.refs" ]
# pass_count and pass_name are the pipeline's names (step/pipeline_names.c), which the options check;
# pass_compiled_free frees the schedule and plan the pipeline compiles (step/compiled.c)
pattern='^pass_|nvrtc|NVRTC|emit|^cg_'
cat "$tmp.so" "$tmp.ar" "$tmp.undef" | grep -E "$pattern" | grep -Evx 'pass_count|pass_name|pass_compiled_free' | sort -u >"$tmp.named"
check "no pass_, nvrtc, emit or cg_ symbol: $(tr '\n' ' ' <"$tmp.named")" [ ! -s "$tmp.named" ]
check "no libnvrtc.so name in the .so (nothing dlopens NVRTC)" sh -c "! strings '$so' | grep -qx 'libnvrtc[.]so.*'"
check "the full library has one (the check can fail)" sh -c "strings '$full' | grep -qx 'libnvrtc[.]so.*'"
# the CUDA backend is in (a bundle's images through device.h); with the driver where the build has CUDA
check "the CUDA backend and the launch plan builder are in the runtime" sh -c "grep -qx cuda_backend_open_on '$tmp.ar' && grep -qx lp_build '$tmp.ar'"
if nm "$full" 2>/dev/null | grep -q ' T cdev_open_driver$'; then
    check "the GPU device (the driver by dlopen, cuBLASLt by dlopen) is in the runtime" sh -c "grep -qx cdev_open_driver '$tmp.ar' && grep -qx blt_open '$tmp.ar'"
fi
check "the same pattern finds the compiler in the full archive" sh -c "nm '$full' | grep -Eq ' T (pass_run_pipeline|cg_emit|cg_nvrtc_open)$'"

# the exports: the bundle calls and the helpers of types.h and safetensors.h, nothing of alloy_graph
nm -D --defined-only "$so" | awk '{ print $NF }' | sort -u >"$tmp.exports"
grep -Ev '^(alloy_bundle_[a-z_]+|alloy_safetensors_[a-z_]+|alloy_dtype_name|alloy_dtype_from_name|alloy_dtype_size|alloy_status_name|alloy_host_tensor_numel|alloy_set_allocator)$' \
    "$tmp.exports" >"$tmp.extra"
check "exports only the bundle calls and their helpers: $(tr '\n' ' ' <"$tmp.extra")" [ ! -s "$tmp.extra" ]
check "exports alloy_bundle_load and alloy_bundle_run" sh -c "grep -qx alloy_bundle_load '$tmp.exports' && grep -qx alloy_bundle_run '$tmp.exports'"
check "does not export alloy_graph_save_bundle (liballoy's)" sh -c "! grep -qx alloy_graph_save_bundle '$tmp.exports'"
needed=$(readelf -d "$so" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')
check "needs no liballoy.so, libcuda or libnvrtc ($needed)" sh -c "! echo '$needed' | grep -Eq 'liballoy\\.so|cuda|nvrtc'"
check "its soname is liballoy-runtime.so.0" sh -c "readelf -d '$so' | grep -q 'Library soname: \\[liballoy-runtime.so.0\\]'"

[ $failures -eq 0 ] && echo "liballoy-runtime: no pass, codegen or NVRTC; the CUDA backend without its compiler; exports $(wc -l <"$tmp.exports") bundle and helper calls"
exit $((failures > 0))
