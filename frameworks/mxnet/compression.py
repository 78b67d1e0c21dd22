"""Gradient compression for DistributedTrainer (horovod.mxnet.compression's API)."""
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
