"""A steady step's message in one native call (native/algorithms/vote_step.h), on a
one-rank shared-memory algorithm in this process: [vote | other | data] summed, the
result copied out only when every rank voted, times the factor as numpy multiplies
it on the Python path (bit for bit), the output untouched otherwise."""
import numpy as np
import pytest

from netreduce import _native


@pytest.fixture
def alone():
    seg = _native.ShmSegment.create(1, 64 * 1024, 2)
    h = _native.Hierarchical(seg, None, [0], "testhost", 10.0)
    h.start(5.0)
    return h


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("factor", [1.0, 0.25, 1 / 3, -7.1])
@pytest.mark.parametrize("shape", [(1,), (5,), (3, 300), ()])
def test_the_result_is_numpys_product(alone, dtype, factor, shape):
    src = np.random.default_rng(7).standard_normal(shape).astype(dtype)
    src_before = src.copy()
    buf = np.full(src.size + 2, 99, dtype)
    out = np.empty_like(src)
    assert alone.vote_step(src, buf, out, factor, 1) == 1   # complete, nothing else said
    want = src.copy() if factor == 1.0 else np.multiply(src, factor)
    assert out.dtype == want.dtype and out.tobytes() == want.tobytes()
    assert buf[0] == 1 and buf[1] == 0 and np.array_equal(buf[2:], src.reshape(-1))
    assert np.array_equal(src, src_before)                  # the source is only read


def test_in_place(alone):
    x = np.arange(10, dtype=np.float32)
    buf = np.empty(12, np.float32)
    assert alone.vote_step(x, buf, x, 0.5, 1) == 1
    assert np.array_equal(x, np.arange(10, dtype=np.float32) * np.float32(0.5))


def test_a_missing_vote_leaves_the_output_untouched(alone):
    src = np.ones(6, np.float32)
    out = np.full(6, -3.0, np.float32)
    buf = np.empty(8, np.float32)
    assert alone.vote_step(src, buf, out, 1.0, 2) == 0      # one vote of two: discarded
    assert (out == -3.0).all()


@pytest.mark.parametrize("src,buf,out,match", [
    (np.ones(4, np.int32), np.ones(6, np.int32), np.ones(4, np.int32), "float32 or float64"),
    (np.ones(4, np.float64), np.ones(6, np.float32), np.ones(4, np.float32), "source array"),
    (np.ones(4, np.float32), np.ones(5, np.float32), np.ones(4, np.float32), "n \\+ 2"),
    (np.ones(4, np.float32), np.ones(6, np.float32), np.ones(3, np.float32), "n \\+ 2"),
    (np.ones(8, np.float32)[::2], np.ones(6, np.float32), np.ones(4, np.float32), "C-contiguous"),
])
def test_bad_buffers_are_refused(alone, src, buf, out, match):
    with pytest.raises(ValueError, match=match):
        alone.vote_step(src, buf, out, 1.0, 1)


def test_a_native_module_built_before_it_leaves_the_python_path(monkeypatch):
    """An algorithm offers vote_step only when its native module has it (a stale build
    must not fail the steady steps: Speculation.run_lone falls back to Python)."""
    from netreduce.algorithms.hierarchical import Hierarchical
    from netreduce.worker.dataplane import Connection
    h, conn = Hierarchical.__new__(Hierarchical), Connection.__new__(Connection)
    assert callable(h.vote_step) and callable(conn.vote_step)
    monkeypatch.delattr(_native.Hierarchical, "vote_step")
    monkeypatch.delattr(_native.Engine, "vote_step")
    assert h.vote_step is None and conn.vote_step is None
