#!/usr/bin/env python3
# make_mlp2_reference.py - writes the feeds, parameters and float64 NumPy reference output of mlp2.ir, for the alloyc_mlp2 test.
#
# Run from anywhere: python3 tests/data/make_mlp2_reference.py
# Needs numpy and safetensors (pip install numpy safetensors). Writes, next to
# this script:
#   mlp2_feeds.safetensors     x  f32[8,16]
#   mlp2_params.safetensors    w1 f32[16,32], b1 f32[32], w2 f32[32,4], b2 f32[4]
#   mlp2_expected.safetensors  y  f32[8,4], computed in float64 from the f32
#                              values above, then rounded to f32
# The values are fixed by SEED, so running it again rewrites the same bytes.
import os

import numpy as np
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 20240601


def main():
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w1 = (rng.standard_normal((16, 32)) * 0.25).astype(np.float32)
    b1 = (rng.standard_normal(32) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((32, 4)) * 0.25).astype(np.float32)
    b2 = (rng.standard_normal(4) * 0.1).astype(np.float32)

    f64 = np.float64
    h = np.maximum(x.astype(f64) @ w1.astype(f64) + b1.astype(f64), 0.0)
    y = (h @ w2.astype(f64) + b2.astype(f64)).astype(np.float32)

    # One metadata key: safetensors writes several in hash order, so the bytes
    # would change from run to run.
    meta = {"source": "tests/data/make_mlp2_reference.py seed %d" % SEED}
    outputs = {
        "mlp2_feeds.safetensors": {"x": x},
        "mlp2_params.safetensors": {"w1": w1, "b1": b1, "w2": w2, "b2": b2},
        "mlp2_expected.safetensors": {"y": y},
    }
    for name, tensors in outputs.items():
        path = os.path.join(HERE, name)
        save_file(tensors, path, metadata=meta)
        os.chmod(path, 0o644)


if __name__ == "__main__":
    main()
