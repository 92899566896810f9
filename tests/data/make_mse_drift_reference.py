#!/usr/bin/env python3
"""make_mse_drift_reference.py - PyTorch's reference for the AMP accuracy of a hand-built regression loss: writes tests/data/mse_drift.safetensors.

Model: pred = relu(x @ w1 + b1) @ w2 + b2 on x[256, 16], targets y[256, 1]
around 100 (y = 100 + sin(x a): where bf16's spacing is 0.5, so a target or a
prediction rounded to bf16 loses most of the signal); loss = mean((pred - y)^2), the MSE written
out as sub, square and mean. AdamW (lr 1e-2, betas 0.9/0.999, eps 1e-8,
weight decay 0.01), full batch, 10 steps, once in fp32 and once under
torch.autocast(cpu, bfloat16). The file holds the data, the initial
parameters in alloy's layout (w as [in, out]), PyTorch's fp32 parameters
after the 10 steps (`torch_fp32.*`), and in the metadata the drift: the
largest |p_bf16 - p_fp32| over every parameter element after 10 steps.
test_amp_models.c trains the same model in alloy and checks its bf16 drift
against this one (at most 2x) and its fp32 parameters against PyTorch's.

Run: python3 tests/data/make_mse_drift_reference.py (torch, safetensors).
"""
import os

import torch
from safetensors.torch import save_file

STEPS = 10


def train(params, x, y, autocast):
    w1, b1, w2, b2 = (p.clone().requires_grad_(True) for p in params)
    opt = torch.optim.AdamW([w1, b1, w2, b2], lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            h = torch.relu(x @ w1 + b1)
            pred = h @ w2 + b2
            loss = ((pred - y) ** 2).mean()
        loss.backward()
        opt.step()
    return [p.detach() for p in (w1, b1, w2, b2)]


def main():
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    a = torch.randn(16, 1) * 0.5
    y = 100.0 + torch.sin(x @ a)
    params = [torch.randn(16, 32) * 0.25, torch.zeros(32), torch.randn(32, 1) * 0.25, torch.full((1,), 100.0)]
    fp32 = train(params, x, y, False)
    bf16 = train(params, x, y, True)
    drift = max((p - q).abs().max().item() for p, q in zip(fp32, bf16))
    names = ["w1", "b1", "w2", "b2"]
    tensors = {"x": x, "y": y}
    tensors.update({n: p.contiguous() for n, p in zip(names, params)})
    tensors.update({"torch_fp32." + n: p.contiguous() for n, p in zip(names, fp32)})
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mse_drift.safetensors")
    save_file(tensors, out, metadata={"torch_bf16_drift": repr(drift), "torch_version": torch.__version__,
                                      "steps": str(STEPS)})
    print(f"torch {torch.__version__}: bf16 autocast drift after {STEPS} AdamW steps {drift:.6g}; wrote {out}")


if __name__ == "__main__":
    main()
