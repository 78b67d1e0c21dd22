"""Gradient compression applied around an all-reduce (horovod.torch.Compression).

Why each adapter keeps this shell (the same shape in torch, tensorflow, mxnet): it holds
only its framework's three facts (float16's dtype, which dtypes are floating, the
cast) in the class shape horovod.torch.compression has, which user code subclasses;
the logic is netreduce/compression.py's."""
from __future__ import annotations

import torch

from netreduce.compression import Compressor, HalfCompressor, NoneCompressor

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor"]


class FP16Compressor(HalfCompressor):
    """Floating-point tensors travel as float16; the aggregator accumulates float16 in
    float32 and rounds once."""

    half = torch.float16

    @staticmethod
    def wants_half(dtype):
        return dtype.is_floating_point and dtype != torch.float16

    @staticmethod
    def cast(tensor, dtype):
        return tensor.type(dtype)


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
