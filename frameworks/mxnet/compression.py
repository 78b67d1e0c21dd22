"""Gradient compression for DistributedTrainer (horovod.mxnet.compression's API).

Why each adapter keeps this shell (the same shape in torch, tensorflow, mxnet): it holds
only its framework's three facts (float16's dtype, which dtypes are floating, the
cast) in the class shape horovod.mxnet.compression has, which user code subclasses;
the logic is netreduce/compression.py's."""
from __future__ import annotations

from netreduce.compression import Compressor, HalfCompressor, NoneCompressor

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor"]


class FP16Compressor(HalfCompressor):
    """Floating-point gradients travel as float16; the aggregator sums float16 in
    float32 and rounds once (docs/protocol.md)."""

    half = "float16"

    @staticmethod
    def wants_half(dtype):
        return "float" in str(dtype) and str(dtype) != "float16"

    @staticmethod
    def cast(tensor, dtype):
        return tensor.astype(dtype)


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
