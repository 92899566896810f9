#!/usr/bin/env python3
"""char_gpt_torch.py - benchmark: the char_gpt model (examples/gpt_model.c) trained in PyTorch on the CPU, tokens/s in f32 and bf16 autocast.

Same model, init and optimizer as alloy's: token + learned positional
embedding, pre-norm blocks (fused q|k|v projection, causal softmax
attention, GELU MLP), final LayerNorm, untied head without bias; AdamW
(betas 0.9/0.99, eps 1e-8, weight decay 0.01). Attention is written out
(matmul, mask, softmax, matmul) as alloy computes it. Works with any
torch >= 2.0; prints "torch not installed" and exits 0 without it.

Output: a line per config, "step_ms<TAB>config<TAB>WALL<TAB>CPU<TAB>RAN":
the medians over the timed steps of the wall time and of the process CPU
time (user + system, all threads) in ms, and the threads that had at least
1% of the process's CPU time during them (read by bench/char_gpt_bench.c),
after a line naming the torch version and threads.
"""
import argparse
import math
import os
import sys
import statistics
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from proc_threads import thread_cpu_ns, threads_ran  # noqa: E402


def build_model(torch, vocab, context, dim, layers, heads, mlp_width, attention="written", gelu="erf"):
    """examples/gpt_model.c's model; attention "written" (matmul, mask, softmax, matmul, as alloy writes it) or
    "sdpa" (F.scaled_dot_product_attention, causal: flash attention on a GPU, as alloy's attention op); gelu
    "erf" (F.gelu's default) or "tanh" (approximate="tanh", as gpt_config's gelu_tanh)."""
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(dim, eps=1e-5)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.ln2 = nn.LayerNorm(dim, eps=1e-5)
            self.fc = nn.Linear(dim, mlp_width)
            self.fc_proj = nn.Linear(mlp_width, dim)
            mask = torch.ones(context, context, dtype=torch.bool).triu(1)
            self.register_buffer("mask", mask, persistent=False)

        def attention(self, x):
            b, t, d = x.shape
            hd = d // heads
            q, k, v = self.qkv(x).split(d, dim=-1)
            q, k, v = (z.view(b, t, heads, hd).transpose(1, 2) for z in (q, k, v))
            if attention == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
                return self.proj(y)
            scores = (q * (1.0 / math.sqrt(hd))) @ k.transpose(-2, -1)
            weights = F.softmax(scores.masked_fill(self.mask, float("-inf")), dim=-1)
            y = (weights @ v).transpose(1, 2).reshape(b, t, d)
            return self.proj(y)

        def forward(self, x):
            x = x + self.attention(self.ln1(x))
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="none" if gelu == "erf" else "tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_emb = nn.Embedding(vocab, dim)
            self.pos_emb = nn.Parameter(torch.zeros(context, dim))
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(dim, eps=1e-5)
            self.head = nn.Linear(dim, vocab, bias=False)
            residual_std = 0.02 / math.sqrt(2 * layers)
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif ".ln" in name or name.startswith("ln_f"):
                    nn.init.ones_(p)
                else:
                    std = residual_std if name.endswith(("proj.weight",)) else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, tokens, targets):
            x = self.tok_emb(tokens) + self.pos_emb
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

    return GPT()


def time_config(torch, args, autocast_dtype):
    torch.manual_seed(1)
    model = build_model(torch, args.vocab, args.context, args.dim, args.layers, args.heads, 4 * args.dim)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    tokens = torch.randint(0, args.vocab, (args.batch, args.context))
    targets = torch.randint(0, args.vocab, (args.batch, args.context))

    def step():
        opt.zero_grad(set_to_none=True)
        if autocast_dtype is None:
            loss = model(tokens, targets)
        else:
            with torch.autocast("cpu", dtype=autocast_dtype):
                loss = model(tokens, targets)
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    wall, cpu = [], []
    before, cpu0 = thread_cpu_ns(), time.process_time()
    for _ in range(args.steps):
        w0, c0 = time.perf_counter(), time.process_time()
        step()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    ran = threads_ran(before, thread_cpu_ns(), (time.process_time() - cpu0) * 1e7)
    return 1e3 * statistics.median(wall), 1e3 * statistics.median(cpu), ran


def add_model_args(ap):
    """The model's shape flags, char_gpt's defaults (shared with char_gpt_gpu.py)."""
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=76)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    add_model_args(ap)
    ap.add_argument("--threads", type=int, default=0, help="0 = torch's default")
    args = ap.parse_args()
    # torch warns on import when numpy is missing; the benchmark needs no numpy.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    try:
        import torch
    except ImportError:
        print("torch not installed")
        return 0
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    sys.stdout.flush()
    for name, dtype in (("torch fp32", None), ("torch bf16 autocast", torch.bfloat16)):
        try:
            wall_ms, cpu_ms, ran = time_config(torch, args, dtype)
        except RuntimeError as e:  # e.g. an old CPU without bf16 kernels
            print(f"{name}: failed: {str(e).splitlines()[0]}")
            continue
        print(f"step_ms\t{name}\t{wall_ms:.3f}\t{cpu_ms:.3f}\t{ran}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
