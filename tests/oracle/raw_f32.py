"""The raw little-endian float32 files the C++ oracle tests write (tests/kernels/attention_test.cpp,
tests/transformer/moe/moe_layer_test.cpp), read as float64 torch tensors by the oracle scripts next to this file."""
import os
import sys

import numpy as np
import torch


def load(d, name, shape):
    """DIR/NAME.bin as a float64 tensor of `shape`; exits with an error naming the file when the size differs."""
    a = np.fromfile(os.path.join(d, name + ".bin"), dtype="<f4")
    if a.size != int(np.prod(shape)):
        sys.exit(f"error: {name}.bin has {a.size} floats, expected {shape}")
    return torch.from_numpy(a.reshape(shape).astype(np.float64))
