#!/usr/bin/env python3
# make_overflow_feeds.py - writes the two feed files of overflow.ir (two batches each): x f32[2,4,8], labels i32[2,4].
#
# Run from anywhere: python3 tests/data/make_overflow_feeds.py (the standard library only). x[b,i,j] is
# SCALE * ((i * 8 + j) % 7 - 3) / 3, labels[b,i] = (i + b) % 3:
#   overflow_backward.safetensors  SCALE 100: the forward fits f16, a weight gradient overflows until the scale backs off
#   overflow_forward.safetensors   SCALE 3e4: the first matmul overflows f16 in the forward
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(path, scale):
    x = [scale * ((i * 8 + j) % 7 - 3) / 3 for b in range(2) for i in range(4) for j in range(8)]
    labels = [(i + b) % 3 for b in range(2) for i in range(4)]
    xb = struct.pack("<%df" % len(x), *x)
    lb = struct.pack("<%di" % len(labels), *labels)
    header = {
        "labels": {"dtype": "I32", "shape": [2, 4], "data_offsets": [0, len(lb)]},
        "x": {"dtype": "F32", "shape": [2, 4, 8], "data_offsets": [len(lb), len(lb) + len(xb)]},
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + lb + xb)


write(os.path.join(HERE, "overflow_backward.safetensors"), 100.0)
write(os.path.join(HERE, "overflow_forward.safetensors"), 3e4)
