#!/usr/bin/env python3
"""make_torch_batchnorm_reference.py - a PyTorch BatchNorm2d + Linear state_dict and its eval logits, for alloy's params-file test: writes tests/data/torch_bn.safetensors and tests/data/torch_bn_io.safetensors.

Model: bn = BatchNorm2d(3) on x [4, 3, 2, 2], then flatten and
fc = Linear(12, 2), in eval mode (the running statistics normalize).
torch_bn.safetensors holds exactly the model's state_dict, PyTorch's keys
and dtypes: bn.weight, bn.bias, bn.running_mean, bn.running_var (f32 [3]),
bn.num_batches_tracked (i64 []), fc.weight [2, 12], fc.bias [2];
torch_bn_io.safetensors the input "x" and the eval logits "y" (f32).

With torch installed the state_dict and logits are PyTorch's (statistics
set as after training: random running mean and variance, 7 batches
tracked); without it (torch was not installable where this file was made)
the same keys, dtypes and shapes are written from numpy and the logits
computed in float64 by PyTorch's eval formula,
y = fc.weight @ flatten((x - mean) / sqrt(var + 1e-5) * weight + bias) + fc.bias.
Either way the script checks the logits both ways when torch is there.

test_norms.c loads torch_bn.safetensors with alloy_graph_load_state
(strict: every tensor must be state of the graph and every state in the
file) and alloy_graph_load_params, checks the logits, and checks that
alloy_graph_save_params writes exactly these keys with the same bytes.

Run: python3 tests/data/make_torch_batchnorm_reference.py (numpy, safetensors; torch optional).
"""
import os

import numpy as np
from safetensors.numpy import save_file

EPS = 1e-5


def numpy_state(rng):
    return {
        "bn.weight": rng.uniform(0.5, 1.5, 3).astype(np.float32),
        "bn.bias": rng.uniform(-0.5, 0.5, 3).astype(np.float32),
        "bn.running_mean": rng.uniform(-1.0, 1.0, 3).astype(np.float32),
        "bn.running_var": rng.uniform(0.25, 2.0, 3).astype(np.float32),
        "bn.num_batches_tracked": np.array(7, dtype=np.int64),
        "fc.weight": rng.uniform(-0.3, 0.3, (2, 12)).astype(np.float32),
        "fc.bias": rng.uniform(-0.3, 0.3, 2).astype(np.float32),
    }


def eval_logits(sd, x):
    f = {k: v.astype(np.float64) for k, v in sd.items()}
    c = (slice(None), None, None)
    h = (x.astype(np.float64) - f["bn.running_mean"][c]) / np.sqrt(f["bn.running_var"][c] + EPS)
    h = h * f["bn.weight"][c] + f["bn.bias"][c]
    return (h.reshape(x.shape[0], -1) @ f["fc.weight"].T + f["fc.bias"]).astype(np.float32)


def main():
    rng = np.random.default_rng(11)
    sd = numpy_state(rng)
    x = rng.normal(0.0, 1.0, (4, 3, 2, 2)).astype(np.float32)
    y = eval_logits(sd, x)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:  # the same state in PyTorch's modules: its keys, its logits
        model = torch.nn.Sequential()
        model.add_module("bn", torch.nn.BatchNorm2d(3, eps=EPS))
        model.add_module("flat", torch.nn.Flatten())
        model.add_module("fc", torch.nn.Linear(12, 2))
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in sd.items()}, strict=True)
        model.eval()
        with torch.no_grad():
            ty = model(torch.from_numpy(x)).numpy()
        assert sorted(model.state_dict()) == sorted(sd), sorted(model.state_dict())
        assert np.abs(ty - y).max() < 1e-5, np.abs(ty - y).max()
        y = ty
    here = os.path.dirname(os.path.abspath(__file__))
    save_file(sd, os.path.join(here, "torch_bn.safetensors"))
    save_file({"x": x, "y": y}, os.path.join(here, "torch_bn_io.safetensors"))
    print("torch_bn.safetensors:", ", ".join(sorted(sd)), "| logits from", "torch" if torch else "numpy (float64)")
    print(y)


if __name__ == "__main__":
    main()
