"""Gradient compression around a collective: Horovod's Compressor contract, framework-free.

compress() runs before the all-reduce and returns (tensor to send, context);
decompress(tensor, context) runs after it, on every rank. The frameworks' adapters
subclass HalfCompressor with their own dtype test and cast; the arithmetic the
aggregator does on float16 (accumulate in float32, round once) is in docs/protocol.md.
"""
from __future__ import annotations

from typing import Any, Tuple


class Compressor:
    """compress() runs before the all-reduce, decompress() after it, on every rank."""

    @staticmethod
    def compress(tensor: Any) -> Tuple[Any, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends the tensor as it is."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class HalfCompressor(Compressor):
    """Floating-point tensors travel as float16 (half the bytes on the wire) and come
    back in their own dtype; other dtypes pass unchanged. A framework supplies
    `half` (its float16 dtype), `wants_half(dtype)` and `cast(tensor, dtype)`."""

    half: Any = None

    @staticmethod
    def wants_half(dtype: Any) -> bool:
        """True for a floating-point dtype other than float16."""
        raise NotImplementedError

    @staticmethod
    def cast(tensor: Any, dtype: Any) -> Any:
        raise NotImplementedError

    @classmethod
    def compress(cls, tensor):
        if cls.wants_half(tensor.dtype):
            return cls.cast(tensor, cls.half), tensor.dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor if ctx is None else cls.cast(tensor, ctx)
