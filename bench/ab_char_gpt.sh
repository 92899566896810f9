#!/bin/sh
# ab_char_gpt.sh A B [ROUNDS] [STEPS] [AMP]: char_gpt from two builds (paths to their char_gpt
# binaries, e.g. an older commit's build and this one), run alternately ROUNDS times each
# (default 5) for STEPS steps (default 60) with --amp AMP (default f16), same threads;
# prints the mean tokens/s of each run over its steps after the 10th (compile and warm-up
# excluded) and the B/A ratio of the medians. The machines are shared: interleaving makes
# both sides see the same noise.
set -eu
a=$1 b=$2 rounds=${3:-5} steps=${4:-60} amp=${5:-f16}
tmp=${TMPDIR:-/tmp}/ab_char_gpt.$$
trap 'rm -f "$tmp".*' EXIT
rate() { # binary -> mean tok/s after step 10
    "$1" --steps "$steps" --amp "$amp" --log-every 1 --eval-every 0 >"$tmp.log" 2>&1
    awk '/^step / && $2 > 10 { s += $10; n++ } END { printf "%.0f\n", s / n }' "$tmp.log"
}
printf '%-6s %12s %12s\n' round "A tok/s" "B tok/s"
i=1
while [ "$i" -le "$rounds" ]; do
    ra=$(rate "$a"); rb=$(rate "$b")
    printf '%-6s %12s %12s\n' "$i" "$ra" "$rb"
    echo "$ra" >>"$tmp.a"; echo "$rb" >>"$tmp.b"
    i=$((i + 1))
done
ma=$(sort -n "$tmp.a" | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
mb=$(sort -n "$tmp.b" | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
printf '%-6s %12s %12s   B/A %.3f\n' median "$ma" "$mb" "$(echo "$mb $ma" | awk '{print $1 / $2}')"
