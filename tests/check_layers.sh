#!/bin/sh
# check_layers.sh - the layering rule of docs/architecture.md, checked on the sources:
# base < ir < passes < codegen < runtime backends (runtime/cpu, runtime/io) and the cost model over the CUDA
# backend's launch plan (cost/) < the public object (runtime/graph).
# A file may include headers of its own layer and the layers below, never above;
# passes and the IR read no environment (configuration arrives in the options struct).
# Usage: check_layers.sh SRC_DIR. Prints each violation; exit 1 if any.
src=${1:?usage: check_layers.sh SRC_DIR}
bad=0
rank() {
    case $1 in
    base/*) echo 0 ;;
    ir/*) echo 1 ;;
    passes/*) echo 2 ;;
    codegen/*) echo 3 ;;
    runtime/graph/*) echo 6 ;;
    cost/*) echo 5 ;;
    runtime/*) echo 5 ;;
    *) echo 9 ;;
    esac
}
cd "$src" || exit 1
for f in $(find . -name '*.c' -o -name '*.h' -o -name '*.def' | sed 's|^\./||' | sort); do
    mine=$(rank "$f")
    for inc in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f"); do
        case $inc in alloy/* | alloy_config.h) continue ;; esac
        theirs=$(rank "$inc")
        if [ "$theirs" -gt "$mine" ]; then
            echo "layering: $f includes $inc (a higher layer)"
            bad=1
        fi
    done
done
if grep -n 'getenv' -r ir passes base codegen 2>/dev/null; then
    echo "layering: the IR, passes and base must not read the environment (use the options struct)"
    bad=1
fi
[ $bad -eq 0 ] && echo "layers: ok"
exit $bad
