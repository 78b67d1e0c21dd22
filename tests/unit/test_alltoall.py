"""The core's relayed alltoall (netreduce/alltoall.py) with ranks as threads on the
fakes: every rank's received rows and splits against a numpy reference, for world
sizes 1-4, several dtypes and trailing shapes, splits with zeros; Horovod's errors."""
import numpy as np
import pytest

import netreduce as nr
from netreduce.alltoall import check_splits
from netreduce.errors import InvalidArgumentError


def _rows(q, count, tail, dtype):
    n = count * int(np.prod(tail, dtype=np.int64))
    return (np.arange(n) + 1000 * q).astype(dtype).reshape((count,) + tail)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype,tail", [("float32", ()), ("int64", (3,)), ("float16", (2, 2))])
def test_alltoall_delivers_each_ranks_rows_in_rank_order(ranks, size, dtype, tail):
    def splits_of(q):  # q sends (q * d + 1) % 3 rows to d: some are zero
        return [(q * d + 1) % 3 for d in range(size)]

    def rank_fn(r):
        return nr.alltoall(_rows(r, sum(splits_of(r)), tail, dtype), splits_of(r), name="a")

    for r, (got, received) in enumerate(ranks(size).run(rank_fn)):
        pieces = [_rows(q, sum(splits_of(q)), tail, dtype)[sum(splits_of(q)[:r]):][
            :splits_of(q)[r]] for q in range(size)]
        np.testing.assert_array_equal(got, np.concatenate(pieces))
        assert got.dtype == np.dtype(dtype) and got.shape[1:] == tail
        assert received.dtype == np.int32
        assert received.tolist() == [splits_of(q)[r] for q in range(size)]


def test_alltoall_even_split_async_and_poll(ranks):
    def rank_fn(r):
        handle = nr.alltoall_async(np.arange(6, dtype=np.int32) + 10 * r)
        got, received = nr.synchronize(handle)
        assert nr.poll(handle)
        return got.tolist(), received.tolist()

    results = ranks(3).run(rank_fn)
    for r, (got, received) in enumerate(results):
        assert got == [10 * q + 2 * r + i for q in range(3) for i in range(2)]
        assert received == [2, 2, 2]


def test_check_splits_errors():
    assert check_splits(None, 6, 3).tolist() == [2, 2, 2]
    assert check_splits([0, 2], 5, 2).dtype == np.int32
    with pytest.raises(InvalidArgumentError, match="even multiple"):
        check_splits(None, 7, 3)
    with pytest.raises(ValueError, match="32-bit integer"):
        check_splits(np.array([1, 1], dtype=np.int64), 2, 2)
    with pytest.raises(ValueError, match="32-bit integer"):
        check_splits([1.0, 1.0], 2, 2)
    with pytest.raises(ValueError, match="does not equal number of workers"):
        check_splits([1, 1, 1], 3, 2)
    with pytest.raises(ValueError, match="greater than the first dimension"):
        check_splits([2, 2], 3, 2)
    with pytest.raises(ValueError, match="negative"):
        check_splits([-1, 2], 3, 2)
