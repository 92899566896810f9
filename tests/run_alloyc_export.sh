#!/bin/sh
# run_alloyc_export.sh ALLOYC IR_DIR - alloyc compile of char_gpt.ir's f16 training step for sm_80 and sm_90:
# the files it writes (ELF cubins), summary.txt against the sources (a row per __global__ kernel, each row's
# file:line holds that kernel), the kernel cache (all from the cache the second time, ALLOY_CACHE=0 compiles
# again), ALLOY_DUMP_DIR, and the usage and NVRTC errors. Exits 77 (meson's skip) when NVRTC cannot be loaded.
set -u
alloyc=$1 dir=$2
ir=$dir/char_gpt.ir
tmp=$(mktemp -d "${TMPDIR:-/tmp}/alloyc_export.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
unset ALLOY_CACHE ALLOY_DUMP_DIR
ALLOY_CACHE_DIR=$tmp/cache
export ALLOY_CACHE_DIR

fail() {
    echo "FAIL: $*"
    exit 1
}
# compile OUT [VAR=VALUE...]: alloyc compile into OUT (stdout in OUT.txt, stderr in OUT.err) with those variables set
compile() {
    out=$1
    shift
    env "$@" "$alloyc" compile "$ir" --train --amp=f16 --arch sm_80,sm_90 -o "$out" >"$out.txt" 2>"$out.err"
}
# total NAME OUT: the number after NAME in OUT/summary.txt's totals
total() { sed -n "s/^$1  *\([0-9][0-9]*\).*/\1/p" "$2/summary.txt"; }
entries() { find "$tmp/cache" -name '*.kernel' | wc -l; }

if ! compile "$tmp/cold"; then
    if grep -q 'NVRTC is not available' "$tmp/cold.err"; then
        echo "SKIP: $(cat "$tmp/cold.err")"
        exit 77
    fi
    fail "alloyc compile: $(cat "$tmp/cold.err")"
fi
out=$tmp/cold
[ -s "$out.err" ] && fail "alloyc compile wrote to stderr: $(cat "$out.err")"
[ "$(tail -n 1 "$out.txt")" = "wrote $out" ] || fail "stdout does not end with 'wrote $out'"
sed '$d' "$out.txt" | cmp -s - "$out/summary.txt" || fail "stdout is not summary.txt and the 'wrote' line"

# one source per module, a cubin per module and architecture, each an ELF file
modules=$(sed -n 's/^kernels .* in \([0-9]*\) modules*.*/\1/p' "$out/summary.txt")
[ "$(find "$out" -name 'alloy_m*.cu' | wc -l)" -eq "$modules" ] || fail "$modules modules in the summary, other .cu files"
m=0
while [ "$m" -lt "$modules" ]; do
    [ -s "$out/alloy_m$m.cu" ] || fail "alloy_m$m.cu missing"
    for arch in sm_80 sm_90; do
        f=$out/alloy_m$m.$arch.cubin
        [ "$(od -An -tx1 -N4 "$f" 2>/dev/null | tr -d ' \n')" = 7f454c46 ] || fail "$f is not an ELF file"
    done
    m=$((m + 1))
done
binaries=$(total binaries "$out")
[ "$binaries" -eq $((modules * 2)) ] || fail "binaries $binaries, want $modules modules x 2"

# a row per kernel: as many as the sources have __global__ functions, each at the file:line it names
awk '/^kernel /{on=1; next} /^$/{on=0} on' "$out/summary.txt" >"$tmp/rows"
rows=$(wc -l <"$tmp/rows")
globals=$(cat "$out"/alloy_m*.cu | grep -o '__global__' | wc -l)
[ "$rows" -gt 0 ] && [ "$rows" -eq "$globals" ] || fail "summary.txt has $rows kernel rows, the sources $globals __global__ kernels"
[ "$(total kernels "$out")" -eq "$rows" ] || fail "the kernels total is not the row count $rows"
bad=$(awk -v dir="$out" '{
    split($8, at, ":"); file = dir "/" at[1]; n = 0
    while (n < at[2] && (getline line < file) > 0) n++
    close(file)
    if (index(line, " " $1 "(") == 0) print $1 " not at " $8
}' "$tmp/rows")
[ -z "$bad" ] || fail "kernel rows that point elsewhere: $bad"
grep -q '^library step ' "$out/summary.txt" || fail "no steps left to libraries listed"
grep -q 'a library GEMM (cuBLASLt)' "$out/summary.txt" || fail "no GEMM left to cuBLASLt listed"
[ "$(total 'from cache' "$out")" -eq 0 ] || fail "the first compile found binaries in a new cache"
cold=$(sed -n 's/^compile time *//p' "$out/summary.txt")

# the second run: every binary from the cache
compile "$tmp/warm" || fail "second alloyc compile: $(cat "$tmp/warm.err")"
[ "$(total 'from cache' "$tmp/warm")" -eq "$binaries" ] || fail "second run: $(grep '^from cache' "$tmp/warm/summary.txt"), want all $binaries"
for f in "$out"/alloy_m*; do
    cmp -s "$f" "$tmp/warm/${f##*/}" || fail "${f##*/} differs between the cold and the warm run"
done
warm=$(sed -n 's/^compile time *//p' "$tmp/warm/summary.txt")

# ALLOY_CACHE=0: everything compiled again, nothing added to the cache
before=$(entries)
compile "$tmp/nocache" ALLOY_CACHE=0 || fail "ALLOY_CACHE=0 alloyc compile: $(cat "$tmp/nocache.err")"
[ "$(total 'from cache' "$tmp/nocache")" -eq 0 ] || fail "ALLOY_CACHE=0: $(grep '^from cache' "$tmp/nocache/summary.txt")"
grep -q '^from cache .*(cache off)' "$tmp/nocache/summary.txt" || fail "ALLOY_CACHE=0: the summary does not say the cache is off"
[ "$(entries)" -eq "$before" ] || fail "ALLOY_CACHE=0 wrote cache entries"

# ALLOY_DUMP_DIR receives every source
compile "$tmp/dumped" ALLOY_DUMP_DIR="$tmp/dump" || fail "ALLOY_DUMP_DIR alloyc compile: $(cat "$tmp/dumped.err")"
[ "$(find "$tmp/dump" -name 'alloy_m*.cu' | wc -l)" -eq "$modules" ] || fail "ALLOY_DUMP_DIR holds no $modules sources"
for f in "$tmp/dump"/alloy_m*.cu; do
    cmp -s "$f" "$out/${f##*/}" || fail "dumped ${f##*/} differs from the exported one"
done

# errors: usage errors exit 2, an architecture NVRTC cannot build for exits 1; one line on stderr each
expect() {
    want=$1 pattern=$2
    shift 2
    "$alloyc" "$@" >"$tmp/stdout" 2>"$tmp/stderr"
    got=$?
    [ "$got" -eq "$want" ] && [ "$(wc -l <"$tmp/stderr")" -eq 1 ] && grep -q "^alloyc: .*$pattern" "$tmp/stderr" ||
        fail "alloyc $* -> exit $got (want $want with '$pattern'): $(cat "$tmp/stderr")"
}
expect 2 "--arch wants sm_XY.*'sm_1'" compile "$ir" --arch sm_1 -o "$tmp/bad"
expect 2 "compile needs -o DIR" compile "$ir" --arch sm_80
expect 2 "compile needs --arch" compile "$ir" -o "$tmp/bad"
expect 2 "--emit of compile wants cuda" compile "$ir" --arch sm_80 --emit=ptx -o "$tmp/bad"
expect 2 "--feed is an option of 'run'" compile "$ir" --arch sm_80 --feed x -o "$tmp/bad"
expect 1 "sm_35" compile "$ir" --arch sm_35 -o "$tmp/bad"
[ -e "$tmp/bad" ] && fail "a failed compile made its output directory"

# a machine without NVRTC (a library path that does not exist): the export fails saying why and naming the
# path; the CPU still runs the graph
ALLOY_NVRTC=$tmp/no/libnvrtc.so.13 "$alloyc" compile "$ir" --arch sm_80 -o "$tmp/nonvrtc" >"$tmp/stdout" 2>"$tmp/stderr"
got=$?
[ "$got" -eq 1 ] && grep -q "NVRTC is not available.*$tmp/no/libnvrtc.so.13" "$tmp/stderr" ||
    fail "ALLOY_NVRTC=<missing> alloyc compile -> exit $got: $(cat "$tmp/stderr")"
[ -e "$tmp/nonvrtc" ] && fail "an export without NVRTC made its output directory"
data=$dir/../../tests/data
ALLOY_NVRTC=$tmp/no/libnvrtc.so.13 "$alloyc" run "$data/mlp2.ir" --feed "$data/mlp2_feeds.safetensors" \
    --params "$data/mlp2_params.safetensors" --out "$tmp/cpu.safetensors" >"$tmp/stdout" 2>"$tmp/stderr" ||
    fail "ALLOY_NVRTC=<missing> alloyc run on the CPU: $(cat "$tmp/stderr")"

echo "ok: $(total kernels "$out") kernels in $modules modules, $binaries cubins for sm_80 and sm_90;" \
    "cold $cold, warm $warm (all from the cache); ALLOY_CACHE=0, ALLOY_DUMP_DIR and a missing NVRTC checked"
