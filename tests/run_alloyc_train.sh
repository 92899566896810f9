#!/bin/sh
# run_alloyc_train.sh - meson test of alloyc train and alloyc run --fetch grad:NAME on train_mlp.ir: losses against
# PyTorch and against the same training through the C API, a resumed run against an uninterrupted one, gradients
# against torch.autograd, and the errors of bad flags, feeds and checkpoints.
#
# usage: run_alloyc_train.sh ALLOYC REFERENCE COMPARE DATA_DIR OUT_DIR
#   REFERENCE: tests/alloyc_train_reference (the training through the C API); COMPARE: compare_safetensors
set -u

alloyc=$1 reference=$2 compare=$3 data=$4 tmp=$5/alloyc_train
rm -rf "$tmp" && mkdir -p "$tmp" || exit 1
ALLOY_DEVICE=cpu
export ALLOY_DEVICE
failures=0
ir=$data/train_mlp.ir feeds=$data/train_mlp_feeds.safetensors params=$data/train_mlp_params.safetensors
batch0=$data/train_mlp_batch0.safetensors

# check NAME COMMAND...: runs a shell command, counts a failure when it fails
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

# train OUT ARGS...: alloyc train ARGS with stdout to OUT; fails on a non-zero exit or any stderr
train() {
    out=$1
    shift
    if ! "$alloyc" train "$@" >"$out" 2>"$tmp/stderr" || [ -s "$tmp/stderr" ]; then
        echo "alloyc train $* failed:"
        cat "$tmp/stderr"
        return 1
    fi
}

# steps FILE: its progress lines without the rate and lr fields ("step S loss L scale X skipped K")
steps() {
    sed -n 's/^\(step [0-9]* loss [^ ]* scale [^ ]* skipped [0-9]*\) .*/\1/p' "$1"
}

# same_losses EXPECTED ACTUAL TOL: the 'step S loss L' lines of both, S equal and L within TOL relative
same_losses() {
    awk -v tol="$3" '
        FNR == NR { if ($1 == "step") want[$2] = $4; next }
        $1 == "step" && ($2 in want) {
            seen++
            d = $4 - want[$2]; if (d < 0) d = -d
            m = want[$2] < 0 ? -want[$2] : want[$2]
            if (d > tol * m) { printf "step %s: loss %s, expected %s\n", $2, $4, want[$2]; bad++ }
        }
        END { n = 0; for (k in want) n++; if (seen != n) { printf "%d of %d steps printed\n", seen, n; bad++ } exit bad > 0 }
    ' "$1" "$2"
}

# expect STATUS PATTERN ARGS...
expect() {
    want=$1 pattern=$2
    shift 2
    "$alloyc" "$@" >"$tmp/stdout" 2>"$tmp/stderr"
    got=$?
    if [ "$got" -ne "$want" ] || [ "$(wc -l <"$tmp/stderr")" -ne 1 ] || ! grep -q "^alloyc: .*$pattern" "$tmp/stderr"; then
        echo "FAIL: alloyc $* -> exit $got (want $want), stderr:"
        cat "$tmp/stderr"
        failures=$((failures + 1))
    else
        echo "ok:   alloyc $* -> $got: $(cat "$tmp/stderr")"
    fi
}

# 1. fp32 AdamW: PyTorch's losses step for step (f32 on both sides, GEMM sums in another order: 1e-5)
train "$tmp/f32.out" "$ir" --feed "$feeds" --params "$params" --steps 12 --optimizer=adamw --lr 3e-3 --log-every 1
check "train f32 runs" [ $? -eq 0 ]
check "train f32: PyTorch's AdamW losses (train_mlp_losses.txt) within 1e-5" same_losses "$data/train_mlp_losses.txt" "$tmp/f32.out" 1e-5
check "train f32: header names the batches, optimizer, precision, device" \
    grep -q "^train .*train_mlp.ir: 4 batches from .*train_mlp_feeds.safetensors; adamw lr 0.003 weight_decay 0.01; amp off, scaler none; device cpu$" "$tmp/f32.out"
check "train f32: parameters line" grep -q "^parameters from .*train_mlp_params.safetensors: 4 loaded$" "$tmp/f32.out"
check "train f32: samples/s and lr on each line" [ "$(grep -c '^step [0-9]* loss .* samples/s [0-9]* lr 0.003$' "$tmp/f32.out")" -eq 12 ]

# 2. f16 AMP with the dynamic scaler: the C API's lines exactly, skipped steps included
"$reference" "$feeds" "$params" 12 >"$tmp/reference.out" || { echo "FAIL: alloyc_train_reference"; exit 1; }
train "$tmp/f16.out" "$ir" --feed "x=$feeds" --feed "labels=$feeds" --params "$params" --steps 12 --amp=f16 \
    --optimizer=adamw --lr 3e-3 --log-every 1
steps "$tmp/f16.out" >"$tmp/f16.steps"
check "train f16: the C API's losses, scales and skipped counts" diff "$tmp/reference.out" "$tmp/f16.steps"
check "train f16: the run skips steps (the scaler path is covered)" grep -q "skipped [1-9]" "$tmp/f16.steps"
check "train f16: 12 lines" [ "$(wc -l <"$tmp/f16.steps")" -eq 12 ]

# 3. resumed: 5 steps, then 7 more from the checkpoint = the uninterrupted 12, and the same checkpoint bytes
ck=$tmp/ck.safetensors full=$tmp/full.safetensors
train "$tmp/first.out" "$ir" --feed "$feeds" --params "$params" --steps 5 --amp=f16 --lr 3e-3 --log-every 1 --checkpoint "$ck"
train "$tmp/second.out" "$ir" --feed "$feeds" --params "$params" --steps 7 --amp=f16 --lr 3e-3 --log-every 1 --checkpoint "$ck"
cat "$tmp/first.out" "$tmp/second.out" >"$tmp/resumed.out"
steps "$tmp/resumed.out" >"$tmp/resumed.steps"
check "resume: steps 1-5 then 6-12 give the uninterrupted lines" diff "$tmp/reference.out" "$tmp/resumed.steps"
check "resume: says where it resumed" grep -q "^resumed from .*ck.safetensors at step 5 (--params not read" "$tmp/second.out"
check "resume: saved lines" sh -c "grep -q '^saved .*ck.safetensors at step 5$' '$tmp/first.out' && grep -q '^saved .*ck.safetensors at step 12$' '$tmp/second.out'"
train "$tmp/full.out" "$ir" --feed "$feeds" --params "$params" --steps 12 --amp=f16 --lr 3e-3 --checkpoint "$full" --save-every 4
check "resume: the checkpoint equals the uninterrupted run's byte for byte" cmp "$ck" "$full"
check "--save-every 4: saved at steps 4, 8 and 12" [ "$(grep '^saved ' "$tmp/full.out" | sed 's/.* at step //' | tr '\n' ' ')" = "4 8 12 " ]
check "--log-every 10 (default 10): lines at steps 10 and 12" [ "$(sed -n 's/^step \([0-9]*\) .*/\1/p' "$tmp/full.out" | tr '\n' ' ')" = "10 12 " ]
check "no temporary files left" [ "$(ls "$tmp" | grep -c tmp)" -eq 0 ]

# 4. one batch fed whole every step: step 1 is PyTorch's step 1 (batch 0), the loss then falls on that batch
train "$tmp/same.out" "$ir" --feed "$batch0" --params "$params" --steps 12 --lr 3e-3 --log-every 1 --optimizer=adamw
check "same batch: header" grep -q "the same batch every step" "$tmp/same.out"
head -2 "$data/train_mlp_losses.txt" >"$tmp/first_loss.txt"
check "same batch: step 1 is PyTorch's" same_losses "$tmp/first_loss.txt" "$tmp/same.out" 1e-5
check "same batch: the loss falls" awk '$1 == "step" { if ($2 == 1) a = $4; if ($2 == 12) b = $4 } END { exit !(b < a) }' "$tmp/same.out"
# --loss naming the IR's own loss trains the same
train "$tmp/named.out" "$ir" --feed "$batch0" --params "$params" --steps 12 --lr 3e-3 --log-every 1 --loss loss
steps "$tmp/same.out" >"$tmp/same.steps"
steps "$tmp/named.out" >"$tmp/named.steps"
check "--loss loss: the same lines" diff "$tmp/same.steps" "$tmp/named.steps"

# 5. alloyc run --fetch grad:NAME: torch.autograd's float64 gradients (f32 sums: 1e-6 of the largest)
"$alloyc" run "$ir" --feed "$batch0" --params "$params" --fetch grad:w1 --fetch grad:b1 --fetch grad:w2 --fetch grad:b2 \
    --fetch grad:x --fetch loss --out "$tmp/grads.safetensors" >"$tmp/run.out" 2>"$tmp/stderr"
check "run --fetch grad:NAME runs" [ $? -eq 0 ]
check "run --fetch grad:NAME: nothing on stderr" [ ! -s "$tmp/stderr" ]
check "run --fetch grad:NAME: torch.autograd's gradients within 1e-6" "$compare" "$data/train_mlp_grads.safetensors" "$tmp/grads.safetensors" 1e-6

# 6. --params (run and train alike, strict as PyTorch's load_state_dict(strict=True)) and --save-params with a
# PyTorch BatchNorm2d + Linear state_dict (tests/data/torch_bn*.safetensors, make_torch_batchnorm_reference.py):
# the running statistics load, num_batches_tracked is accepted, the eval logits match, and the file train
# writes with --save-params loads strictly again
bn_body='  %x = input : f32[4,3,2,2]
  %bn.running_mean = state {init="zeros"} : f32[3]
  %bn.running_var = state {init="ones"} : f32[3]
  %bn.weight = param {init="ones"} : f32[3]
  %bn.bias = param {init="zeros"} : f32[3]
  %bn = batch_norm(%x, %bn.running_mean, %bn.running_var, %bn.weight, %bn.bias) {eps=1e-5, momentum=0.1} : f32[4,3,2,2]
  %h = reshape(%bn) : f32[4,12]
  %fc.weight = param {init="zeros"} : f32[2,12]
  %fc.bias = param {init="zeros"} : f32[2]
  %y0 = matmul(%h, %fc.weight) {transpose_b=true} : f32[4,2]
  %y = add(%y0, %fc.bias) : f32[4,2]
  output "y" = %y'
printf 'graph bn {\n%s\n}\n' "$bn_body" >"$tmp/bn.ir"
printf 'graph bn {\n%s\n  %%l = reduce_mean(%%y) {axes=[0, 1], keepdims=false} : f32[]\n  loss %%l\n}\n' "$bn_body" >"$tmp/bn_train.ir"
"$alloyc" run "$tmp/bn.ir" --feed "$data/torch_bn_io.safetensors" --params "$data/torch_bn.safetensors" \
    --fetch x --fetch y --out "$tmp/bn_y.safetensors" >/dev/null 2>"$tmp/stderr"
rc=$?
check "run --params: a PyTorch BatchNorm2d state_dict loads strictly" [ "$rc" -eq 0 ]
check "run --params: nothing on stderr" [ ! -s "$tmp/stderr" ]
check "run --params: the eval logits within 1e-6" "$compare" "$data/torch_bn_io.safetensors" "$tmp/bn_y.safetensors" 1e-6
train "$tmp/bn.out" "$tmp/bn_train.ir" --feed "$data/torch_bn_io.safetensors" --params "$data/torch_bn.safetensors" \
    --steps 2 --optimizer=sgd --lr 0.1 --save-params "$tmp/bn_saved.safetensors"
check "train --params: the state_dict's six tensors load" grep -q "^parameters from .*torch_bn.safetensors: 6 loaded$" "$tmp/bn.out"
check "train --save-params says so" grep -q "^saved the parameters to .*bn_saved.safetensors$" "$tmp/bn.out"
"$alloyc" run "$tmp/bn.ir" --feed "$data/torch_bn_io.safetensors" --params "$tmp/bn_saved.safetensors" \
    --out "$tmp/bn_y2.safetensors" >/dev/null 2>"$tmp/stderr"
rc=$?
check "run --params: the file --save-params wrote loads strictly" [ "$rc" -eq 0 ]
check "run --params of the saved file: nothing on stderr" [ ! -s "$tmp/stderr" ]
expect 1 "--params .*train_mlp_params.safetensors: 4 tensors in it name no parameter or running statistic of .*bn.ir: '" \
    run "$tmp/bn.ir" --feed "$data/torch_bn_io.safetensors" --params "$params" --out "$tmp/o.safetensors"
expect 1 "--params .*bn_y.safetensors: 2 tensors in it name no parameter or running statistic of .*bn.ir: '" \
    run "$tmp/bn.ir" --feed "$data/torch_bn_io.safetensors" --params "$tmp/bn_y.safetensors" --out "$tmp/o.safetensors"
"$alloyc" run "$tmp/bn.ir" --feed "$data/torch_bn_io.safetensors" --params "$data/torch_bn.safetensors" \
    --fetch bn.weight --out "$tmp/bn_part.safetensors" >/dev/null 2>&1 || failures=$((failures + 1))
expect 1 "--params .*bn_part.safetensors: it has no tensor for 5 of the parameters and running statistics of .*bn.ir: 'bn.running_mean', 'bn.running_var', 'bn.bias', \.\.\." \
    run "$tmp/bn.ir" --feed "$data/torch_bn_io.safetensors" --params "$tmp/bn_part.safetensors" --out "$tmp/o.safetensors"

# 7. bad input: exit status and one 'alloyc: ' line on stderr naming the flag, file or tensor
# tensors of any shape, written by alloyc run from params: 4 batches of x, 3 of labels
printf 'graph odd {\n  %%x = param {init="ones"} : f32[4,8,4]\n  %%labels = param {init="zeros"} : i32[3,8]\n  output "x" = %%x\n  output "labels" = %%labels\n}\n' >"$tmp/odd.ir"
"$alloyc" run "$tmp/odd.ir" --out "$tmp/odd.safetensors" >/dev/null || failures=$((failures + 1))
"$alloyc" train "$ir" --feed "$feeds" --steps 1 --checkpoint "$tmp/adamw.safetensors" >/dev/null || failures=$((failures + 1))

expect 2 "train needs --steps N" train "$ir" --feed "$feeds"
expect 2 "--steps wants a whole number from 1 to 1000000000, got '0'" train "$ir" --feed "$feeds" --steps 0
expect 2 "--steps wants a whole number from 1 to 1000000000, got '1e3'" train "$ir" --feed "$feeds" --steps 1e3
expect 2 "--optimizer wants sgd, adam or adamw, got 'lion'" train "$ir" --feed "$feeds" --steps 1 --optimizer=lion
expect 2 "--lr wants a finite number >= 0, got 'fast'" train "$ir" --feed "$feeds" --steps 1 --lr fast
expect 2 "--lr wants a finite number >= 0, got '-0.1'" train "$ir" --feed "$feeds" --steps 1 --lr -0.1
expect 2 "--lr wants a finite number >= 0, got 'nan'" train "$ir" --feed "$feeds" --steps 1 --lr nan
expect 2 "--lr wants a finite number >= 0, got '1e999'" train "$ir" --feed "$feeds" --steps 1 --lr 1e999
expect 2 "--lr is given twice" train "$ir" --feed "$feeds" --steps 1 --lr 1 --lr 2
expect 2 "--weight-decay wants a finite number >= 0, got 'inf'" train "$ir" --feed "$feeds" --steps 1 --weight-decay inf
expect 2 "--momentum is a setting of --optimizer=sgd, not adam" train "$ir" --feed "$feeds" --steps 1 --optimizer=adam --momentum 0.9
expect 2 "--momentum is a setting of --optimizer=sgd (train's default optimizer is adamw)" train "$ir" --feed "$feeds" --steps 1 --momentum 0.9
expect 2 "--scaler static:SCALE wants a finite number > 0, got 'static:big'" train "$ir" --feed "$feeds" --steps 1 --scaler=static:big
expect 2 "--save-every needs --checkpoint FILE" train "$ir" --feed "$feeds" --steps 1 --save-every 2
expect 2 "--log-every wants a whole number from 1 to 1000000000, got '-1'" train "$ir" --feed "$feeds" --steps 1 --log-every -1
expect 2 "--fetch is an option of 'run', not 'train'" train "$ir" --feed "$feeds" --steps 1 --fetch loss
expect 2 "--checkpoint is an option of 'train', not 'run'" run "$ir" --feed "$batch0" --checkpoint "$ck" --out "$tmp/o.safetensors"
expect 2 "--lr needs --optimizer" print "$ir" --train --lr 0.1
expect 2 "input 'x' is fed twice" train "$ir" --feed "$feeds" --feed "x=$batch0" --steps 1
expect 2 "unknown command 'trian' (commands: print, run, compile, train, cost, amp-report)" trian "$ir"
expect 1 "missing.safetensors" train "$ir" --feed "$tmp/missing.safetensors" --steps 1
expect 1 "input 'labels' of .*train_mlp.ir is not fed (give --feed labels=FILE, or a --feed FILE holding a tensor named 'labels')" \
    train "$ir" --feed "x=$feeds" --steps 1
expect 1 "mlp2_feeds.safetensors: tensor 'x' is f32\[8,16\]; input 'x' of .*train_mlp.ir takes f32\[8,4\] (the same batch every step) or f32\[B,8,4\] (B batches, one per step in turn)" \
    train "$ir" --feed "x=$data/mlp2_feeds.safetensors" --feed "labels=$feeds" --steps 1
expect 1 "odd.safetensors: tensor 'labels' holds 3 batches, the first batched feed (from .*odd.safetensors) 4; batched feeds must hold the same number" \
    train "$ir" --feed "$tmp/odd.safetensors" --steps 1
expect 1 "--feed nope=.*: 'nope' is not an input of .*train_mlp.ir (inputs: 'x', 'labels')" train "$ir" --feed "nope=$feeds" --steps 1
expect 1 "mlp2_params.safetensors: no tensor in it is named like an input of .*train_mlp.ir (inputs: 'x', 'labels')" \
    train "$ir" --feed "$data/mlp2_params.safetensors" --steps 1
expect 1 "mlp2.ir has no 'loss' line to train on; name the loss node with --loss NAME" \
    train "$data/mlp2.ir" --feed "$data/mlp2_feeds.safetensors" --steps 1
expect 1 "--loss nope: .*train_mlp.ir has no node named 'nope'" train "$ir" --feed "$feeds" --steps 1 --loss nope
expect 1 "--loss logits: the loss must be a floating-point scalar" train "$ir" --feed "$feeds" --steps 1 --loss logits
expect 1 "--params .*odd.safetensors: 2 tensors in it name no parameter or running statistic of .*train_mlp.ir: '" \
    train "$ir" --feed "$feeds" --steps 1 --params "$tmp/odd.safetensors"
expect 1 "--params .*bn_saved.safetensors: 7 tensors in it name no parameter or running statistic of .*train_mlp.ir" \
    train "$ir" --feed "$feeds" --steps 1 --params "$tmp/bn_saved.safetensors"
cp "$tmp/adamw.safetensors" "$tmp/adamw.before"
expect 1 "--checkpoint .*adamw.safetensors: .*(a resumed run needs the same IR file, --optimizer and --scaler as the run that saved it)" \
    train "$ir" --feed "$feeds" --steps 1 --optimizer=sgd --checkpoint "$tmp/adamw.safetensors"
expect 1 "--fetch grad:w1 needs a loss to differentiate: .*mlp2.ir has no 'loss' line; name the loss node with --loss NAME" \
    run "$data/mlp2.ir" --feed "$data/mlp2_feeds.safetensors" --fetch grad:w1 --out "$tmp/o.safetensors"
check "a refused resume leaves the checkpoint as it was" cmp "$tmp/adamw.before" "$tmp/adamw.safetensors"

# 7. the checkpoint's destination is checked before the first step: a run that could not save at its end
# is refused at once (500 steps would run first otherwise), and a FIFO there is neither read nor replaced
expect 1 "--checkpoint: .*no/such/ckpt.safetensors: cannot write: cannot create a temporary file in the folder .*no/such: No such file or directory" \
    train "$ir" --feed "$feeds" --steps 500 --checkpoint "$tmp/no/such/ckpt.safetensors"
check "an unwritable checkpoint: no step ran" sh -c "! grep -q '^step' '$tmp/stdout'"
rm -f "$tmp/fifo.ckpt" && mkfifo "$tmp/fifo.ckpt"
expect 1 "--checkpoint: .*fifo.ckpt: is a FIFO (named pipe), not a regular file" \
    train "$ir" --feed "$feeds" --steps 500 --checkpoint "$tmp/fifo.ckpt"
check "a FIFO checkpoint stays a FIFO" [ -p "$tmp/fifo.ckpt" ]
expect 2 "--checkpoint needs a non-empty value" train "$ir" --feed "$feeds" --steps 500 --checkpoint ""
# the overflow locator and the stop rules (docs/amp.md, "When a step overflows"): overflow.ir's weight gradient
# overflows f16 until the scale has backed off seven times, each skipped step naming the GEMM that overflowed; with
# the forward feeds every step overflows, and max_consecutive_skips ends the run after the third
over=$data/overflow.ir
train "$tmp/overflow.out" "$over" --amp=f16 --feed "$data/overflow_backward.safetensors" --steps 10 --set amp_check=1 ||
    failures=$((failures + 1))
check "every skipped step names the backward GEMM that overflowed" test "$(grep -c "^step [1-7] skipped: first inf at %17 matmul f16\[16,3\] (backward of matmul %logits, gradient of 'w2'), scale" "$tmp/overflow.out")" -eq 7
check "then the steps apply" grep -q "^step 10 loss [0-9.]* scale 512 skipped 7 " "$tmp/overflow.out"
expect 1 "step 3: training diverged at step 3: 3 skipped steps in a row reached max_consecutive_skips (scale 16384); the state is the last good step's (optimizer step 0, scale 65536); first inf at %h matmul f16\[4,16\] (forward)" \
    train "$over" --amp=f16 --feed "$data/overflow_forward.safetensors" --steps 5 --set amp_check=1 --scaler=dynamic,max_consecutive_skips=3
check "the diverged run printed the first two skips" test "$(grep -c "skipped: first inf at %h matmul" "$tmp/stdout")" -eq 2
expect 2 "--scaler: unknown option 'hysteresys' (min_scale=S, hysteresis=N, max_consecutive_skips=N, stop_at_min_scale)" \
    train "$over" --amp=f16 --feed "$data/overflow_forward.safetensors" --steps 1 --scaler=dynamic,hysteresys=2
expect 1 "--scaler: stop_at_min_scale needs a min_scale > 0" \
    train "$over" --amp=f16 --feed "$data/overflow_forward.safetensors" --steps 1 --scaler=dynamic,stop_at_min_scale
# range statistics and range-aware colouring (docs/amp.md, "Range statistics"): --amp-stats prints the values and
# writes the stats file; a run compiled with it as amp_ranges keeps the overflowing nodes f32 and skips no step
train "$tmp/stats.out" "$over" --amp=f16 --feed "$data/overflow_forward.safetensors" --steps 2 --amp-stats "$tmp/overflow.stats" ||
    failures=$((failures + 1))
check "--amp-stats prints the ten with the least headroom" grep -q "^least headroom (worst 10):" "$tmp/stats.out"
check "and writes the stats file" grep -q "^%h matmul f16 fwd max=inf " "$tmp/overflow.stats"
train "$tmp/ranged.out" "$over" --amp=f16 --feed "$data/overflow_forward.safetensors" --steps 4 --log-every 4 \
    --set amp_ranges="$tmp/overflow.stats" || failures=$((failures + 1))
check "with amp_ranges no step is skipped" grep -q "^step 4 loss [0-9.]* scale 65536 skipped 0 " "$tmp/ranged.out"
# amp-report: the AMP log, the stats file's values for the same step (training on), then range-aware colouring
"$alloyc" amp-report "$over" --train --stats "$tmp/overflow.stats" >"$tmp/report.out" 2>&1 || failures=$((failures + 1))
check "amp-report prints the plain colouring's counts" grep -q "^amp-report .*overflow.ir: f16, 3 of 4 float nodes in low precision" "$tmp/report.out"
check "then the stats file's values, least headroom last" grep -q "^least headroom (worst 10):" "$tmp/report.out"
check "with the overflowing matmul at no headroom" grep -q "^  %h *matmul *f16  fwd *inf *-inf" "$tmp/report.out"
check "then each range decision with its reason" grep -q "^alloy amp:   %h matmul kept f32: max |x| inf > 65504/2" "$tmp/report.out"
check "and the ranged counts" grep -q "0 of 4 float nodes in low precision, 0 casts (0 of weights), 3 kept f32 by the ranges" "$tmp/report.out"
"$alloyc" amp-report "$over" --stats "$tmp/overflow.stats" >"$tmp/report2.out" 2>&1
rc=$?
check "a training step's stats against the forward alone is an error naming the line (exit 1)" \
    sh -c "[ $rc -eq 1 ] && grep -q 'overflow.stats:[0-9]*: %[0-9a-z]* is no value of the compiled graph' '$tmp/report2.out'"
expect 2 "--stats is an option of 'amp-report', not 'train'" train "$over" --steps 1 --stats x
expect 2 "--amp-stats is given twice" train "$over" --feed "$data/overflow_forward.safetensors" --steps 1 --amp-stats a --amp-stats b

[ "$failures" -eq 0 ] || { echo "$failures alloyc train checks failed"; exit 1; }
echo "all alloyc train checks passed"
