"""bfloat16 as the project carries it in numpy: uint16 arrays of the bit patterns
(api dtype='bfloat16'). The test workers build their data and references with these."""
from __future__ import annotations

import numpy as np


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (the kernels' rounding)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return bits.astype(np.uint16)


def from_bf16(b: np.ndarray) -> np.ndarray:
    """bfloat16 bits -> float32 (exact)."""
    return (b.astype(np.uint32) << 16).view(np.float32)
