#!/usr/bin/env python3
"""make_torch_linear_reference.py - a PyTorch MLP's state_dict and one forward pass, for alloy's PyTorch-interop test: writes tests/data/torch_mlp.safetensors.

Model: fc1 = Linear(8, 16), ReLU, fc2 = Linear(16, 4) (torch.manual_seed(3));
the file holds the state_dict as PyTorch names and lays it out
("fc1.weight" [16, 8], "fc1.bias" [16], ...), an input "x" [5, 8] and
PyTorch's output "y" [5, 4] in float32. test_train.c builds the same model
with alloy_linear, loads the parameters with alloy_graph_load_params (x and
y are counted as ignored), checks y, and checks that alloy_graph_save_params
writes the same names, shapes and bytes back (so the file alloy writes loads
into this module with strict=True).

Run: python3 tests/data/make_torch_linear_reference.py (torch, safetensors).
"""
import os

import torch
from safetensors.torch import save_file


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def main():
    torch.manual_seed(3)
    model = MLP()
    x = torch.randn(5, 8)
    with torch.no_grad():
        y = model(x)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    tensors.update({"x": x, "y": y})
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_mlp.safetensors")
    save_file(tensors, out, metadata={"torch_version": torch.__version__})
    # the file alloy writes back must load into the module strictly
    model.load_state_dict({k: tensors[k] for k in model.state_dict()}, strict=True)
    print(f"torch {torch.__version__}: wrote {out} ({', '.join(sorted(tensors))})")


if __name__ == "__main__":
    main()
