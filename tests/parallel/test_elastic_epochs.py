"""An elastic job resized in place at a real netreduce-switch (switch/epochs.py): a
register naming a later membership epoch ends the job's run and admits the next at
its own world size, without touching another job or restarting the daemon; an
earlier epoch is refused; packets of the old membership — a stale rank's, under
loss — never add into a result of the new one."""
from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import pytest

from netreduce.errors import AdmissionError, DataPlaneError
from netreduce.protocol.client import ControlClient
from netreduce.switch import spawn
from netreduce.worker import dataplane


def _job() -> str:
    return "epochs-" + uuid.uuid4().hex[:8]


def _connect_all(monkeypatch, address, job, size, epoch, ranks=None, **kw):
    """Connections of ``ranks`` (all of ``size``) at ``epoch``, registered together (the
    last register waits for the others' payload answers)."""
    monkeypatch.setenv("NETREDUCE_EPOCH", str(epoch))
    ranks = list(range(size)) if ranks is None else ranks
    conns, errors = {}, []

    def one(r):
        try:
            conns[r] = dataplane.connect(address, job, r, size, **dict(dict(timeout=10.0), **kw))
        except Exception as exc:  # handed to the test
            errors.append(exc)
    threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return [conns[r] for r in ranks]


def _sum_all(conns, values, count=50_000):
    """Every connection all-reduces ``values[i]`` (a constant array); the results."""
    out = [None] * len(conns)

    def one(i):
        out[i] = conns[i].allreduce(np.full(count, values[i], dtype=np.float32))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(conns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def _counters(address):
    with ControlClient(address) as c:
        return c.call("counters")


def test_a_later_epoch_resizes_the_job_and_leaves_other_jobs_alone(monkeypatch):
    job, other = _job(), _job()
    with spawn(host="127.0.0.1", port=0) as sw:
        bystanders = _connect_all(monkeypatch, sw.address, other, 2, 0)
        # timeout: how long the stale rank at the end waits for its result (a chunk with
        # none for this long fails); nothing else here comes near it
        first = _connect_all(monkeypatch, sw.address, job, 3, 1, timeout=1.5)
        assert all((r == 3).all() for r in _sum_all(first, [0, 1, 2]))
        before = _counters(sw.address)
        assert before["jobs"][job]["epoch"] == 1 and before["jobs"][job]["size"] == 3

        second = _connect_all(monkeypatch, sw.address, job, 2, 2)  # epoch 1's ranks still open
        assert all((r == 7).all() for r in _sum_all(second, [3, 4]))
        after = _counters(sw.address)
        moved = after["jobs"][job]
        assert (moved["epoch"], moved["size"], moved["resizes"], sorted(moved["ranks"])) == \
            (2, 2, 1, [0, 1])
        assert after["global"]["job_resizes"] == 1
        # the bystander job kept its run: same index, still summing
        assert after["jobs"][other]["index"] == before["jobs"][other]["index"]
        assert all((r == 11).all() for r in _sum_all(bystanders, [5, 6]))

        # a rank of the old membership cannot come back into it
        with pytest.raises(AdmissionError, match="moved on to epoch 2"):
            _connect_all(monkeypatch, sw.address, job, 3, 1, ranks=[1])
        # ... and a stale rank's data plane gets no result (its pool is gone)
        t0 = time.monotonic()
        with pytest.raises(DataPlaneError):
            first[0].allreduce(np.ones(1000, np.float32))
        assert time.monotonic() - t0 < 30
        for c in first + second + bystanders:
            c.close()


def test_packets_of_the_old_membership_never_add_into_the_new_one_under_loss(monkeypatch):
    job = _job()
    lossy = dict(drop_rate=0.05, retransmit_ms=2.0)
    with spawn(host="127.0.0.1", port=0) as sw:
        # timeout: the stale rank's wait at the end, as above (at 5 % loss a chunk is
        # resent every 2 ms)
        old = _connect_all(monkeypatch, sw.address, job, 3, 1, timeout=1.5, **lossy)
        assert all((r == 3).all() for r in _sum_all(old, [0, 1, 2]))
        new = _connect_all(monkeypatch, sw.address, job, 2, 2, **lossy)
        before = _counters(sw.address)["global"]
        # The old rank 2 keeps streaming (a stale member that has not noticed), with
        # the old job index and key, while the new membership sums.
        stale = old[2].allreduce_async(np.full(400_000, 1000.0, dtype=np.float32))
        for step in range(10):
            results = _sum_all(new, [step, 2 * step], count=200_000)
            for r in results:
                assert (r == 3 * step).all(), f"step {step}: {np.unique(r)[:5]}"
        after = _counters(sw.address)["global"]
        rejected = sum(after[k] - before[k] for k in ("drop_bad_key", "drop_unknown_job"))
        assert rejected > 0, "the stale rank's packets never reached the aggregator"
        with pytest.raises(DataPlaneError):
            stale.wait()
        for c in old + new:
            c.close()
