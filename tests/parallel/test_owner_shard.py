"""Owner delivery without the owner's own data on the wire: in a reduce-scatter each
rank sends only the other ranks' stretches (its own as header-only packets, which
count in the slot), and combines its own contribution with the sum of the others
on arrival. A real daemon, 2 and 3 ranks, every dtype and op, in arrival and in
rank order (NETREDUCE_DETERMINISTIC), checked against numpy; and the bytes the
aggregator took in: (N-1)/N of the buffer per rank, not all of it."""
from __future__ import annotations

import itertools
import uuid

import numpy as np
import pytest

from netreduce.worker import dataplane
from tests.parallel.ranks import run_ranks

COUNT = 50_001  # several packets per stretch, stretches of unequal length
DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64"]
OPS = ["sum", "min", "max", "product"]


def _data(dtype, rank, count):
    rng = np.random.default_rng(900 + rank)
    if dtype.startswith("int"):
        return rng.integers(-9, 10, count).astype(dtype)  # products of 3 fit int32
    # halves of small integers: sums and products of 3 exact even in bfloat16
    values = rng.integers(-3, 4, count).astype(np.float32) / 2
    if dtype == "bfloat16":
        return (values.view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(dtype)


def _as_float(a, dtype):
    return (a.astype(np.uint32) << 16).view(np.float32) if dtype == "bfloat16" else a


def _bounds(count, size):
    return [(q * count // size, (q + 1) * count // size) for q in range(size)]


REDUCE = {"sum": np.sum, "min": np.min, "max": np.max, "product": np.prod}


def _ranks(rank, size, address, job, deterministic, in_place):
    checked = 0
    with dataplane.connect(address, job, rank, size, timeout=20.0,
                           deterministic=deterministic) as conn:
        for dtype, op in itertools.product(DTYPES, OPS):
            mine = _data(dtype, rank, COUNT)
            out = mine if in_place else np.zeros_like(mine)
            kw = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
            reqs = [conn.allreduce_async(mine[a:b], None if in_place else out[a:b], op=op,
                                         owner=q, **kw)
                    for q, (a, b) in enumerate(_bounds(COUNT, size))]
            for r in reqs:
                r.wait()
            a, b = _bounds(COUNT, size)[rank]
            every = np.stack([_as_float(_data(dtype, r, COUNT), dtype) for r in range(size)])
            want = REDUCE[op](every.astype(np.float64 if dtype != "int64" else np.int64), axis=0)
            got = _as_float(out, dtype)[a:b]
            np.testing.assert_array_equal(got, want[a:b].astype(got.dtype),
                                          err_msg=f"{dtype} {op} rank {rank}")
            checked += 1
        counters = conn.counters()["jobs"][job]
    return checked, counters


@pytest.mark.parametrize("size,deterministic,in_place",
                         [(2, False, True), (3, False, False), (3, True, True)])
def test_owner_combines_its_own_shard(switch, size, deterministic, in_place):
    job = "own-" + uuid.uuid4().hex[:8]
    results = run_ranks(_ranks, size, switch.address, job, deterministic, in_place)
    assert all(checked == len(DTYPES) * len(OPS) for checked, _ in results)


def _bytes_sent(rank, size, address, job):
    with dataplane.connect(address, job, rank, size, timeout=20.0) as conn:
        x = np.full(COUNT, rank + 1, np.float32)
        reqs = [conn.allreduce_async(x[a:b], None, op="sum", owner=q)
                for q, (a, b) in enumerate(_bounds(COUNT, size))]
        for r in reqs:
            r.wait()
        a, b = _bounds(COUNT, size)[rank]
        assert (x[a:b] == size * (size + 1) / 2).all()
        stats = conn.stats()
        return stats["bytes_sent"], stats["retransmits"]


@pytest.mark.parametrize("size", [2, 3])
def test_each_rank_sends_the_others_stretches_only(switch, size):
    job = "own-" + uuid.uuid4().hex[:8]
    results = run_ranks(_bytes_sent, size, switch.address, job)
    for rank, (sent, retransmits) in enumerate(results):
        a, b = _bounds(COUNT, size)[rank]
        others = (COUNT - (b - a)) * 4  # payload bytes of the other ranks' stretches
        assert sent == others or (retransmits > 0 and sent > others), (rank, sent, others)


_TWO_AGGREGATORS = """
import json, numpy as np, netreduce as nr
from netreduce import api
nr.init()
r, n = nr.rank(), nr.size()
dp = api._communicator().dp
x = (np.arange(400_003, dtype=np.float32) % 89) * (r + 1)
def out_bytes():
    # [all result bytes out, those that left once]: a result resent to a rank that
    # probed (retransmitted_results, at its mean packet size) is no second copy
    total = first = 0.0
    for c in dp.connections:
        for j in c.counters()["jobs"].values():
            if j.get("finished"):  # an earlier job's last counters (--finished-job-s)
                continue
            mean = j["bytes_out"] / j["packets_out"] if j["packets_out"] else 0.0
            total += j["bytes_out"]
            first += j["bytes_out"] - j["retransmitted_results"] * mean
    return [total, first]
nr.barrier(); b0 = out_bytes()
got = nr.api.reducescatter_async(x, op=nr.Sum, name="two.rs").wait()
nr.barrier(); b1 = out_bytes()
full = nr.allreduce(x, op=nr.Sum, name="two.ar")
lo, cnt = api.shard_rows(x.shape[0], n, r)
assert np.array_equal(got, full[lo:lo + cnt])
print("BYTES", json.dumps([type(dp).__name__, b1[0] - b0[0], b1[1] - b0[1]]), flush=True)
nr.shutdown()
"""


@pytest.mark.parametrize("ranks", [2, 3])
def test_owner_delivery_over_two_aggregators(ranks):
    """Each rank's stretch is spread over both aggregators, each part delivered to its
    owner alone: the results leave the aggregators once, not N times."""
    import json
    from netreduce.switch import spawn
    from tests.procs import launch_script
    switches = [spawn(host="127.0.0.1", port=0) for _ in range(2)]
    try:
        proc = launch_script(
            _TWO_AGGREGATORS, ranks, NETREDUCE_ALGORITHM="flat", NETREDUCE_TIMEOUT="20",
            NETREDUCE_SWITCH=",".join(f"127.0.0.1:{s.address[1]}" for s in switches),
            OMP_NUM_THREADS="1")
    finally:
        for s in switches:
            s.stop()
    assert proc.returncode == 0, proc.stdout[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if "BYTES" in ln)
    kind, rs_bytes, first_bytes = json.loads(line.split("BYTES", 1)[1])
    assert kind == "MultiAggregator"
    payload = 400_003 * 4
    assert payload <= rs_bytes, (rs_bytes, payload)  # every owner got its part
    assert first_bytes < 1.2 * payload, (first_bytes, rs_bytes, payload)  # one copy + headers


def _group_after_owner_delivery(rank, size, address, job):
    """Two all-reduces (the group heard: contributions say so), a quiet pause longer
    than a timeout but shorter than GroupWatch's second, an owner-delivered message
    (its results and notices come by unicast, by design), then an all-reduce: the
    aggregator's unicast copies of that last all-reduce's results, and its duplicates."""
    import time
    with dataplane.connect(address, job, rank, size, timeout=20.0) as conn:
        x = np.full(1 << 18, rank + 1, np.float32)  # 1 MiB: several chunks, one window
        for _ in range(2):
            conn.allreduce(x.copy())
        time.sleep(0.3)
        conn.allreduce_async(x.copy(), None, owner=0).wait()
        before = conn.counters()["jobs"][job]
        y = x.copy()
        conn.allreduce(y)
        assert (y == size * (size + 1) / 2).all()
        after = conn.counters()["jobs"][job]
        return {k: after[k] - before[k] for k in ("group_unicast_copies", "duplicates")}, \
            conn.stats()


def test_owner_delivery_results_are_no_sign_that_the_group_is_gone(switch):
    """Owner delivery answers by unicast even where the job has a multicast group
    (docs/protocol.md, "Reduce-scatter"), so its results say nothing of whether the
    group reaches a rank. Taken for the sign that it no longer does (a result by
    unicast while the group was silent for a timeout, engine/group_watch.h), they
    cleared each rank's group bit after every reduce-scatter, and the next all-reduce's
    first window came twice: by the group and by a unicast copy per rank."""
    job = "own-" + uuid.uuid4().hex[:8]
    results = run_ranks(_group_after_owner_delivery, 2, switch.address, job)
    for diff, stats in results:
        assert stats["group_datagrams"] > 0, stats  # the job has its group on loopback
        # A copy goes only to a rank whose resend came while the slot waited (a
        # duplicate); none for a group bit lost to owner delivery.
        assert diff["group_unicast_copies"] <= diff["duplicates"], diff


def _flat_ranks(rank, size, address, job, count):
    """Flat.reducescatter: the interleaved message for the stretches' whole chunks,
    per-owner messages for the rest; every dtype and op against numpy."""
    from netreduce.algorithms.flat import Flat
    with dataplane.connect(address, job, rank, size, timeout=20.0) as conn:
        flat = Flat(conn)
        for dtype, op in itertools.product(DTYPES, OPS):
            mine = _data(dtype, rank, count)
            bounds = _bounds(count, size)
            flat.reducescatter(mine, bounds, op=op,
                               dtype="bfloat16" if dtype == "bfloat16" else None)
            a, b = bounds[rank]
            every = np.stack([_as_float(_data(dtype, r, count), dtype) for r in range(size)])
            want = REDUCE[op](every.astype(np.float64 if dtype != "int64" else np.int64), axis=0)
            np.testing.assert_array_equal(_as_float(mine, dtype)[a:b],
                                          want[a:b].astype(_as_float(mine, dtype).dtype),
                                          err_msg=f"{dtype} {op} count {count} rank {rank}")
            # the other ranks' stretches still hold this rank's own contribution
            others = np.ones(count, bool)
            others[a:b] = False
            np.testing.assert_array_equal(mine[others], _data(dtype, rank, count)[others])
        return conn.stats()["bytes_sent"]


@pytest.mark.parametrize("size,count", [(2, 200_003), (3, 250_001), (3, 7)])
def test_flat_reducescatter_interleaved(switch, size, count):
    run_ranks(_flat_ranks, size, switch.address, "own-" + uuid.uuid4().hex[:8], count)
