#!/bin/sh
# run.sh - runs alloy's libFuzzer targets (docs/testing.md) from a build configured with -Dfuzz=true.
#
#   tests/fuzz/run.sh BUILD SECONDS [TARGET...]   fuzz each target (default: all) for SECONDS
#   tests/fuzz/run.sh --replay BUILD [TARGET...]  run every seed and saved reproducer once
#
# BUILD is the build directory (or its tests/fuzz). Targets: ir safetensors checkpoint builder bundle.
# Seeds: fuzz_seeds' output and the test data, written to BUILD/tests/fuzz/seeds/TARGET; the corpus
# libFuzzer grows is kept in BUILD/tests/fuzz/corpus/TARGET (a longer run goes on from it);
# tests/fuzz/regress/TARGET/ holds reproducers of fixed crashes, replayed every time. A crash,
# leak, timeout or out-of-memory input is written to BUILD/tests/fuzz/crashes/ and named.
# Exit status: 0 when every target ran clean. FUZZ_FLAGS adds libFuzzer flags (e.g. -jobs=2).
set -u

src=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$src/../.." && pwd)
replay=0
if [ "${1:-}" = --replay ]; then
    replay=1
    shift
fi
[ $# -ge 1 ] || { sed -n '2,13p' "$0"; exit 2; }
build=$1
shift
[ -x "$build/tests/fuzz/fuzz_seeds" ] && build=$build/tests/fuzz
[ -x "$build/fuzz_seeds" ] || { echo "run.sh: no fuzz_seeds in $build (configure with CC=clang -Dfuzz=true)"; exit 2; }
seconds=0
if [ $replay -eq 0 ]; then
    seconds=${1:-}
    case $seconds in '' | *[!0-9]*) echo "run.sh: SECONDS must be a number"; exit 2 ;; esac
    shift
fi
targets=${*:-ir safetensors checkpoint builder bundle}

# Reproducible runs: no ALLOY_* settings from the caller's environment.
for v in $(env | sed -n 's/^\(ALLOY_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
export ASAN_OPTIONS="${FUZZ_ASAN_OPTIONS:-detect_leaks=1:print_summary=1}"
export UBSAN_OPTIONS="print_stacktrace=1:print_summary=1"
export OPENBLAS_NUM_THREADS=1
sym=$(command -v llvm-symbolizer || ls /usr/lib/llvm-*/bin/llvm-symbolizer 2>/dev/null | tail -n 1)
[ -n "$sym" ] && export ASAN_SYMBOLIZER_PATH="$sym"

# Seeds: generated (models' checkpoints and IR dumps, safetensors of every dtype, builder programs)
# into a fresh directory, then the test data.
if [ $replay -eq 1 ]; then
    seeds=$(mktemp -d "${TMPDIR:-/tmp}/alloy-fuzz-seeds.XXXXXX") || exit 1
    trap 'rm -rf "$seeds"' EXIT
else
    seeds=$build/seeds
    rm -rf "$seeds"
fi
"$build/fuzz_seeds" "$seeds" || { echo "run.sh: fuzz_seeds failed"; exit 1; }
cp "$root"/tests/data/*.ir "$root"/tests/golden/*.ir "$root"/examples/ir/*.ir "$seeds/ir/"
cp "$root"/tests/data/*.safetensors "$seeds/safetensors/"

status=0
for t in $targets; do
    exe=$build/fuzz_$t
    case $t in
    ir) max_len=16384 ;;
    builder) max_len=2048 ;;
    safetensors | checkpoint) max_len=4096 ;;
    bundle) max_len=65536 ;;
    *) echo "run.sh: unknown target '$t' (ir safetensors checkpoint builder bundle)"; status=1; continue ;;
    esac
    regress=$src/regress/$t
    dirs="$seeds/$t"
    [ -d "$regress" ] && dirs="$dirs $regress"
    log=$build/fuzz_$t.log
    mkdir -p "$build/crashes"
    if [ $replay -eq 1 ]; then
        # shellcheck disable=SC2086
        "$exe" -runs=0 -rss_limit_mb=2048 -timeout=60 -artifact_prefix="$build/crashes/$t-" $dirs >"$log" 2>&1
        rc=$?
    else
        corpus=$build/corpus/$t
        mkdir -p "$corpus"
        # shellcheck disable=SC2086
        "$exe" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=$max_len -timeout=30 \
            -print_final_stats=1 -artifact_prefix="$build/crashes/$t-" ${FUZZ_FLAGS:-} "$corpus" $dirs >"$log" 2>&1
        rc=$?
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -n 1)
    cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -n 1)
    corp=$(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" | tail -n 1)
    if [ $rc -eq 0 ]; then
        if [ $replay -eq 1 ]; then
            echo "fuzz_$t: ok, every seed and reproducer ran (${cov:-cov: ?})"
        else
            echo "fuzz_$t: ok, ${seconds}s, ${runs:-?} runs, ${speed:-?} exec/s, ${cov:-cov: ?}, ${corp:-corp: ?}, peak rss ${rss:-?} MB"
        fi
    else
        status=1
        unit=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
        echo "fuzz_$t: FAILED (exit $rc) after ${runs:-?} runs; reproducer: ${unit:-none written}"
        echo "  rerun: $exe ${unit:-<input>}    log: $log"
        grep -E '^(==[0-9]+==ERROR|SUMMARY|fuzz: |.*runtime error|    #[0-9] )' "$log" | head -n 20 | sed 's/^/  | /'
    fi
done
exit $status
