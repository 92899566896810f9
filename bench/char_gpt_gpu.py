#!/usr/bin/env python3
"""char_gpt_gpu.py - benchmark: the char_gpt model (examples/gpt_model.c, built as bench/char_gpt_torch.py builds it) trained by PyTorch on the GPU, median milliseconds per training step.

Configs: fp32 (TF32 off), f16 autocast with GradScaler, bf16 autocast; AdamW
(fused when this torch has it; betas 0.9/0.99, eps 1e-8, weight decay 0.01).
Timed with CUDA events around each whole step (zero_grad, forward, backward,
scaler, optimizer) after warm-up; --compile also times torch.compile. Prints
"torch not installed" or "no CUDA device" and exits 0 without them.

Output: one line per config, "ms_per_step<TAB>config<TAB>value", after a line
naming torch, CUDA and the GPU.
"""
import argparse
import os
import statistics
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from char_gpt_torch import add_model_args, build_model  # noqa: E402


def time_config(torch, args, dtype, compiled):
    torch.manual_seed(1)
    dev = torch.device("cuda")
    model = build_model(torch, args.vocab, args.context, args.dim, args.layers, args.heads, 4 * args.dim).to(dev)
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01,
                                fused=True)
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    forward = torch.compile(model) if compiled else model
    tokens = torch.randint(0, args.vocab, (args.batch, args.context), device=dev)
    targets = torch.randint(0, args.vocab, (args.batch, args.context), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = forward(tokens, targets)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    ms = []
    for _ in range(args.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        ms.append(start.elapsed_time(end))
    return statistics.median(ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    add_model_args(ap)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    try:
        import torch
    except ImportError:
        print("torch not installed")
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
    sys.stdout.flush()
    configs = [("torch fp32", None), ("torch f16 autocast", torch.float16), ("torch bf16 autocast", torch.bfloat16)]
    for name, dtype in configs:
        for compiled in (False, True) if args.compile else (False,):
            label = name + (" compile" if compiled else " eager")
            try:
                ms = time_config(torch, args, dtype, compiled)
            except Exception as e:  # noqa: BLE001 - a config that cannot run is reported, not fatal
                print(f"{label}: failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
                continue
            print(f"ms_per_step\t{label}\t{ms:.3f}")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
