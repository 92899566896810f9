#!/usr/bin/env python3
"""step_torch.py - benchmark: one PyTorch training step on the CPU (char_gpt's model or the MLP of bench/step_bench.c; f32, f16 or bf16 autocast), per-step wall and CPU time; the PyTorch half of bench/cpu_vs_torch.sh.

The models are bench/step_bench.c's op for op: char_gpt from
bench/char_gpt_torch.py (examples/gpt_model.c's model), and the MLP
x -> [Linear -> ReLU] x layers -> Linear -> cross-entropy. AdamW (lr 3e-3,
betas 0.9/0.99, eps 1e-8, weight decay 0.01, PyTorch's default
implementation for CPU tensors); f16 with torch.amp.GradScaler("cpu") as
alloy's f16 uses its dynamic scaler, bf16 without a scaler.

Threads: --threads N sets torch.set_num_threads(N) (the caller also sets
OMP_NUM_THREADS and chooses OMP_WAIT_POLICY). Output: a line naming torch,
then "step_ms<TAB>WALL<TAB>CPU": the medians of the timed steps' wall time
and process CPU time (user + system, all threads), in ms, then
"threads<TAB>RAN<TAB>ALL": the threads with at least 1% of the process's
CPU time during the timed steps (/proc/self/task) and all threads at the
end. Without torch it prints "torch not installed: REASON" and exits with
status 3.
"""
import argparse
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from proc_threads import thread_cpu_ns, threads_ran  # noqa: E402


def build_mlp(torch, n_in, hidden, layers, classes):
    """The MLP of step_bench.c (Linear's default init, zero biases)."""
    nn = torch.nn
    mods, width = [], n_in
    for _ in range(layers):
        mods += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    mods.append(nn.Linear(width, classes))
    net = nn.Sequential(*mods)
    for m in net:
        if isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)
    return net


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("char_gpt", "mlp"), default="char_gpt")
    ap.add_argument("--dtype", choices=("f32", "f16", "bf16"), default="f32")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="0 = torch's default")
    ap.add_argument("--batch", type=int, default=0, help="0 = 32 sequences (char_gpt) or 256 rows (mlp)")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=76)
    ap.add_argument("--in", dest="n_in", type=int, default=784)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--classes", type=int, default=10)
    args = ap.parse_args()
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    # torch warns on import when numpy is missing; the benchmark needs no numpy.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    try:
        import torch
    except ImportError as e:
        print(f"torch not installed: {e}")
        return 3
    import torch.nn.functional as F

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    if args.model == "char_gpt":
        from char_gpt_torch import build_model

        batch = args.batch or 32
        model = build_model(torch, args.vocab, args.context, args.dim, args.layers, args.heads, 4 * args.dim)
        x = torch.randint(0, args.vocab, (batch, args.context))
        y = torch.randint(0, args.vocab, (batch, args.context))

        def loss_of():
            return model(x, y)
    else:
        batch = args.batch or 256
        model = build_mlp(torch, args.n_in, args.hidden, args.layers, args.classes)
        x = torch.rand(batch, args.n_in) * 2 - 1
        y = torch.randint(0, args.classes, (batch,))

        def loss_of():
            return F.cross_entropy(model(x).float(), y)

    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    amp = {"f32": None, "f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    scaler = torch.amp.GradScaler("cpu") if amp == torch.float16 else None

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
            loss = loss_of()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

    for _ in range(args.warmup):
        step()
    wall, cpu = [], []
    before, cpu0 = thread_cpu_ns(), time.process_time()
    for _ in range(args.steps):
        w0, c0 = time.perf_counter(), time.process_time()
        step()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    print(f"torch {torch.__version__} {args.model} {args.dtype}, batch {batch}, "
          f"{torch.get_num_threads()} threads, {args.warmup} warmup + {args.steps} timed steps")
    cpu_all, after = time.process_time() - cpu0, thread_cpu_ns()
    print(f"step_ms\t{1e3 * statistics.median(wall):.3f}\t{1e3 * statistics.median(cpu):.3f}")
    print(f"threads\t{threads_ran(before, after, cpu_all * 1e7)}\t{len(after)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
