#!/bin/sh
# check_alloyc_help.sh - meson test that `alloyc --help` names everything alloyc accepts: every flag of its
# flag table and every flag it compares by name (tools/alloyc_args.c), every option --set takes (the option table,
# src/step/options.c) in the --set paragraph, and every pass --print-after takes (src/step/pipeline.def) in
# the passes list. The names are read from the sources, so a new flag, option or pass without its line in
# --help fails here.
#
# usage: check_alloyc_help.sh ALLOYC SOURCE_ROOT
set -u
alloyc=$1 src=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/alloyc-help.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failures=0
. "$(dirname "$0")/check.sh" # check NAME COMMAND...
# has_word FILE WORD: WORD stands alone in FILE (not inside a longer name such as --set-x or lowp_gemm_x)
has_word() { grep -qE -- "(^|[^A-Za-z0-9_-])$2([^A-Za-z0-9_-]|\$)" "$1"; }
# missing FILE LIST: the words of LIST that FILE lacks
missing() { for w in $(cat "$2"); do has_word "$1" "$w" || printf '%s ' "$w"; done; }

"$alloyc" --help >"$tmp/help" 2>&1 || { echo "FAIL: alloyc --help exited $?"; exit 1; }
# the --set paragraph: from its line to the one that ends it ("repeats")
awk '/^  --set NAME=VALUE/ { on = 1 } on { print } on && /repeats/ { exit }' "$tmp/help" >"$tmp/set"
# the passes of --print-after: from "passes:" to the next "("
awk '/passes: / { on = 1; sub(/.*passes: /, "") } on { print } on && /\(/ { exit }' "$tmp/help" | sed 's/(.*//' >"$tmp/passes"

# the flags: the table's names and aliases, and those compared with strcmp(arg, ...) or strcmp(cmd, ...)
{
    grep -oE '^ *\[F_[A-Z_]+\] = \{"[^"]+", ("[^"]+"|NULL)' "$src/tools/alloyc_args.c" | grep -oE '"[^"]+"' | tr -d '"'
    grep -oE 'strcmp\((arg|cmd), "-[^"]*"\)' "$src/tools/alloyc_args.c" | grep -oE '"[^"]+"' | tr -d '"'
} | sort -u >"$tmp/flags"
grep -oE '^ *\{"[a-z_]+", "ALLOY_[A-Z_]+"' "$src/src/step/options.c" | grep -oE '"[a-z_]+"' | tr -d '"' >"$tmp/options"
grep -oE '^PASS\([a-z_]+' "$src/src/step/pipeline.def" | sed 's/PASS(//' >"$tmp/pass_names"

check "the flag table and comparisons give $(wc -l <"$tmp/flags") flags, --feed, -o and --with-state among them" \
    sh -c "[ $(wc -l <"$tmp/flags") -ge 25 ] && grep -qx -- --feed '$tmp/flags' && grep -qx -- -o '$tmp/flags' && grep -qx -- --with-state '$tmp/flags'"
check "the option table gives $(wc -l <"$tmp/options") options, lowp_gemm and profile among them" \
    sh -c "[ $(wc -l <"$tmp/options") -ge 15 ] && grep -qx lowp_gemm '$tmp/options' && grep -qx profile '$tmp/options'"
check "pipeline.def gives $(wc -l <"$tmp/pass_names") passes, verify and plan among them" \
    sh -c "[ $(wc -l <"$tmp/pass_names") -ge 10 ] && grep -qx verify '$tmp/pass_names' && grep -qx plan '$tmp/pass_names'"
check "--help has a --set paragraph and a passes list" sh -c "[ -s '$tmp/set' ] && [ -s '$tmp/passes' ]"
# the word test can fail: a name that is not there, and a name only inside a longer one
check "the check finds no --no-such-flag, and no 'lowp' (only lowp_gemm)" \
    sh -c "! grep -qE -- '(^|[^A-Za-z0-9_-])--no-such-flag([^A-Za-z0-9_-]|\$)' '$tmp/help' &&
           ! grep -qE -- '(^|[^A-Za-z0-9_-])lowp([^A-Za-z0-9_-]|\$)' '$tmp/set'"

m=$(missing "$tmp/help" "$tmp/flags")
check "--help names every flag; missing: $m" [ -z "$m" ]
m=$(missing "$tmp/set" "$tmp/options")
check "the --set paragraph names every option; missing: $m" [ -z "$m" ]
m=$(missing "$tmp/passes" "$tmp/pass_names")
check "the passes list names every pass; missing: $m" [ -z "$m" ]

[ $failures -eq 0 ] && echo "alloyc --help: $(wc -l <"$tmp/flags") flags, $(wc -l <"$tmp/options") options, $(wc -l <"$tmp/pass_names") passes"
exit $((failures > 0))
