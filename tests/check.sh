# check.sh - sourced by the shell tests: check NAME COMMAND... runs COMMAND and prints "ok:   NAME", or
# "FAIL: NAME" counting one more in $failures (which the sourcing script starts at 0).
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
