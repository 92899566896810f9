#!/usr/bin/env python3
"""make_norm_reference.py - PyTorch's values for alloy's batch_norm and group_norm: writes tests/data/norms.safetensors.

batch_norm: torch.nn.BatchNorm2d(3, eps=1e-5, momentum=0.1) in float64 from
f32 inputs, weight bn.w0 and bias bn.b0, trained two steps with
torch.optim.SGD(lr=0.1) on loss = sum(bn(x) * r): for step k (1, 2) the
input bn.x<k>, the output bn.y<k> and the gradients bn.grad_x<k>,
bn.grad_w<k>, bn.grad_b<k>; after both steps the running statistics
bn.running_mean, bn.running_var and the params bn.weight, bn.bias; then in
eval() the output bn.y_eval of bn.x_eval. The same for BatchNorm1d on
[N, C] inputs under the prefix bn1d. group_norm: F.group_norm(gn.x, 2,
gn.w, gn.b) with loss sum(y * gn.r): gn.y, gn.grad_x, gn.grad_w, gn.grad_b.
test_norms.c runs the same in alloy (f32) and compares.

Run: python3 tests/data/make_norm_reference.py (torch, safetensors).
"""
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

torch.manual_seed(16)
out = {}


def batch_norm_case(prefix, module, shape):
    c = shape[1]
    f32 = {
        "x1": torch.randn(*shape) * 2 + 1,
        "x2": torch.randn(*shape) * 1.5 - 0.5,
        "x_eval": torch.randn(*shape),
        "r": torch.randn(*shape),
        "w0": torch.rand(c) + 0.5,
        "b0": torch.randn(c) * 0.5,
    }
    bn = module(c, eps=1e-5, momentum=0.1).double()
    with torch.no_grad():
        bn.weight.copy_(f32["w0"].double())
        bn.bias.copy_(f32["b0"].double())
    opt = torch.optim.SGD(bn.parameters(), lr=0.1)
    r = f32["r"].double()
    for k in (1, 2):
        x = f32["x%d" % k].double().requires_grad_(True)
        y = bn(x)
        (y * r).sum().backward()
        out["%s.y%d" % (prefix, k)] = y.detach()
        out["%s.grad_x%d" % (prefix, k)] = x.grad.detach()
        out["%s.grad_w%d" % (prefix, k)] = bn.weight.grad.detach().clone()
        out["%s.grad_b%d" % (prefix, k)] = bn.bias.grad.detach().clone()
        opt.step()
        opt.zero_grad()
    out[prefix + ".running_mean"] = bn.running_mean.detach()
    out[prefix + ".running_var"] = bn.running_var.detach()
    out[prefix + ".weight"] = bn.weight.detach()
    out[prefix + ".bias"] = bn.bias.detach()
    bn.eval()
    out[prefix + ".y_eval"] = bn(f32["x_eval"].double()).detach()
    for k, v in f32.items():
        out[prefix + "." + k] = v


batch_norm_case("bn", torch.nn.BatchNorm2d, (4, 3, 5, 5))
batch_norm_case("bn1d", torch.nn.BatchNorm1d, (8, 3))

gn = {"x": torch.randn(2, 6, 3, 3) * 2 + 1, "w": torch.rand(6) + 0.5, "b": torch.randn(6) * 0.5, "r": torch.randn(2, 6, 3, 3)}
x, w, b = (gn[k].double().requires_grad_(True) for k in ("x", "w", "b"))
y = F.group_norm(x, 2, w, b, eps=1e-5)
(y * gn["r"].double()).sum().backward()
out.update({"gn." + k: v for k, v in gn.items()})
out.update({"gn.y": y.detach(), "gn.grad_x": x.grad, "gn.grad_w": w.grad, "gn.grad_b": b.grad})

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "norms.safetensors")
save_file({k: v.contiguous() for k, v in out.items()}, path, metadata={"torch": torch.__version__})
print("wrote", path)
