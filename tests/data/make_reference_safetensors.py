#!/usr/bin/env python3
# make_reference_safetensors.py - writes reference.safetensors with the official safetensors library, for test_safetensors.c.
#
# Run from anywhere: python3 tests/data/make_reference_safetensors.py
# Needs numpy and safetensors (pip install numpy safetensors). The C test
# checks every value below, so change both together.
import os

import numpy as np
import safetensors

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "reference.safetensors")

METADATA = {"format": "np", "source": "alloy reference fixture"}


def tensors():
    return {
        "arange_f32": np.arange(12, dtype=np.float32).reshape(3, 4),
        # 0, 1, -2, 0.5, 65504 (max), -inf, smallest subnormal
        "half_f16": np.array([0.0, 1.0, -2.0, 0.5, 65504.0, -np.inf, 2.0**-24], dtype=np.float16),
        "wide_f64": np.array([[1.5, -2.25], [1e300, -0.0]], dtype=np.float64),
        "ints_i32": np.array([-(2**31), -1, 0, 2**31 - 1], dtype=np.int32),
        "ints_i64": np.array([-(2**63), -1, 2**40, 2**63 - 1], dtype=np.int64).reshape(2, 1, 2),
        "mask_bool": np.array([True, False, True, True, False], dtype=np.bool_),
        "scalar_f32": np.array(3.5, dtype=np.float32),  # rank 0
        "empty_i64": np.zeros((0, 3), dtype=np.int64),  # zero elements
    }


# bf16 bit patterns: 1.0, -2.0, 3.140625, +inf
BF16_BITS = np.array([0x3F80, 0xC000, 0x4049, 0x7F80], dtype="<u2")


def main():
    # safetensors.numpy.save_file cannot write BF16 (numpy has no bfloat16), so
    # this calls the serializer save_file wraps, with the same per-tensor specs
    # it builds (safetensors.numpy._flatten), plus one BF16 tensor given as raw
    # little-endian uint16 bits.
    ts = tensors()
    ts_bits = dict(ts, bits_bf16=BF16_BITS)
    dtypes = {k: v.dtype.name for k, v in ts.items()}
    dtypes["bits_bf16"] = "bfloat16"
    spec_cls = getattr(safetensors, "TensorSpec", None)
    if spec_cls is not None:  # safetensors >= 0.7: specs point at the arrays
        specs = {k: spec_cls(dtype=dtypes[k], shape=v.shape, data_ptr=v.ctypes.data,
                             data_len=v.nbytes) for k, v in ts_bits.items()}
    else:  # older releases take the bytes
        specs = {k: {"dtype": dtypes[k], "shape": v.shape, "data": v.tobytes()}
                 for k, v in ts_bits.items()}
    safetensors.serialize_file(specs, OUT, metadata=METADATA)
    os.chmod(OUT, 0o644)


if __name__ == "__main__":
    main()
