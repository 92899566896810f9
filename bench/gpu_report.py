#!/usr/bin/env python3
"""gpu_report.py - bench/gpu.sh's table: merges the result lines of bench/gpu_step.c (alloy) and bench/gpu_torch.py (PyTorch) into one markdown table per model, with throughput, achieved TFLOP/s and the ratio of each alloy row to PyTorch's best on the same model and dtype.

usage: gpu_report.py RESULTS [--title TEXT]

RESULTS holds lines "result<TAB>key=value<TAB>..." (other lines are ignored;
"error=" and "failed=" fields make a row that says why). FLOPs per step are
counted analytically, the same way for both sides, from the shape fields:
  GPTs: 6 * N * tokens + 12 * layers * context * dim * tokens, where N counts
        the parameters that multiply (every block's weights and biases, the
        final norm, the head; not the token and position tables) and the second
        term is attention's two matmuls forward and backward over the whole
        T x T square (PaLM's count; the causal half is not discounted);
  MLP:  6 * N * rows, N every weight and bias.
ratio = alloy ms / the fastest PyTorch mode's ms for that model and dtype:
below 1 alloy is faster. modelled: alloy rows carry the cost model's step time
for the same compiled step (model_ms_lo, model_ms_hi, model_device: the
constants' table; docs/cuda.md, "The cost model"), modelled, not measured.
"""
import argparse
import sys

MODEL_TITLES = {
    "char_gpt": "char_gpt",
    "mlp": "MLP",
    "gpt2": "GPT (examples/gpt_model.c), attention written out",
    "gpt2_flash": "GPT (examples/gpt_model.c), fused attention (alloy's attention op; PyTorch SDPA)",
}
DTYPE_TITLES = {"f32": "fp32 (no TF32)", "f16": "f16 AMP", "bf16": "bf16 AMP"}
MODE_TITLES = {"-": "alloy", "eager": "PyTorch eager", "compile": "torch.compile",
               "reduce-overhead": "compile, reduce-overhead"}


def parse(path):
    rows = []
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if parts[0] != "result":
                continue
            rows.append(dict(p.split("=", 1) for p in parts[1:] if "=" in p))
    return rows


def num(row, key, default=0.0):
    try:
        return float(row.get(key, default))
    except ValueError:
        return default


def step_flops(row):
    """Analytic FLOPs of one training step (forward + backward) of row's model and shape."""
    if row.get("model") == "mlp":
        widths = [int(num(row, "in"))] + [int(num(row, "hidden"))] * int(num(row, "layers")) + [int(num(row, "classes"))]
        params = sum(a * b + b for a, b in zip(widths, widths[1:]))
        return 6.0 * params * num(row, "tokens")
    d, layers, vocab, context = num(row, "dim"), num(row, "layers"), num(row, "vocab"), num(row, "context")
    params = layers * (12 * d * d + 13 * d) + 2 * d + d * vocab
    tokens = num(row, "tokens")
    return 6.0 * params * tokens + 12.0 * layers * context * d * tokens


def fmt(x):
    """Three significant digits below 100, else no decimals."""
    return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"


def mib(b):
    return f"{b / 2**20:,.0f} MiB" if b >= 2**20 else f"{b / 1024:,.0f} KiB" if b > 0 else "-"


def table(rows, out):
    models = []
    for r in rows:
        if r.get("model") not in models:
            models.append(r.get("model"))
    for model in models:
        mine = [r for r in rows if r.get("model") == model]
        r0 = mine[0]
        unit = "samples/s" if model == "mlp" else "tokens/s"
        shape = (f"in {r0.get('in')}, {r0.get('layers')} x {r0.get('hidden')}, {r0.get('classes')}-way, B{r0.get('batch')}"
                 if model == "mlp" else
                 f"V{r0.get('vocab')} T{r0.get('context')} D{r0.get('dim')} L{r0.get('layers')} H{r0.get('heads')} "
                 f"B{r0.get('batch')}")
        print(f"\n### {MODEL_TITLES.get(model, model)}: {shape}, {fmt(step_flops(r0) / 1e9)} GFLOP per step\n", file=out)
        print(f"| dtype | run | ms/step | {unit} | TFLOP/s | peak memory | first step / warm-up s | alloy / best PyTorch | modelled ms |",
              file=out)
        print("|---|---|---|---|---|---|---|---|---|", file=out)
        dtypes = []
        for r in mine:
            if r.get("dtype") not in dtypes:
                dtypes.append(r.get("dtype"))
        for dtype in dtypes:
            group = [r for r in mine if r.get("dtype") == dtype]
            torch_ok = [r for r in group if r.get("impl") == "torch" and num(r, "ms") > 0 and "error" not in r]
            best = min(torch_ok, key=lambda r: num(r, "ms")) if torch_ok else None
            for r in group:
                name = MODE_TITLES.get(r.get("mode", "-"), r.get("mode"))
                why = r.get("error") or r.get("failed")
                if why:
                    print(f"| {DTYPE_TITLES.get(dtype, dtype)} | {name} | failed: {why} | | | | | | |", file=out)
                    continue
                ms = num(r, "ms")
                rate = num(r, "tokens") / (ms / 1e3) if ms > 0 else 0
                tflops = step_flops(r) / (ms / 1e3) / 1e12 if ms > 0 else 0
                ratio = "-"
                if r.get("impl") == "alloy" and best:
                    ratio = f"{fmt(ms / num(best, 'ms'))} ({MODE_TITLES.get(best['mode'], best['mode'])})"
                elif r is best:
                    ratio = "best PyTorch"
                peak = mib(num(r, "peak_bytes"))
                modelled = "-"
                if "model_ms_lo" in r:
                    modelled = f"{fmt(num(r, 'model_ms_lo'))}-{fmt(num(r, 'model_ms_hi'))} ({r.get('model_device', '?')})"
                print(f"| {DTYPE_TITLES.get(dtype, dtype)} | {name} | {fmt(ms)} | {rate:,.0f} | {fmt(tflops)} | {peak} | "
                      f"{num(r, 'first_s'):.2f} / {num(r, 'warmup_s'):.2f} | {ratio} | {modelled} |", file=out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--title", default="alloy against PyTorch")
    args = ap.parse_args()
    rows = parse(args.results)
    print(f"## {args.title}", file=sys.stdout)
    if not rows:
        print("\nno results (see the logs)")
        return 1
    devices = sorted({r.get("device_name", "?") for r in rows})
    print("\nruns on: " + "; ".join(devices))
    table(rows, sys.stdout)
    print("\nms/step: median of the timed steps (alloy: wall clock around alloy_graph_run, which returns after the "
          "step; PyTorch: CUDA events around the whole step, wall clock on the CPU). TFLOP/s: analytic FLOPs "
          "(bench/gpu_report.py) over that time. Peak memory: alloy_graph_device_memory's peak (arena, aux block, "
          "state, inputs, cuBLASLt workspace); PyTorch: torch.cuda.max_memory_allocated. First step: compile + one "
          "step.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
