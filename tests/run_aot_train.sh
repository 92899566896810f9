#!/bin/sh
# run_aot_train.sh - meson test of the AOT path end to end: alloyc compile makes mlp_classifier.ir's f16 AdamW
# training step into a bundle, examples/aot_train (linked against liballoy-runtime alone) trains 60 steps from it on
# mlp_csv's synthetic data, and alloyc train runs the same IR through the JIT on the same batches: the progress lines
# (loss, scale, skipped) and the final state (every parameter, moment and counter) must be the same bits.
#
# usage: run_aot_train.sh ALLOYC AOT_TRAIN COMPARE RUNTIME_ONLY IR_DIR OUT_DIR
#   COMPARE: tests/compare_safetensors; RUNTIME_ONLY: tests/bundle_runtime_only (every call of alloy/bundle.h)
set -u
alloyc=$1 aot=$2 compare=$3 only=$4 irdir=$5 tmp=$6/aot_train
rm -rf "$tmp" && mkdir -p "$tmp" || exit 1
ALLOY_DEVICE=cpu
export ALLOY_DEVICE
failures=0
ir=$irdir/mlp_classifier.ir steps=60

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

# the step line's fields both programs print: "step S loss L scale X skipped K"
steps() { sed -n 's/^\(step [0-9]* loss [^ ]* scale [^ ]* skipped [0-9]*\).*/\1/p' "$1"; }

# 1. the bundle (no GPU, no NVRTC)
"$alloyc" compile "$ir" --train --amp=f16 --scaler=dynamic --optimizer=adamw --seed 7 -o "$tmp/step.alloy" \
    >"$tmp/compile.out" 2>&1
check "alloyc compile writes the bundle" [ -s "$tmp/step.alloy" ]
check "alloyc compile says so" grep -q "^wrote $tmp/step.alloy$" "$tmp/compile.out"

# 2. trained from the bundle by the runtime-only program
"$aot" "$tmp/step.alloy" --steps $steps --log-every 1 --save-feeds "$tmp/feeds.safetensors" \
    --save-state "$tmp/aot_state.safetensors" >"$tmp/aot.out" 2>"$tmp/aot.err"
check "aot_train runs" [ $? -eq 0 ] && [ ! -s "$tmp/aot.err" ]
check "aot_train prints its header" grep -q "^bundle $tmp/step.alloy: batch 64, 17 state tensors; data: synthetic shells, 1600 training rows$" "$tmp/aot.out"
steps "$tmp/aot.out" >"$tmp/aot.steps"
check "aot_train prints $steps step lines" [ "$(wc -l <"$tmp/aot.steps")" -eq $steps ]

# 3. the JIT: the same IR, flags and batches through alloyc train
"$alloyc" train "$ir" --feed "$tmp/feeds.safetensors" --steps $steps --amp=f16 --scaler=dynamic \
    --optimizer=adamw --seed 7 --log-every 1 --checkpoint "$tmp/jit_state.safetensors" >"$tmp/jit.out" 2>"$tmp/jit.err"
check "alloyc train runs" [ $? -eq 0 ] && [ ! -s "$tmp/jit.err" ]
steps "$tmp/jit.out" >"$tmp/jit.steps"
check "the bundle's losses, scales and skipped counts are the JIT's, every step" diff "$tmp/jit.steps" "$tmp/aot.steps"
check "the final state is the JIT's, bit for bit" sh -c "\"$compare\" \"$tmp/jit_state.safetensors\" \"$tmp/aot_state.safetensors\" 0 >\"$tmp/compare.out\" || { cat \"$tmp/compare.out\"; exit 1; }"
check "the state files are the same bytes" cmp "$tmp/jit_state.safetensors" "$tmp/aot_state.safetensors"
# it trains: the mean loss of the last 10 steps is below that of the first 10
check "the loss falls" awk '$1 == "step" { n++; if (n <= 10) a += $4; if (n > '$steps' - 10) b += $4 } END { exit !(b < a) }' "$tmp/aot.steps"

# 4. the program needs the runtime library, not the compiler's
needed=$(readelf -d "$aot" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')
check "aot_train links liballoy-runtime.so.0 ($needed)" sh -c "echo '$needed' | grep -q 'liballoy-runtime.so.0'"
check "aot_train does not link liballoy.so.0" sh -c "! echo '$needed' | grep -q 'liballoy.so'"

# 5. a program that includes alloy/bundle.h alone makes every call of it through liballoy-runtime alone
"$only" "$tmp/step.alloy" "$tmp/only_state.safetensors" >"$tmp/only.out" 2>&1
check "bundle_runtime_only: $(tail -1 "$tmp/only.out")" [ $? -eq 0 ]
check "bundle_runtime_only links liballoy-runtime alone" sh -c "readelf -d '$only' | grep -q 'liballoy-runtime.so.0' && ! readelf -d '$only' | grep -q 'liballoy.so'"

# 6. a damaged bundle is the reader's error, one line, exit 1
head -c 100 "$tmp/step.alloy" >"$tmp/short.alloy"
"$aot" "$tmp/short.alloy" --steps 1 >/dev/null 2>"$tmp/short.err"
check "a truncated bundle exits 1" [ $? -eq 1 ]
check "and says where: $(cat "$tmp/short.err")" grep -q "^aot_train: $tmp/short.alloy: truncated: the header gives [0-9]* payload bytes, the file has 20$" "$tmp/short.err"

# 7. --with-state: the bundle carries its initial state (the seed's, here), and the runtime starts from it: the
#    same steps; without a bundle, or on another command, a usage error
"$alloyc" compile "$ir" --train --amp=f16 --scaler=dynamic --optimizer=adamw --seed 7 --with-state \
    -o "$tmp/state.alloy" >/dev/null 2>&1
check "alloyc compile --with-state writes a larger bundle ($(wc -c <"$tmp/state.alloy") bytes)" \
    [ "$(wc -c <"$tmp/state.alloy")" -gt "$(wc -c <"$tmp/step.alloy")" ]
"$aot" "$tmp/state.alloy" --steps 5 --log-every 1 >"$tmp/state.out" 2>&1
steps "$tmp/state.out" >"$tmp/state.steps"
head -5 "$tmp/aot.steps" >"$tmp/aot5.steps"
check "and trains from it as from the seed" diff "$tmp/aot5.steps" "$tmp/state.steps"
"$alloyc" compile "$ir" --train --with-state --arch sm_80 -o "$tmp/dir" >/dev/null 2>"$tmp/ws.err"
check "--with-state without a bundle: $(cat "$tmp/ws.err")" grep -q "with-state is for bundles" "$tmp/ws.err"

# 8. the device in liballoy-runtime, which has the CUDA backend without its compiler: a bundle compiled with no
#    device set runs with device=auto everywhere (on a GPU its CPU-only step falls back to the CPU), giving the
#    CPU's losses; device=cuda is the device's error without a GPU, the runtime's refusal to compile with one
ALLOY_DEVICE=auto "$alloyc" compile "$ir" --train --amp=f16 --scaler=dynamic --optimizer=adamw --seed 7 \
    -o "$tmp/auto.alloy" >/dev/null 2>&1
ALLOY_DEVICE=auto "$aot" "$tmp/auto.alloy" --steps 5 --log-every 1 >"$tmp/auto.out" 2>"$tmp/auto.err"
check "device=auto runs a bundle compiled with no device" [ $? -eq 0 ] && [ ! -s "$tmp/auto.err" ]
steps "$tmp/auto.out" >"$tmp/auto.steps"
check "with the CPU's losses" diff "$tmp/aot5.steps" "$tmp/auto.steps"
ALLOY_DEVICE=cuda "$aot" "$tmp/auto.alloy" --steps 1 >/dev/null 2>"$tmp/cuda.err"
rc=$?
check "device=cuda with no GPU or no images exits 1: $(cat "$tmp/cuda.err")" sh -c "[ $rc -eq 1 ] && grep -Eq 'device cuda: |cuda: graph .*liballoy-runtime runs a bundle.s CUDA images only' '$tmp/cuda.err'"

# 9. on a GPU (nvidia-smi names its compute capability): the step compiled with --arch for it runs on it
#    through liballoy-runtime (cubins loaded, no NVRTC in the library) with the JIT's losses and state bit for bit
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
if [ -n "$cc" ]; then
    ALLOY_DEVICE=cuda
    "$alloyc" compile "$ir" --train --amp=f16 --scaler=dynamic --optimizer=adamw --seed 7 --arch "sm_$cc" \
        -o "$tmp/gpu.alloy" >"$tmp/gpu_compile.out" 2>&1
    check "alloyc compile --arch sm_$cc: $(tail -1 "$tmp/gpu_compile.out")" [ -s "$tmp/gpu.alloy" ]
    "$aot" "$tmp/gpu.alloy" --steps $steps --log-every 1 --save-feeds "$tmp/gfeeds.safetensors" \
        --save-state "$tmp/gaot_state.safetensors" >"$tmp/gaot.out" 2>"$tmp/gaot.err"
    rc=$?
    check "aot_train runs the bundle on the GPU: $(head -c 300 "$tmp/gaot.err")" [ $rc -eq 0 ] && [ ! -s "$tmp/gaot.err" ]
    "$alloyc" train "$ir" --feed "$tmp/gfeeds.safetensors" --steps $steps --amp=f16 --scaler=dynamic \
        --optimizer=adamw --seed 7 --log-every 1 --checkpoint "$tmp/gjit_state.safetensors" >"$tmp/gjit.out" 2>"$tmp/gjit.err"
    check "alloyc train runs on the GPU: $(head -c 300 "$tmp/gjit.err")" grep -q "device cuda" "$tmp/gjit.out"
    steps "$tmp/gaot.out" >"$tmp/gaot.steps"
    steps "$tmp/gjit.out" >"$tmp/gjit.steps"
    check "on the GPU the bundle's $steps steps are the JIT's" sh -c "[ -s '$tmp/gaot.steps' ] && diff '$tmp/gjit.steps' '$tmp/gaot.steps'"
    check "and the final state, bit for bit" cmp "$tmp/gjit_state.safetensors" "$tmp/gaot_state.safetensors"
    ALLOY_DEVICE=cpu
else
    echo "skip: no GPU (nvidia-smi names none): the GPU run of a bundle through liballoy-runtime"
fi

[ $failures -eq 0 ] && echo "aot_train: the bundle trains as the JIT graph ($steps steps, state bit for bit)"
exit $((failures > 0))
