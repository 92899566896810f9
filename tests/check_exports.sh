#!/bin/sh
# check_exports.sh - meson test that the shared libraries export what the public headers promise: liballoy.so every
# function include/alloy/*.h declares and nothing else, liballoy-runtime.so exactly those its version script's
# patterns name (the bundle calls and their helpers), and neither anything outside the alloy_ namespace.
#
# usage: check_exports.sh LIBALLOY_SO RUNTIME_SO INCLUDE RUNTIME_MAP
#
# The declared functions come from tests/public_functions.sh (the headers through the preprocessor); the
# exports from `nm -D --defined-only`. A header declaring a function no library defines is caught the same
# way: the check runs first on the headers plus one such declaration and must find it missing.
set -u
lib=$1 runtime=$2 inc=$3 map=$4
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/alloy-exports.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failures=0
. "$(dirname "$0")/check.sh" # check NAME COMMAND...
words() { head -20 "$1" | tr '\n' ' '; [ "$(wc -l <"$1")" -le 20 ] || echo "... ($(wc -l <"$1"))"; }

sh "$here/public_functions.sh" "$inc" >"$tmp/declared" || { echo "FAIL: public_functions.sh $inc"; exit 1; }
sh "$here/public_functions.sh" "$inc" "$map" >"$tmp/declared_runtime" || { echo "FAIL: public_functions.sh $map"; exit 1; }
grep -v '^alloy_[a-z0-9_]*$' "$tmp/declared" >"$tmp/odd"
check "the headers declare $(wc -l <"$tmp/declared") functions, alloy_graph_new and alloy_bundle_run among them" \
    sh -c "[ $(wc -l <"$tmp/declared") -gt 100 ] && grep -qx alloy_graph_new '$tmp/declared' && grep -qx alloy_bundle_run '$tmp/declared'"
check "every declared function is named alloy_*: $(words "$tmp/odd")" [ ! -s "$tmp/odd" ]
check "the runtime's map names $(wc -l <"$tmp/declared_runtime") of them, alloy_bundle_load among them, no alloy_graph_ call" \
    sh -c "grep -qx alloy_bundle_load '$tmp/declared_runtime' && ! grep -q '^alloy_graph_' '$tmp/declared_runtime'"

# exports SO EXPECTED LABEL: SO's dynamic symbols against EXPECTED (a sorted list of names)
exports() {
    so=$1 expected=$2 label=$3
    nm -D --defined-only "$so" >"$tmp/nm" 2>&1 || { check "nm -D $so: $(head -1 "$tmp/nm")" false; return; }
    awk '{ print $NF }' "$tmp/nm" | sort -u >"$tmp/exported"
    awk 'NF == 3 && $2 !~ /^[TWi]$/ { print $3 "(" $2 ")" }' "$tmp/nm" | grep '^alloy_' >"$tmp/not_code"
    comm -23 "$expected" "$tmp/exported" >"$tmp/missing"
    comm -13 "$expected" "$tmp/exported" >"$tmp/extra"
    grep -v '^alloy_' "$tmp/exported" >"$tmp/outside"
    check "$label exports $(wc -l <"$tmp/exported") symbols" [ -s "$tmp/exported" ]
    check "$label exports every function expected of it; missing: $(words "$tmp/missing")" [ ! -s "$tmp/missing" ]
    check "$label exports nothing outside alloy_: $(words "$tmp/outside")" [ ! -s "$tmp/outside" ]
    check "$label exports no alloy_ name the headers do not give it: $(words "$tmp/extra")" [ ! -s "$tmp/extra" ]
    check "$label exports its alloy_ names as code: $(words "$tmp/not_code")" [ ! -s "$tmp/not_code" ]
}

# the check can fail: a declaration that nothing defines is reported missing
mkdir -p "$tmp/inc/alloy"
cp "$inc"/alloy/*.h "$tmp/inc/alloy/"
printf '#include "alloy/types.h"\nALLOY_API alloy_status alloy_declared_not_defined(\n    int x);\n' >"$tmp/inc/alloy/zz_extra.h"
sh "$here/public_functions.sh" "$tmp/inc" >"$tmp/declared_extra"
nm -D --defined-only "$lib" 2>/dev/null | awk '{ print $NF }' | sort -u | comm -23 "$tmp/declared_extra" - >"$tmp/missing_extra"
check "a function declared and not defined is found missing" grep -qx alloy_declared_not_defined "$tmp/missing_extra"

exports "$lib" "$tmp/declared" "liballoy.so"
exports "$runtime" "$tmp/declared_runtime" "liballoy-runtime.so"

[ $failures -eq 0 ] && echo "exports: liballoy.so $(wc -l <"$tmp/declared") functions, liballoy-runtime.so $(wc -l <"$tmp/declared_runtime"), as declared"
exit $((failures > 0))
