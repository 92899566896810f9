#!/bin/sh
# check_env_names.sh - every ALLOY_* variable the sources read with getenv is one the library knows (the option
# table, src/step/options.c, or the list in src/runtime/graph/env_check.c), so it never warns "not a variable
# alloy reads" about a name alloy, its tools or its tests read.
#
# usage: check_env_names.sh SOURCE_ROOT
set -u
root=$1
known=$(cat "$root/src/step/options.c" "$root/src/runtime/graph/env_check.c")
names=$(grep -rhoE 'getenv\("ALLOY_[A-Z0-9_]+' "$root/src" "$root/tools" "$root/tests" "$root/examples" "$root/bench" |
    sed 's/getenv("//' | sort -u)
[ -n "$names" ] || { echo "FAIL: no getenv(\"ALLOY_...\") found under $root (the scan is broken)"; exit 1; }
missing=""
for n in $names; do
    printf '%s\n' "$known" | grep -q "\"$n\"" || missing="$missing $n"
done
if [ -n "$missing" ]; then
    echo "FAIL: read with getenv but not in the option table or env_check.c's list (alloy would warn about them):$missing"
    exit 1
fi
echo "ok: $(echo "$names" | wc -l) ALLOY_ variables read with getenv, each known"
