#!/usr/bin/env python3
"""gpu_torch.py - benchmark: the models of bench/gpu.sh trained by PyTorch (eager, torch.compile, torch.compile mode="reduce-overhead"); one machine-readable result line per mode, which bench/gpu_report.py merges with bench/gpu_step.c's.

The models are alloy's op for op: char_gpt and GPT-2 (examples/gpt_model.c,
built by bench/char_gpt_torch.py: learned positions, untied head; gpt2 with
attention written out, gpt2_flash with F.scaled_dot_product_attention), and
the MLP of bench/mlp_model.c. Shapes and --quick as bench/gpu_step.c's.
AdamW (lr 1e-3, betas 0.9/0.99, eps 1e-8, weight decay 0.01; fused=True on
CUDA); f16 autocast with GradScaler, bf16 autocast without; TF32 off. The
compiled modes compile the model's forward + loss (the optimizer and scaler
stay eager, as in the usual training loop).

Timing: CUDA events around each whole step (zero_grad, forward, backward,
scaler, optimizer) on the GPU, the wall clock on the CPU; the median of
--steps after --warmup runs. first_s is the first step (compiling, for the
compiled modes), warmup_s all warm-up steps; peak_bytes is
torch.cuda.max_memory_allocated over model, optimizer and steps (0 on the
CPU). A mode that fails prints its result line with error=REASON. Without
torch: "torch not installed" on stderr, status 3; without a GPU (and not
--device cpu): "no CUDA device", status 2.
"""
import argparse
import gc
import math
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from char_gpt_torch import build_model  # noqa: E402
from step_torch import build_mlp  # noqa: E402

# (full, quick) shapes, as bench/gpu_step.c's
SHAPES = {
    "char_gpt": (dict(vocab=76, context=64, dim=128, layers=2, heads=4, batch=32),
                 dict(vocab=76, context=16, dim=32, layers=1, heads=2, batch=4)),
    "mlp": (dict(n_in=4096, hidden=4096, layers=4, classes=1000, batch=8192),
            dict(n_in=64, hidden=64, layers=2, classes=10, batch=64)),
    "gpt2": (dict(vocab=50257, context=1024, dim=768, layers=12, heads=12, batch=8),
             dict(vocab=128, context=32, dim=32, layers=2, heads=2, batch=2)),
    "gpt2_flash": (dict(vocab=50257, context=1024, dim=768, layers=12, heads=12, batch=32),
                   dict(vocab=128, context=32, dim=32, layers=2, heads=2, batch=4)),
}
MODES = ("eager", "compile", "reduce-overhead")


def make_step(torch, args, shape, dtype, mode, dev):
    """A closure running one training step of args.model in mode; the model and data on dev."""
    F = torch.nn.functional
    torch.manual_seed(1)
    if args.model == "mlp":
        model = build_mlp(torch, shape["n_in"], shape["hidden"], shape["layers"], shape["classes"]).to(dev)
        x = torch.rand(shape["batch"], shape["n_in"], device=dev) * 2 - 1
        y = torch.randint(0, shape["classes"], (shape["batch"],), device=dev)

        def loss_fn(x, y):
            return F.cross_entropy(model(x).float(), y)
    else:
        attention = "sdpa" if args.model == "gpt2_flash" else "written"
        model = build_model(torch, shape["vocab"], shape["context"], shape["dim"], shape["layers"], shape["heads"],
                            4 * shape["dim"], attention=attention, gelu=args.gelu).to(dev)
        x = torch.randint(0, shape["vocab"], (shape["batch"], shape["context"]), device=dev)
        y = torch.randint(0, shape["vocab"], (shape["batch"], shape["context"]), device=dev)
        loss_fn = model
    kw = dict(lr=1e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    opt = torch.optim.AdamW(model.parameters(), fused=True, **kw) if dev.type == "cuda" else \
        torch.optim.AdamW(model.parameters(), **kw)
    scaler = torch.amp.GradScaler(dev.type, enabled=dtype == torch.float16)
    forward = loss_fn
    if mode == "compile":
        forward = torch.compile(loss_fn)
    elif mode == "reduce-overhead":
        forward = torch.compile(loss_fn, mode="reduce-overhead")

    def step():
        if mode == "reduce-overhead" and hasattr(torch, "compiler"):
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = forward(x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    return step


def time_mode(torch, args, shape, dtype, mode, dev):
    """(median ms, min ms, first step s, warm-up s, peak bytes, last loss) of one mode."""
    cuda = dev.type == "cuda"
    # the previous mode's model, optimizer and compiled graphs go first, so the peak is this mode's alone
    gc.collect()
    if hasattr(torch, "_dynamo"):
        torch._dynamo.reset()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    step = make_step(torch, args, shape, dtype, mode, dev)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    sync()
    first_s = warmup_s = 0.0
    for i in range(args.warmup):
        t0 = time.perf_counter()
        loss = step()
        sync()
        took = time.perf_counter() - t0
        first_s = took if i == 0 else first_s
        warmup_s += took
    ms = []
    for _ in range(args.steps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss = step()
            end.record()
            end.synchronize()
            ms.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            loss = step()
            ms.append(1e3 * (time.perf_counter() - t0))
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    return statistics.median(ms), min(ms), first_s, warmup_s, peak, float(loss)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=tuple(SHAPES), required=True)
    ap.add_argument("--dtype", choices=("f32", "f16", "bf16"), default="f16")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated: " + ", ".join(MODES))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="tiny shapes, as gpu_step --quick")
    ap.add_argument("--gelu", choices=("erf", "tanh"), default="erf", help="the GPTs' MLP activation, as gpu_step --gelu")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode {bad[0]} (modes: {', '.join(MODES)})")
    if args.steps < 1 or args.warmup < 1:
        ap.error("--steps and --warmup must be at least 1")
    warnings.filterwarnings("ignore")
    try:
        import torch
    except ImportError as e:
        print(f"torch not installed: {e}", file=sys.stderr)
        return 3
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = torch.device(args.device)
    shape = SHAPES[args.model][1 if args.quick else 0]
    dtype = {"f32": None, "f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    device_name = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"
    tokens = shape["batch"] * shape.get("context", 1)
    fields = [f"model={args.model}", f"dtype={args.dtype}", f"device={args.device}", f"batch={shape['batch']}",
              f"tokens={tokens}"]
    fields += [f"{'in' if k == 'n_in' else k}={v}" for k, v in shape.items() if k != "batch"]
    for mode in modes:
        line = ["result", "impl=torch", f"mode={mode}"] + fields
        try:
            ms, ms_min, first_s, warmup_s, peak, loss = time_mode(torch, args, shape, dtype, mode, dev)
            line += [f"ms={ms:.4f}", f"ms_min={ms_min:.4f}", f"steps={args.steps}", f"first_s={first_s:.3f}",
                     f"warmup_s={warmup_s:.3f}", f"peak_bytes={peak}", f"loss={loss:.5f}" if math.isfinite(loss)
                     else f"loss={loss}"]
        except Exception as e:  # noqa: BLE001 - a mode that cannot run is reported, not fatal
            why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200].replace("\t", " ")
            line.append(f"error={type(e).__name__}: {why}")
        line.append(f"device_name=torch {torch.__version__} {device_name}")
        print("\t".join(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
