"""The flat data plane's per-call Python (issue 33, a rank's CPU per training step):
``Connection.allreduce_async`` builds the words that name the connection only when a
request fails, and ``check_reduction`` checks plain arrays with one look each -- the same
arrays accepted, the same errors raised, as its full checks."""
from __future__ import annotations

import types
from typing import Any, List

import numpy as np
import pytest

from netreduce import _native
from netreduce.algorithms import base
from netreduce.algorithms.base import check_reduction
from netreduce.worker import dataplane
from netreduce.worker.dataplane import Connection


class _Req:
    def __init__(self, error: str = "") -> None:
        self.error = error

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        if self.error:
            raise _native.EngineError(self.error)


def _connection(reqs: List[_Req]) -> Connection:
    conn = Connection.__new__(Connection)
    conn.__dict__.update(_closed=False, address=("127.0.0.1", 4791), rack=None, job="j",
                         rank=0, size=2,
                         _engine=types.SimpleNamespace(submit=lambda *a, **k: reqs.pop(0)))
    return conn


def test_a_request_names_its_connection_only_when_it_fails(monkeypatch):
    calls = []
    words = Connection._where

    def counted(self: Connection) -> str:
        calls.append(1)
        return words(self)

    monkeypatch.setattr(Connection, "_where", counted)
    conn = _connection([_Req(), _Req(), _Req("chunk 3 timed out")])
    x = np.ones(16, np.float32)
    out = np.empty_like(x)
    assert conn.allreduce_async(x, out).wait() is out
    assert conn.allreduce_async(x).wait() is x
    assert calls == []  # main built them per call, for the error that never came
    failing = conn.allreduce_async(x, out)
    with pytest.raises(dataplane.DataPlaneError) as info:
        failing.wait()
    assert str(info.value) == "aggregator 127.0.0.1:4791, job 'j', rank 0/2: chunk 3 timed out"
    assert calls == [1]


def _cases() -> List[Any]:
    f32 = np.arange(8, dtype=np.float32)
    ro = f32.copy()
    ro.flags.writeable = False
    swapped = f32.astype(">f4")
    sub = f32.copy().view(np.matrix)
    return [
        (f32, None, "sum", None), (f32, np.empty_like(f32), "min", None),
        (np.arange(8, dtype=np.float64), None, "max", None),
        (np.arange(8, dtype=np.int64), np.zeros(8, np.int64), "product", None),
        (np.arange(8, dtype=np.float16), None, "sum", None),
        (np.zeros(8, np.int16), None, "sum", "bfloat16"),  # bfloat16 bits: named
        (f32, None, "sum", "float32"), (f32, None, "sum", "float64"),
        (swapped, None, "sum", None), (np.arange(8, dtype=np.uint8), None, "sum", None),
        (f32[::2], None, "sum", None), (f32, np.empty(16, np.float32)[::2], "sum", None),
        (ro, None, "sum", None), (f32, ro, "sum", None), (ro, np.empty_like(f32), "sum", None),
        (f32, np.empty(8, np.float64), "sum", None), (f32, np.empty(4, np.float32), "sum", None),
        (f32, np.empty(8, np.int32), "sum", None), (f32, None, "avg", None),
        (f32, f32.tolist(), "sum", None), (f32.tolist(), None, "sum", None),
        (sub, None, "sum", None), (f32.reshape(2, 4), np.empty((4, 2), np.float32), "sum", None),
    ]


@pytest.mark.parametrize("case", range(len(_cases())))
def test_the_one_look_is_the_full_check(case):
    src, dst, op, dtype = _cases()[case]
    try:
        want = base._check_in_full(src, dst, op, dtype, "the aggregator")
    except Exception as exc:  # the same error, the same words
        with pytest.raises(type(exc)) as info:
            check_reduction(src, dst, op, dtype, "the aggregator")
        assert str(info.value) == str(exc)
        return
    got = check_reduction(src, dst, op, dtype, "the aggregator")
    assert got[0] is want[0] and got[1] is want[1] and got[2] == want[2]


def test_plain_arrays_take_one_look(monkeypatch):
    """The executor's arrays (plain, C-contiguous, writeable, a carried dtype) never
    reach the full checks: every caller of check_reduction gets the one look."""
    def full(*args: Any) -> Any:
        raise AssertionError("the full checks ran for a plain array")

    monkeypatch.setattr(base, "_check_in_full", full)
    x = np.ones(16, np.float32)
    out = np.empty_like(x)
    assert check_reduction(x, out, "sum", None, "netreduce")[1] is out
    assert check_reduction(np.ones(4, np.int64), None, "max", None, "netreduce")[2] == "int64"
    conn = _connection([_Req()])
    assert conn.allreduce_async(x, out).wait() is out
