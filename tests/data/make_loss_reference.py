#!/usr/bin/env python3
"""make_loss_reference.py - PyTorch's values for alloy's losses: writes tests/data/losses.safetensors.

Inputs (f32, what alloy is fed): logits[6,5], targets i64[6] (one of them
-100, PyTorch's default ignore_index), class weights[5], log_probs[6,5]
(log_softmax of the logits), pred[4,3], target[4,3], z[4,3] in [0, 1],
pos_weight[3]. For each case NAME, torch.nn.functional's loss computed in
float64 from those f32 values (`NAME.loss`, a scalar) and its gradient by
the first input (`NAME.grad`): cross_entropy with weights, ignore_index and
label smoothing (mean and sum), nll_loss, mse, l1, smooth_l1 (beta 0.5 and
1) and binary_cross_entropy_with_logits (with pos_weight and without).
test_losses.c runs the same losses in alloy (f32) and compares.

Run: python3 tests/data/make_loss_reference.py (torch, safetensors).
"""
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

torch.manual_seed(16)
f32 = {
    "logits": torch.randn(6, 5) * 2,
    "weight": torch.rand(5) * 1.5 + 0.25,
    "pred": torch.randn(4, 3) * 2,
    "target": torch.randn(4, 3) * 2,
    "z": torch.rand(4, 3),
    "pos_weight": torch.rand(3) * 2 + 0.5,
}
f32["log_probs"] = F.log_softmax(f32["logits"].double(), -1).float()
targets = torch.tensor([3, 0, -100, 4, 1, 3], dtype=torch.int64)
d = {k: v.double() for k, v in f32.items()}

# name: (first input, the loss of it)
cases = {
    "ce_w_ls_mean": ("logits", lambda x: F.cross_entropy(x, targets, d["weight"], label_smoothing=0.1)),
    "ce_w_ls_sum": ("logits", lambda x: F.cross_entropy(x, targets, d["weight"], label_smoothing=0.1, reduction="sum")),
    "ce_ls_mean": ("logits", lambda x: F.cross_entropy(x, targets, label_smoothing=0.3)),
    "ce_mean": ("logits", lambda x: F.cross_entropy(x, targets)),
    "nll_w_mean": ("log_probs", lambda x: F.nll_loss(x, targets, d["weight"])),
    "nll_sum": ("log_probs", lambda x: F.nll_loss(x, targets, reduction="sum")),
    "mse_mean": ("pred", lambda x: F.mse_loss(x, d["target"])),
    "l1_sum": ("pred", lambda x: F.l1_loss(x, d["target"], reduction="sum")),
    "smooth_l1_b05_mean": ("pred", lambda x: F.smooth_l1_loss(x, d["target"], beta=0.5)),
    "smooth_l1_sum": ("pred", lambda x: F.smooth_l1_loss(x, d["target"], reduction="sum")),
    "bce_pw_mean": ("pred", lambda x: F.binary_cross_entropy_with_logits(x, d["z"], pos_weight=d["pos_weight"])),
    "bce_sum": ("pred", lambda x: F.binary_cross_entropy_with_logits(x, d["z"], reduction="sum")),
}
out = dict(f32)
out["targets"] = targets
for name, (first, loss_of) in cases.items():
    x = d[first].clone().requires_grad_(True)
    loss = loss_of(x)
    loss.backward()
    out[name + ".loss"] = loss.detach()
    out[name + ".grad"] = x.grad.detach()
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "losses.safetensors")
save_file({k: v.contiguous() for k, v in out.items()}, path, metadata={"torch": torch.__version__})
print("wrote", path)
