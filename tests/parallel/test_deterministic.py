"""NETREDUCE_DETERMINISTIC=1: a slot's float result is the rank-order fold of the
contributions, bit for bit, whatever order their packets arrive in; without it the
aggregator adds in arrival order and the bits can differ (shown here, so that the
deterministic checks can fail).

Two levels: hand-made packets sent to a real daemon in every arrival order (exact
control of the order), and real ranks through the engine whose arrival order is
shuffled by staggered sleeps. Plus the admission rule: every rank must agree."""
from __future__ import annotations

import itertools
import time
import uuid

import numpy as np
import pytest

from netreduce import _native
from netreduce.worker import dataplane
from netreduce.protocol.client import ControlClient
from netreduce.errors import AdmissionError
from tests.parallel.ranks import run_ranks
from tests.raw_register import data_socket, register

N = 3
COUNT = 64  # elements per packet; one slot


def _contributions(dtype):
    """Mixed magnitudes: 1 + 1e8 - 1e8 is 0 or 1 in float32 depending on the order."""
    rng = np.random.default_rng(5)
    scale = {"float32": 1e8, "float16": 2e3}[dtype]
    big = rng.uniform(0.5, 1.0, COUNT) * scale
    parts = [rng.uniform(-1, 1, COUNT), big, -big + rng.uniform(-1, 1, COUNT)]
    return [p.astype(dtype) for p in parts]


def _rank_order_fold(parts, dtype):
    acc = parts[0].astype(np.float32)  # 16-bit floats accumulate in float32
    for p in parts[1:]:
        acc = acc + p.astype(np.float32)
    return acc.astype(dtype)


def _register(address, job, deterministic):
    clients = [ControlClient(address) for _ in range(N)]
    socks = [data_socket(c) for c in clients]  # rank r's packets come from socks[r]
    grants = [register(c, job, r, N, socks[r], deterministic=deterministic)
              for r, c in enumerate(clients)]
    return clients, socks, grants[-1]


def _one_round(grant, socks, parts, order, psn, dtype):
    """Rank order[0]'s contribution first, then order[1]'s, ...: the result bytes."""
    code = _native.DTYPES[dtype]
    for r in order:
        payload = parts[r].tobytes()
        fields = {"jumbo": 1, "length": len(payload), "dtype": code, "op": 0,
                  "key": grant["key"], "dest_qp": (grant["job_index"] << 12) | r,
                  "slot": 0, "shadow": psn & 1, "psn": psn, "msg_id": psn}
        pkt = _native.encode_header(fields) + payload + b"\0" * ((-len(payload)) % 4) + b"\0" * 4
        socks[r].sendto(pkt, ("127.0.0.1", grant["data_port"]))
        time.sleep(0.002)  # one datagram at a time: the daemon sees them in this order
    results = []
    for r in range(N):
        while True:
            data = socks[r].recv(70000)
            h = _native.decode_header(data)
            if h["psn"] == psn:
                break
        results.append(data[32:32 + h["length"]])
    assert results[0] == results[1] == results[2]  # one result, fanned out
    return results[0]


def _results_by_order(address, dtype, deterministic):
    job = "det-" + uuid.uuid4().hex[:8]
    clients, socks, grant = _register(address, job, deterministic)
    try:
        for s in socks:
            s.settimeout(10)
        parts = _contributions(dtype)
        out = {}
        for psn, order in enumerate(itertools.permutations(range(N))):
            raw = _one_round(grant, socks, parts, order, psn, dtype)
            out[order] = np.frombuffer(raw, dtype=dtype).copy()
        counters = clients[0].call("counters", job=job)["jobs"][job]
        return parts, out, counters
    finally:
        for s in socks:
            s.close()
        for c in clients:
            c.close()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_every_arrival_order_gives_the_rank_order_fold(switch, dtype):
    parts, out, counters = _results_by_order(switch.address, dtype, True)
    want = _rank_order_fold(parts, dtype)
    for order, got in out.items():
        assert got.tobytes() == want.tobytes(), f"arrival order {order}"
    assert counters["deterministic"] == 1
    # orders other than (0, 1, 2) made contributions wait for a lower rank's
    assert counters["ordered_staged"] > 0


def test_arrival_order_changes_the_bits_without_it(switch):
    """The reason for the knob: the default mode adds as packets come."""
    parts, out, counters = _results_by_order(switch.address, "float32", False)
    assert counters["deterministic"] == 0
    distinct = {got.tobytes() for got in out.values()}
    assert len(distinct) > 1, "every arrival order gave the same bits: the test data is too tame"
    # and in the default mode, arrival order (a, b, c) computes (c_a + c_b) + c_c
    for order, got in out.items():
        a, b, c = (parts[r] for r in order)
        assert got.tobytes() == ((a + b) + c).tobytes(), order


def _shuffled_ranks(rank, size, address, job, deterministic, rounds):
    """Each round the ranks send in another order (staggered sleeps); returns the
    result of every round."""
    rng = np.random.default_rng(11)
    orders = [rng.permutation(size) for _ in range(rounds)]
    parts = _contributions("float32")
    results = []
    with dataplane.connect(address, job, rank, size, timeout=20.0,
                           deterministic=deterministic) as conn:
        assert conn.deterministic == deterministic
        for i in range(rounds):
            conn.allreduce(np.zeros(1, np.float32))  # line the ranks up
            time.sleep(0.015 * int(np.flatnonzero(orders[i] == rank)[0]))
            mine = parts[rank].copy()
            conn.allreduce(mine)
            results.append(mine.tobytes())
    return results


def test_shuffled_ranks_repeat_bit_for_bit(switch):
    parts = _contributions("float32")
    want = _rank_order_fold(parts, "float32").tobytes()
    runs = [run_ranks(_shuffled_ranks, N, switch.address, "det-" + uuid.uuid4().hex[:8], True, 8)
            for _ in range(2)]
    for run in runs:
        for rank_results in run:
            assert all(r == want for r in rank_results)
    plain = run_ranks(_shuffled_ranks, N, switch.address, "det-" + uuid.uuid4().hex[:8], False, 8)
    assert any(r != want for r in plain[0]), "shuffled arrival never changed the default sum"


def test_ranks_that_disagree_are_refused_naming_both(switch):
    job = "det-" + uuid.uuid4().hex[:8]
    with ControlClient(switch.address) as first:
        register(first, job, 0, 2, deterministic=True)
        with pytest.raises(AdmissionError, match=r"rank 1 has NETREDUCE_DETERMINISTIC=0, but "
                                                 r"rank 0 admitted the job with "
                                                 r"NETREDUCE_DETERMINISTIC=1"):
            dataplane.connect(switch.address, job, 1, 2, timeout=5.0, deterministic=False)


def test_ranks_with_different_windows_are_refused_naming_both(switch):
    """NETREDUCE_WINDOW sets which slot a chunk takes (its sequence mod the window): a
    rank whose window differs would add chunks of other offsets into the same slots.
    It is refused at admission, naming both ranks' values; the job stays open for a
    rank that agrees."""
    job = "win-" + uuid.uuid4().hex[:8]
    with ControlClient(switch.address) as first:
        register(first, job, 0, 2, window=4)
        with pytest.raises(AdmissionError, match=r"job '.*': rank 1 has NETREDUCE_WINDOW=8, but "
                                                 r"rank 0 has NETREDUCE_WINDOW=4"):
            dataplane.connect(switch.address, job, 1, 2, timeout=5.0, window=8)
        conn = dataplane.connect(switch.address, job, 1, 2, timeout=5.0, window=4)
        try:
            assert conn.payload_bytes > 0
        finally:
            conn.close()
