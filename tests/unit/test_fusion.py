"""Fusion groups (cut by the coordinator) and the rank's reused buffer."""
import numpy as np
import pytest

from netreduce.worker.fusion_buffer import FusionBuffer
from netreduce.protocol.fusion import plan

F32 = ("float32", "sum")
F16 = ("float16", "sum")


def test_same_key_fuses_in_ready_order():
    items = [("a", F32, 100), ("b", F16, 10), ("c", F32, 100), ("d", F16, 10)]
    assert plan(items, 1000) == [[0, 2], [1, 3]]


def test_threshold_splits_groups():
    items = [(str(i), F32, 400) for i in range(5)]
    assert plan(items, 1000) == [[0, 1], [2, 3], [4]]


def test_bigger_than_threshold_goes_alone_and_barriers_never_fuse():
    items = [("a", F32, 10), ("big", F32, 5000), ("b", F32, 10), ("bar", None, 0),
             ("bar2", None, 0)]
    assert plan(items, 1000) == [[0, 2], [1], [3], [4]]


def test_ops_do_not_mix():
    assert plan([("a", ("float32", "sum"), 4), ("b", ("float32", "max"), 4)], 100) == [[0], [1]]


def test_buffer_is_allocated_once_and_reused():
    buf = FusionBuffer(1024)
    assert buf.allocations == 0  # lazily: a job that never fuses pays nothing
    a = buf.view(np.float32, 100)
    b = buf.view(np.float64, 128)
    assert buf.allocations == 1
    assert np.shares_memory(a, b)
    with pytest.raises(ValueError, match="exceeds the fusion buffer"):
        buf.view(np.float32, 257)


def test_offsets():
    assert FusionBuffer.offsets([3, 0, 2]) == [(0, 3), (3, 3), (3, 5)]
