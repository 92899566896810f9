#!/bin/sh
# run_gpu_report.sh - bench/gpu_report.py (bench/gpu.sh's table) on result lines written by hand: the analytic
# FLOPs, throughput and ratios against values worked out by hand, and a failed run shown as failed.
#
# usage: run_gpu_report.sh REPORT_PY OUT_DIR     (exit 77, skipped, without python3)
set -u
report=$1 out=$2/gpu_report
command -v python3 >/dev/null 2>&1 || { echo "SKIP: no python3"; exit 77; }
mkdir -p "$out" || exit 1
T=$(printf '\t')
# GPT-2 124M (V50257 T1024 D768 L12 H12) at B8, and issue 13's MLP at B8192, with issue 13's H100 PyTorch times
{
    for row in "impl=alloy${T}mode=-${T}ms=35" "impl=torch${T}mode=eager${T}ms=67.1" "impl=torch${T}mode=compile${T}ms=35.3"; do
        echo "result${T}${row}${T}model=gpt2${T}dtype=f16${T}batch=8${T}tokens=8192${T}vocab=50257${T}context=1024${T}dim=768${T}layers=12${T}heads=12${T}peak_bytes=3221225472${T}first_s=12.5${T}warmup_s=13"
    done
    echo "result${T}impl=torch${T}mode=reduce-overhead${T}model=gpt2${T}dtype=f16${T}failed=exit 124: timed out after 300 s"
    echo "result${T}impl=alloy${T}mode=-${T}ms=6.83${T}model_device=h100${T}model_ms_lo=5.25${T}model_ms_hi=8.5${T}model=mlp${T}dtype=f16${T}batch=8192${T}tokens=8192${T}in=4096${T}hidden=4096${T}layers=4${T}classes=1000"
    echo "not a result line"
} >"$out/results.tsv"
python3 "$report" "$out/results.tsv" --title test >"$out/table.txt" || { echo "gpu_report.py failed"; exit 1; }
cat "$out/table.txt"
fail=0
expect() { # expect TEXT WHY: TEXT must be in the table
    grep -qF -- "$1" "$out/table.txt" || { echo "FAIL: the table lacks '$1' ($2)"; fail=1; }
}
# params that multiply: 12 (12 D^2 + 13 D) + 2 D + D V = 123,653,376; FLOPs per step:
# 6 * 123,653,376 * 8192 + 12 * 12 * 1024 * 768 * 8192 = 6,077,810,737,152 + 927,712,935,936 = 7,005,523,673,088
expect "7,006 GFLOP per step" "GPT-2 124M at B8: 7.0055 TFLOP a step"
expect "| f16 AMP | alloy | 35 | 234,057 | 200 |" "8192 tokens / 35 ms; 7.0055 TFLOP / 35 ms = 200.2 TFLOP/s"
expect "| 3,072 MiB | 12.50 / 13.00 | 0.992 (torch.compile) |" "peak 3 GiB; alloy / best PyTorch = 35 / 35.3"
expect "| f16 AMP | torch.compile | 35.3 |" "PyTorch's best row"
expect "best PyTorch |" "the best PyTorch row is marked"
expect "| f16 AMP | compile, reduce-overhead | failed: exit 124: timed out after 300 s |" "a failed run says why"
# the MLP: 4 (4096^2 + 4096) + 4096 * 1000 + 1000 = 71,222,248 params; 6 * 71,222,248 * 8192 = 3.5007e12 a step
expect "3,501 GFLOP per step" "the MLP at B8192"
expect "| f16 AMP | alloy | 6.83 | 1,199,414 | 513 |" "3.5007 TFLOP / 6.83 ms = 512.6 TFLOP/s (issue 13 quotes 512)"
expect "| 5.25-8.5 (h100) |" "the cost model's range beside the measured alloy row"
expect "| 0.992 (torch.compile) | - |" "no model figures: a dash"
[ $fail -eq 0 ] && echo "gpu_report: every expected cell found"
exit $fail
