"""An Average's divide in the engine's copy of each result into place (issue 33, a
rank's CPU per training step): ``Connection.allreduce_async(..., scale=f)`` delivers
the sum times f, bit for bit what numpy's multiply of the sum gives, on both receive
paths (batches into staging at RoCE-sized payloads; jumbo datagrams straight into
place), in place and into another buffer; a tensor reduced in place through the
communicator is handed to the engine with its factor instead of multiplied after."""
from __future__ import annotations

import uuid

import numpy as np
import pytest

from netreduce.worker import dataplane, group_message
from tests.parallel.ranks import run_ranks


def _job() -> str:
    return "test-" + uuid.uuid4().hex[:8]


def _data(rank: int, dtype: str, count: int, case: int) -> np.ndarray:
    # whole numbers: the sum is exact in any order, so only the product's rounding is
    # left to compare
    rng = np.random.default_rng(1000 * case + rank)
    return rng.integers(-50_000, 50_000, count).astype(dtype)


def _scaled(rank, size, address, job, counts):
    with dataplane.connect(address, job, rank, size, timeout=30.0) as conn:
        case = 0
        for dtype in ("float32", "float64"):
            for factor in (1.0 / size, 0.25 / size, 3.0):
                for count in counts:
                    for in_place in (True, False):
                        case += 1
                        mine = _data(rank, dtype, count, case)
                        before = mine.copy()
                        dst = None if in_place else np.full(count, np.nan, dtype)
                        out = conn.allreduce_async(mine, dst, scale=factor).wait()
                        total = _data(0, dtype, count, case)
                        for r in range(1, size):
                            total += _data(r, dtype, count, case)
                        want = np.multiply(total, factor)  # the Python path's copy_out
                        assert out.dtype == want.dtype
                        assert out.tobytes() == want.tobytes(), (dtype, factor, count, in_place)
                        if not in_place:
                            assert mine.tobytes() == before.tobytes()
        # only a float sum into every rank is scaled; the engine stays usable after
        with pytest.raises(Exception, match="scaled result"):
            conn.allreduce_async(np.ones(8, np.int32), scale=0.5).wait()
        with pytest.raises(Exception, match="scaled result"):
            conn.allreduce_async(np.ones(8, np.float32), op="max", scale=0.5).wait()
        a = np.ones(5, np.float32)
        conn.allreduce(a)
        assert (a == size).all()
        return conn.stats()["messages"]


@pytest.mark.parametrize("payload", [4096, 65464])
def test_scaled_results_exact_on_both_receive_paths(payload):
    from netreduce.switch import spawn

    # 1023 + 1 elements of float32 per 4 KiB packet; a message of several windows
    with spawn(payload_bytes=payload, slots=64) as sw:
        run_ranks(_scaled, 3, sw.address, _job(), [1, 1025, 200_003])


class _Sig:
    postscale = 1.0
    prescale = 1.0


class _T:
    def __init__(self, dtype, op, postscale=1.0, kind="allreduce"):
        from netreduce.ops import ReduceOp

        self.dtype, self.kind = dtype, kind
        self.op = getattr(ReduceOp, op)
        self.sig = _Sig()
        self.sig.postscale = postscale


class _Comm:
    size = 4

    def __init__(self, scales: bool):
        class _DP:
            scales_results = scales
        self.dp = _DP()


def test_engine_scale_takes_float_sums_of_an_algorithm_that_scales():
    scaling, plain = _Comm(True), _Comm(False)
    assert group_message.engine_scale(scaling, _T("float32", "Average"), "sum") == 0.25
    assert group_message.engine_scale(scaling, _T("float64", "Average", 2.0), "sum") == 0.5
    assert group_message.engine_scale(scaling, _T("float32", "Sum", 0.5), "sum") == 0.5
    assert group_message.engine_scale(scaling, _T("float32", "Sum"), "sum") == 1.0
    # the Python path keeps what the engine does not take
    assert group_message.engine_scale(plain, _T("float32", "Average"), "sum") == 1.0
    assert group_message.engine_scale(scaling, _T("float16", "Average"), "sum") == 1.0
    assert group_message.engine_scale(scaling, _T("int32", "Average"), "sum") == 1.0
    assert group_message.engine_scale(scaling, _T("float32", "Max", 2.0), "max") == 1.0
    assert group_message.engine_scale(scaling, _T("float32", "Sum", kind="broadcast"),
                                      "sum") == 1.0
