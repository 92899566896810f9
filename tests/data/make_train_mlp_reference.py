#!/usr/bin/env python3
"""make_train_mlp_reference.py - batches, initial parameters and PyTorch's results for train_mlp.ir, for the alloyc_train test (tests/run_alloyc_train.sh).

Writes, next to this script (the values are fixed by SEED, so running it
again rewrites the same numbers):
  train_mlp_feeds.safetensors     x f32[4,8,4], labels i32[4,8]: 4 batches of 8
                                  samples (alloyc train: step s takes batch (s-1) mod 4)
  train_mlp_params.safetensors    w1 f32[4,16], b1 f32[16], w2 f32[16,3], b2 f32[3]
                                  (alloy's [in, out] matmul layout)
  train_mlp_batch0.safetensors    x f32[8,4], labels i32[8]: batch 0 alone
  train_mlp_grads.safetensors     grad:w1, grad:b1, grad:w2, grad:b2, grad:x and loss:
                                  the cross-entropy of batch 0 at those parameters and
                                  its gradients, by torch.autograd in float64, rounded
                                  to f32 (alloyc run --fetch grad:NAME)
  train_mlp_losses.txt            "step S loss L" for 12 steps of float32 PyTorch
                                  AdamW (lr 3e-3, betas 0.9 0.999, eps 1e-8, weight
                                  decay 0.01) from those parameters over the batches in
                                  turn (alloyc train --optimizer=adamw --lr 3e-3)

Run: python3 tests/data/make_train_mlp_reference.py (numpy, torch, safetensors).
"""
import os

import numpy as np
import torch
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 20250117
BATCHES, BATCH, FEATURES, HIDDEN, CLASSES, STEPS = 4, 8, 4, 16, 3, 12


def loss_of(params, x, labels):
    w1, b1, w2, b2 = params
    h = torch.relu(x @ w1 + b1)
    return torch.nn.functional.cross_entropy(h @ w2 + b2, labels)


def main():
    rng = np.random.default_rng(SEED)
    # features of a few units, labels from a fixed linear rule: learnable
    x = (rng.standard_normal((BATCHES, BATCH, FEATURES)) * 3).astype(np.float32)
    rule = rng.standard_normal((FEATURES, CLASSES))
    labels = np.argmax(x.astype(np.float64) @ rule, axis=-1).astype(np.int32)
    params = {
        "w1": (rng.standard_normal((FEATURES, HIDDEN)) * 0.5).astype(np.float32),
        "b1": (rng.standard_normal(HIDDEN) * 0.1).astype(np.float32),
        "w2": (rng.standard_normal((HIDDEN, CLASSES)) * 0.3).astype(np.float32),
        "b2": (rng.standard_normal(CLASSES) * 0.1).astype(np.float32),
    }
    names = ["w1", "b1", "w2", "b2"]

    # gradients of batch 0's loss in float64
    p64 = [torch.tensor(params[n], dtype=torch.float64, requires_grad=True) for n in names]
    x0 = torch.tensor(x[0], dtype=torch.float64, requires_grad=True)
    loss = loss_of(p64, x0, torch.tensor(labels[0], dtype=torch.long))
    loss.backward()
    grads = {"grad:" + n: p.grad.numpy().astype(np.float32) for n, p in zip(names, p64)}
    grads["grad:x"] = x0.grad.numpy().astype(np.float32)
    grads["loss"] = np.array(loss.item(), dtype=np.float32)

    # float32 AdamW over the batches in turn
    p32 = [torch.tensor(params[n], requires_grad=True) for n in names]
    opt = torch.optim.AdamW(p32, lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    lines = []
    for step in range(1, STEPS + 1):
        b = (step - 1) % BATCHES
        opt.zero_grad()
        loss = loss_of(p32, torch.tensor(x[b]), torch.tensor(labels[b], dtype=torch.long))
        loss.backward()
        opt.step()
        lines.append("step %d loss %.9g\n" % (step, loss.item()))

    # One metadata key: safetensors writes several in hash order, so the bytes
    # would change from run to run.
    meta = {"source": "tests/data/make_train_mlp_reference.py seed %d" % SEED}
    outputs = {
        "train_mlp_feeds.safetensors": {"x": x, "labels": labels},
        "train_mlp_params.safetensors": params,
        "train_mlp_batch0.safetensors": {"x": x[0].copy(), "labels": labels[0].copy()},
        "train_mlp_grads.safetensors": grads,
    }
    for name, tensors in outputs.items():
        path = os.path.join(HERE, name)
        save_file(tensors, path, metadata=meta)
        os.chmod(path, 0o644)
    with open(os.path.join(HERE, "train_mlp_losses.txt"), "w") as f:
        f.write("# float32 PyTorch %s AdamW on train_mlp.ir (make_train_mlp_reference.py)\n" % torch.__version__)
        f.writelines(lines)
    print("".join(lines), end="")


if __name__ == "__main__":
    main()
