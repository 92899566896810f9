#!/bin/sh
# public_functions.sh - prints every function that the public headers (INCLUDE/alloy/*.h) declare, one name a line,
# sorted; with MAP (a linker version script), only those its global patterns export.
#
# usage: public_functions.sh INCLUDE [MAP]
#
# Each header goes through the C preprocessor ($CC or cc; __cplusplus undefined, as in a C program), so
# comments, macros and conditionals count as a compiler sees them; only text from INCLUDE/alloy/ is kept (not
# the system headers'). Its top-level declarations (split at ';' outside braces; a declaration after a
# struct, enum or inline body counts from the closing brace) that are not typedefs and have a parameter list
# are the functions, each named by the identifier before its '('. A name the script cannot read (a
# function returning a function pointer, say) is printed as "?: DECLARATION" so the callers' checks fail on
# it rather than skip it. Exit status 1 when INCLUDE has no alloy/*.h or the preprocessor fails.
set -eu
inc=$1
map=${2:-}
[ -z "$map" ] || map=$(cd "$(dirname "$map")" && pwd)/$(basename "$map") # before the cd below
[ -d "$inc/alloy" ] || { echo "public_functions.sh: no $inc/alloy" >&2; exit 1; }
cd "$inc"
set -- alloy/*.h
[ -e "$1" ] || { echo "public_functions.sh: no header in $inc/alloy" >&2; exit 1; }

# alloy/mpi.h includes <mpi.h>: with MPI's include flags (mpicc --showme:compile, Open MPI's; else pkg-config's
# mpi or ompi-c), and left out where no mpi.h is found (a build without MPI has nothing of it to export)
mpi_flags=$(mpicc --showme:compile 2>/dev/null || pkg-config --cflags mpi 2>/dev/null || pkg-config --cflags ompi-c 2>/dev/null || true)
names=$(for h in "$@"; do
    if [ "$h" = alloy/mpi.h ]; then
        echo '#include <mpi.h>' | ${CC:-cc} -E $mpi_flags - >/dev/null 2>&1 || continue
    fi
    ${CC:-cc} -std=c11 -E -I . $mpi_flags "$h" || { echo "public_functions.sh: the preprocessor failed on $h" >&2; exit 1; }
done | awk '
    /^# [0-9]+ "/ { f = $3; gsub(/"/, "", f); keep = f ~ /^(\.\/)?alloy\/[A-Za-z0-9_]+\.h$/; next }
    /^#/ { next }
    keep { print }' | awk '
    BEGIN { RS = ";" }
    {
        rec = $0
        before = depth
        opens = gsub(/\{/, "{", rec)
        closes = gsub(/\}/, "}", rec)
        depth += opens - closes
        if (depth != 0) next
        if (before != 0 || opens + closes > 0) {
            # only what follows the last closing brace is at file scope
            if (closes == 0) next
            sub(/^.*\}/, "", rec)
        }
        gsub(/__attribute__ *\(\([^()]*(\([^()]*\))?[^()]*\)\)/, " ", rec)
        gsub(/[ \t\n]+/, " ", rec)
        sub(/^ /, "", rec)
        sub(/ $/, "", rec)
        if (rec == "" || rec ~ /^typedef /) next
        if (rec !~ /\(/) next # a variable or a tag declaration
        name = rec
        sub(/ *\(.*$/, "", name)
        sub(/^.*[^A-Za-z0-9_]/, "", name)
        if (name !~ /^[A-Za-z_][A-Za-z0-9_]*$/ || rec ~ /\( *\*/) name = "?: " rec
        print name
    }' | sort -u)

if [ -z "$map" ]; then
    printf '%s\n' "$names"
    exit 0
fi
# the global patterns of the version script: the words between "global:" and "local:", without ';'
patterns=$(tr '\n' ' ' <"$map" | sed -e 's|/\*\([^*]\|\*[^/]\)*\*/| |g' | tr -s ' \t' '\n\n' |
    awk '/^global:$/ { on = 1; next } /^local:$/ { on = 0 } on && /;$/ { sub(/;$/, ""); print }')
set -f # the patterns are globs for case, not for file names
printf '%s\n' "$names" | while IFS= read -r name; do
    for p in $patterns; do
        # shellcheck disable=SC2254 # p is a glob on purpose
        case $name in $p) echo "$name"; break ;; esac
    done
done
