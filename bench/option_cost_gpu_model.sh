#!/bin/sh
# option_cost_gpu_model.sh GPU_STEP [OPTION...]: what 0/1 options cost char_gpt's f16 step on the GPU, as the cost
# model has it (modelled, not measured; H100 SXM constants, ptxas resources for sm_90): a markdown table of the
# launches, bytes and modelled ms with every option off, each one on alone, and all of them on. GPU_STEP is
# build/bench/gpu_step (-Dbench=true). E.g. `option_cost_gpu_model.sh build/bench/gpu_step amp_check amp_stats`.
set -eu
bin=$1
shift
model() { # SET-ARGS... -> "launches|kernels|memsets|GB|ms low - high"
    "$bin" --model char_gpt --dtype f16 --cost --arch sm_90 "$@" 2>&1 | awk '
        /^launches/ { l = $2; sub(":", "", l); k = $3; for (i = 1; i <= NF; i++) if ($i ~ /^memsets/) m = $(i - 1) }
        /^bytes/ { g = $3; gsub("[(]", "", g) }
        /^modelled/ { t = $2 " - " $4 }
        END { printf "%s|%s|%s|%s|%s\n", l, k, m, g, t }'
}
row() { # LABEL SET-ARGS...
    label=$1
    shift
    echo "| $label | $(model "$@" | sed 's/|/ | /g') |"
}
echo "| options | launches | kernels | memsets | bytes GB | modelled ms |"
echo "|---|---|---|---|---|---|"
row "off (default)"
all=""
for o in "$@"; do
    row "$o=1" --set "$o=1"
    all="$all --set $o=1"
done
[ $# -gt 1 ] && row "all on" $all
exit 0
