#!/usr/bin/env python3
"""make_conv_reference.py - PyTorch's values for alloy's convolutions and pools: writes tests/data/conv.safetensors.

For each case NAME: its f32 inputs (what alloy is fed: `NAME.x`, and for a
convolution `NAME.w` and maybe `NAME.b`), fixed weights `NAME.r` of the
result's shape, and computed in float64 from those f32 values by
torch.nn.functional: the result `NAME.y` and the gradients of sum(y * r) by
each input (`NAME.dx`, `NAME.dw`, `NAME.db`). Cases: conv2d with bias,
stride, padding, dilation and groups 2; a depthwise conv2d (channel
multiplier 2) without bias; conv1d; max_pool2d with ties in its windows (the
gradient goes to the first maximum); avg_pool2d with and without
count_include_pad; adaptive_avg_pool2d (overlapping bins). test_conv.c runs
the same ops in alloy (f32) and compares.

Run: python3 tests/data/make_conv_reference.py (torch, safetensors).
"""
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

torch.manual_seed(16)

# name: (input shapes, the op of the float64 inputs)
cases = {
    "conv2d": ({"x": (2, 4, 7, 9), "w": (6, 2, 3, 2), "b": (6,)},
               lambda t: F.conv2d(t["x"], t["w"], t["b"], stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)),
    "depthwise": ({"x": (1, 3, 6, 5), "w": (6, 1, 3, 3)},
                  lambda t: F.conv2d(t["x"], t["w"], None, stride=2, padding=1, groups=3)),
    "conv1d": ({"x": (2, 4, 11), "w": (6, 4, 3), "b": (6,)},
               lambda t: F.conv1d(t["x"], t["w"], t["b"], stride=2, padding=1, dilation=2)),
    "max_pool2d": ({"x": (2, 3, 7, 9)}, lambda t: F.max_pool2d(t["x"], (3, 2), (2, 1), (1, 1))),
    "avg_pool2d": ({"x": (2, 3, 7, 9)}, lambda t: F.avg_pool2d(t["x"], 3, 2, 1)),
    "avg_pool2d_nopad": ({"x": (2, 3, 7, 9)}, lambda t: F.avg_pool2d(t["x"], 3, 2, 1, count_include_pad=False)),
    "adaptive_avg_pool2d": ({"x": (2, 3, 7, 9)}, lambda t: F.adaptive_avg_pool2d(t["x"], (3, 4))),
}
out = {}
for name, (shapes, op) in cases.items():
    f32 = {k: torch.randn(*s) for k, s in shapes.items()}
    if name == "max_pool2d":  # values on a grid of 0.5: windows with equal maxima
        f32["x"] = torch.round(f32["x"] * 2) / 2
    d = {k: v.double().requires_grad_(True) for k, v in f32.items()}
    y = op(d)
    r = torch.randn(*y.shape)
    (y * r.double()).sum().backward()
    for k, v in f32.items():
        out[name + "." + k] = v
        out[name + ".d" + k] = d[k].grad.detach()
    out[name + ".r"] = r
    out[name + ".y"] = y.detach()
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conv.safetensors")
save_file({k: v.contiguous() for k, v in out.items()}, path, metadata={"torch": torch.__version__})
print("wrote", path)
