"""Gradient compression for DistributedTrainer (horovod.mxnet.compression's API)."""
from __future__ import annotations

from typing import Any, Tuple


class Compressor:
    """compress(tensor) -> (tensor to reduce, context); decompress(tensor, context)."""

    @staticmethod
    def compress(tensor) -> Tuple[Any, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Floating-point gradients travel as float16 (half the bytes on the wire); the
    aggregator sums float16 in float32 and rounds once (docs/protocol.md)."""

    @staticmethod
    def compress(tensor):
        if "float" in str(tensor.dtype) and str(tensor.dtype) != "float16":
            return tensor.astype("float16"), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.astype(ctx)


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
