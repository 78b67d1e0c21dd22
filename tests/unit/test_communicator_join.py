"""join(), Horovod's uneven inputs, ranks as threads on the fake server and fabric
(test_communicator.py: the values)."""
import numpy as np
import pytest

import netreduce as nr
from netreduce.errors import NegotiationError


@pytest.mark.parametrize("size", [1, 2, 3])
def test_join_with_uneven_steps(ranks, size):
    """Rank r runs r+1 steps then joins: a joined rank contributes zeros to the others'
    all-reduces (plain, grouped, fused async), Average still divides by size()."""
    def fn(r):
        got = []
        for step in range(r + 1):
            live = [q for q in range(size) if q >= step]
            s = nr.allreduce(np.full((2, 3), r + 1, np.float32), op=nr.Sum, name="s")
            a = nr.allreduce(np.full(4, r + 1, np.float64), name="avg")
            g = nr.grouped_allreduce([np.full(5, r + 1, np.int32), np.full(2, 1, np.int8)],
                                     op=nr.Sum, name="g")
            hs = [nr.allreduce_async(np.full(3, r + 1, np.float16), op=nr.Sum, name=f"f{i}")
                  for i in range(3)]
            fs = [nr.synchronize(h) for h in hs]
            want = sum(q + 1 for q in live)
            got.append(((s == want).all(), np.allclose(a, want / size), (g[0] == want).all(),
                        (g[1] == len(live)).all(), all((f == want).all() for f in fs)))
        last = nr.join()
        again = nr.allreduce(np.ones(2, np.float32), op=nr.Sum, name="after")
        return got, last, again
    for got, last, again in ranks(size).run(fn):
        assert all(all(step) for step in got), got
        assert last == size - 1
        assert (again == size).all()


def test_join_twice_and_barrier_and_bfloat16(ranks):
    bits = (np.array([1.0, -2.0], np.float32).view(np.uint32) >> 16).astype(np.uint16)

    def fn(r):
        lasts = []
        for epoch in range(2):
            joiner = epoch  # rank 0 joins first in epoch 0, rank 1 in epoch 1
            if r == joiner:
                lasts.append(nr.join())
                continue
            out = nr.allreduce(bits, op=nr.Sum, name="bf", dtype="bfloat16")
            assert ((out.astype(np.uint32) << 16).view(np.float32) == [1.0, -2.0]).all()
            nr.barrier()
            lasts.append(nr.join())
        return lasts
    assert ranks(2).run(fn) == [[1, 0], [1, 0]]


def test_broadcast_and_allgather_while_joined_raise(ranks):
    def fn(r):
        if r == 0:
            last = nr.join()
        else:
            with pytest.raises(NegotiationError, match="Broadcast is not supported with Join"):
                nr.broadcast(np.ones(3, np.float32), root_rank=1)
            with pytest.raises(NegotiationError, match="Allgather is not supported with Join"):
                nr.allgather_object(r)
            # still usable: the all-reduce goes on with rank 0's zeros
            ok = nr.allreduce(np.ones(2, np.float32), op=nr.Sum)
            assert (ok == 2).all()
            oks = nr.grouped_allreduce([np.ones(2, np.float32)] * 2, op=nr.Sum)
            assert all((o == 2).all() for o in oks)
            last = nr.join()
        # unnamed calls still pair up: the joined rank kept its auto-name counters in step
        assert nr.allgather_object(r) == [0, 1, 2]
        assert (nr.allreduce(np.ones(2, np.float32), op=nr.Sum) == 3).all()
        assert (nr.broadcast(np.full(2, r, np.float32), root_rank=2) == 2).all()
        return last
    lasts = ranks(3).run(fn)
    assert len(set(lasts)) == 1 and lasts[0] in (1, 2)  # whichever of 1, 2 joined last
