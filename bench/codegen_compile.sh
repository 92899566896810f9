#!/bin/sh
# codegen_compile.sh ALLOYC [ROUNDS] [ARCHS]: how long NVRTC takes over the char_gpt training step
# (f16 AMP, dynamic loss scaling, AdamW) and the mlp_classifier one, through alloyc compile: per
# round a cold export (an empty kernel cache) then a warm one (every module from the disk cache);
# prints a table of the compile times the exports report (the thread pool's wall time) and the
# process wall times, then the medians. ARCHS defaults to sm_90 (what a run on an H100 compiles).
set -eu
alloyc=$1 rounds=${2:-5} archs=${3:-sm_90}
ir=$(dirname "$0")/../examples/ir
tmp=$(mktemp -d "${TMPDIR:-/tmp}/codegen_compile.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
ms() { date +%s%N | awk '{printf "%.0f\n", $1 / 1000000}'; }
# export NAME FILE CACHE: one export, prints "compile_ms wall_ms kernels modules"
export_once() {
    t0=$(ms)
    ALLOY_CACHE_DIR=$3 "$alloyc" compile "$ir/$2" --train --amp=f16 --scaler=dynamic --optimizer=adamw \
        --arch "$archs" -o "$tmp/out" >"$tmp/summary.txt"
    t1=$(ms)
    awk -v wall=$((t1 - t0)) '/^compile time/ {c = $3} /^kernels/ {k = $2; m = $4}
        END {printf "%s %s %s %s\n", c, wall, k, m}' "$tmp/summary.txt"
}
printf '%-16s %-6s %8s %8s %12s %12s %12s %12s\n' graph round kernels modules "cold ms" "cold wall" "warm ms" "warm wall"
for file in char_gpt.ir mlp_classifier.ir; do
    r=1
    while [ "$r" -le "$rounds" ]; do
        rm -rf "$tmp/cache"
        set -- $(export_once x "$file" "$tmp/cache")
        cold=$1 coldw=$2 kernels=$3 modules=$4
        set -- $(export_once x "$file" "$tmp/cache")
        printf '%-16s %-6s %8s %8s %12s %12s %12s %12s\n' "${file%.ir}" "$r" "$kernels" "$modules" "$cold" "$coldw" "$1" "$2"
        echo "${file%.ir} $cold $coldw $1 $2" >>"$tmp/rows"
        r=$((r + 1))
    done
done
for file in char_gpt mlp_classifier; do
    awk -v f="$file" '$1 == f' "$tmp/rows" | sort -n -k2 |
        awk -v f="$file" -v a="$archs" '{c[NR] = $2; cw[NR] = $3} END {m = int((NR + 1) / 2);
            printf "%-16s median cold %s ms (wall %s ms) for %s\n", f, c[m], cw[m], a}'
    awk -v f="$file" '$1 == f' "$tmp/rows" | sort -n -k4 |
        awk -v f="$file" '{w[NR] = $4; ww[NR] = $5} END {m = int((NR + 1) / 2);
            printf "%-16s median warm %s ms (wall %s ms)\n", f, w[m], ww[m]}'
done
