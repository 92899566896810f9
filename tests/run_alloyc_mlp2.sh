#!/bin/sh
# run_alloyc_mlp2.sh - meson tests of the alloyc driver: mlp2.ir against its NumPy reference, and the driver's error exits.
#
# usage: run_alloyc_mlp2.sh mlp2   ALLOYC COMPARE DATA_DIR OUT_DIR
#        run_alloyc_mlp2.sh errors ALLOYC DATA_DIR OUT_DIR
set -u

mode=$1
alloyc=$2

if [ "$mode" = mlp2 ]; then
    compare=$3 data=$4 out=$5/mlp2_out.safetensors
    rm -f "$out"
    "$alloyc" run "$data/mlp2.ir" --feed "$data/mlp2_feeds.safetensors" \
        --params "$data/mlp2_params.safetensors" --out "$out" || exit 1
    # f32 kernels against float64 NumPy rounded once: a few f32 ulps of |y|max
    exec "$compare" "$data/mlp2_expected.safetensors" "$out" 1e-5
fi

# errors: each misuse must exit with its status and one 'alloyc: ' line on stderr
data=$3 tmp=$4/alloyc_errors
mkdir -p "$tmp" || exit 1
failures=0
# expect STATUS PATTERN ARGS...: runs alloyc ARGS, checks status and stderr
expect() {
    want=$1 pattern=$2
    shift 2
    "$alloyc" "$@" >"$tmp/stdout" 2>"$tmp/stderr"
    got=$?
    lines=$(wc -l <"$tmp/stderr")
    if [ "$got" -ne "$want" ] || [ "$lines" -ne 1 ] || ! grep -q "^alloyc: .*$pattern" "$tmp/stderr"; then
        echo "FAIL: alloyc $* -> exit $got (want $want), stderr:"
        cat "$tmp/stderr"
        failures=$((failures + 1))
    else
        echo "ok:   alloyc $* -> $got: $(cat "$tmp/stderr")"
    fi
}
# expect_capped STATUS PATTERN ARGS...: as expect, in at most 30 s and (unless
# alloyc is built with ASan, which reserves terabytes of address space) 4 GiB
# of address space: a reader without a size cap fails here, not the machine
memcap=4194304
if ldd "$alloyc" 2>/dev/null | grep -q libasan; then memcap=; fi
expect_capped() {
    want=$1 pattern=$2
    shift 2
    (if [ -n "$memcap" ]; then ulimit -v "$memcap"; fi; exec timeout 30 "$alloyc" "$@") >"$tmp/stdout" 2>"$tmp/stderr"
    got=$?
    if [ "$got" -ne "$want" ] || [ "$(wc -l <"$tmp/stderr")" -ne 1 ] || ! grep -q "^alloyc: .*$pattern" "$tmp/stderr"; then
        echo "FAIL: alloyc $* (capped) -> exit $got (want $want), stderr:"
        head -c 2000 "$tmp/stderr"
        failures=$((failures + 1))
    else
        echo "ok:   alloyc $* (capped) -> $got: $(cat "$tmp/stderr")"
    fi
}
ir=$data/mlp2.ir feeds=$data/mlp2_feeds.safetensors params=$data/mlp2_params.safetensors
printf 'graph bad {\n  %%x = input : f32[2,3]\n  %%y = relu(%%z) : f32[2,3]\n}\n' >"$tmp/bad.ir"
printf 'graph small {\n  %%x = input : f32[2,2]\n  %%y = relu(%%x) : f32[2,2]\n  output "y" = %%y\n}\n' >"$tmp/small.ir"
printf 'graph noout {\n  %%x = input : f32[8,16]\n  %%y = relu(%%x) : f32[8,16]\n}\n' >"$tmp/noout.ir"
printf 'graph init {\n  %%w = param {init="nromal", std=0.02} : f32[4]\n  output "w" = %%w\n}\n' >"$tmp/bad_init.ir"
printf 'graph wide {\n  %%x = input : f64[8,16]\n  %%y = relu(%%x) : f64[8,16]\n  output "y" = %%y\n}\n' >"$tmp/wide.ir"

expect 2 "no command given"
expect 2 "unknown command 'frobnicate'" frobnicate "$ir"
expect 2 "unknown option '--bogus'" run "$ir" --bogus --out "$tmp/o.safetensors"
expect 2 "needs --out" run "$ir" --feed "$feeds"
expect 2 "--params needs a value" run "$ir" --out "$tmp/o.safetensors" --params
expect 2 "--seed wants an integer" run "$ir" --seed -3 --out "$tmp/o.safetensors"
expect 2 "option of 'run'" print "$ir" --out "$tmp/o.safetensors"
expect 1 "nonexistent.ir: cannot open" print "$tmp/nonexistent.ir"
expect_capped 1 "/dev/zero: more than the 268435456 bytes (256 MiB) an IR file may have" print /dev/zero
expect_capped 1 "/dev/zero: more than the 268435456 bytes (256 MiB) an IR file may have" run /dev/zero --out "$tmp/o.safetensors"
rm -f "$tmp/huge.ir" && truncate -s 300M "$tmp/huge.ir" # sparse: no disk used
expect_capped 1 "huge.ir: 314572800 bytes, more than the 268435456 (256 MiB) an IR file may have" print "$tmp/huge.ir"
rm -f "$tmp/huge.ir"
expect 1 "alloyc_errors: is a directory" print "$tmp"
expect_capped 1 "/dev/zero: cannot read: it is a character device, not a regular file" run "$ir" --feed /dev/zero --out "$tmp/o.safetensors"
expect 1 "bad.ir:3:" print "$tmp/bad.ir"
expect 1 "bad.ir:3:" run "$tmp/bad.ir" --out "$tmp/o.safetensors"
expect 1 "bad_init.ir:2:8: param() 'w': unknown init \"nromal\" (zeros, ones, constant, normal, uniform," run "$tmp/bad_init.ir" --out "$tmp/o.safetensors"
expect 1 "--print-after=fsue: unknown pass 'fsue' (passes: verify, random, lower_norm, attention, amp," print "$ir" --print-after=fsue
expect 1 "disable_passes=grad_scaler: the graph trains with a dynamic loss scaler" \
    print --train --amp=f16 --scaler=dynamic --optimizer=sgd --set disable_passes=grad_scaler "$data/../golden/mlp_step.ir"
expect 1 "missing.safetensors" run "$ir" --feed "$tmp/missing.safetensors" --out "$tmp/o.safetensors"
expect 1 "no tensor named 'q'" run "$ir" --feed "q=$feeds" --out "$tmp/o.safetensors"
expect 1 "input 'x' was not fed" run "$ir" --params "$params" --out "$tmp/o.safetensors"
expect 1 "no tensor in it is named like an input" run "$ir" --feed "$params" --out "$tmp/o.safetensors"
expect 1 "input is f32\[2,2\], fed f32\[8,16\]" run "$tmp/small.ir" --feed "$feeds" --out "$tmp/o.safetensors"
expect 1 "input is f64\[8,16\], fed f32\[8,16\]" run "$tmp/wide.ir" --feed "x=$feeds" --out "$tmp/o.safetensors"
expect 1 "declares no output" run "$tmp/noout.ir" --feed "$feeds" --out "$tmp/o.safetensors"
expect 2 "input 'x' is fed twice" run "$ir" --feed "$feeds" --feed "x=$feeds" --out "$tmp/o.safetensors"
expect 1 "no output or named node" run "$ir" --feed "$feeds" --fetch nope --out "$tmp/o.safetensors"
expect 1 "--params .*mlp2_feeds.safetensors: 1 tensor in it names no parameter or running statistic of .*mlp2.ir: 'x'" run "$ir" --feed "$feeds" --params "$feeds" --out "$tmp/o.safetensors"

# and the happy paths: help, version, print, run with defaults and --fetch
for args in "--help" "--version" "print $ir" "run $ir --feed $feeds --seed 7 --fetch h --fetch y --out $tmp/o.safetensors"; do
    # shellcheck disable=SC2086
    if ! "$alloyc" $args >"$tmp/stdout" 2>"$tmp/stderr" || [ -s "$tmp/stderr" ]; then
        echo "FAIL: alloyc $args"
        cat "$tmp/stderr"
        failures=$((failures + 1))
    else
        echo "ok:   alloyc $args"
    fi
done
[ "$failures" -eq 0 ] || { echo "$failures alloyc checks failed"; exit 1; }
echo "all alloyc checks passed"
