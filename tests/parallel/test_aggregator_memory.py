"""Bounded memory: a real netreduce-switch's RSS (/proc/PID/status VmRSS) stays
within its slot-memory limit (--memory-mb) plus a fixed overhead through 1,000 jobs
that join, fill their whole pool with data, and leave; a job that would exceed the
limit is refused, never admitted; and a job that restarts while its previous run
drains briefly holds two pools, both counted against the limit."""
from __future__ import annotations

import time
import uuid

import numpy as np
import pytest

from netreduce.worker import dataplane
from netreduce.protocol.client import ControlClient
from netreduce.errors import AdmissionError, ControlPlaneError
from netreduce.switch import spawn
from netreduce.testbed import proc_stat
from tests.raw_register import register

MIB = 1 << 20
SLOTS = 32
PAYLOAD = 65464                   # loopback's payload: every job gets the largest
POOL = SLOTS * PAYLOAD * 2        # bytes per job: slots x payload x 2 shadow sets
LIMIT_MB = 64
AT_ONCE = LIMIT_MB * MIB // POOL  # 16 jobs fill the limit
JOBS = 1000
OVERHEAD = 48 * MIB               # allowed beyond the limit: threads, sockets, Python objects


def _rss(pid: int) -> int:
    return proc_stat.status_int(pid, "VmRSS") * 1024


def _fill(conn) -> None:
    """One all-reduce across every slot and both shadow sets: the whole pool is touched."""
    a = np.ones(2 * SLOTS * PAYLOAD // 4, np.float32)
    conn.allreduce(a)
    assert (a == 1).all()


@pytest.mark.slow
def test_rss_stays_within_the_pool_limit_through_1000_jobs():
    with spawn(host="127.0.0.1", port=0, memory_mb=LIMIT_MB, max_jobs=AT_ONCE * 4,
               slots=SLOTS) as sw:
        pid = sw.proc.pid
        tag = uuid.uuid4().hex[:6]
        with dataplane.connect(sw.address, f"warm-{tag}", 0, 1, timeout=20.0) as conn:
            _fill(conn)  # code paths, thread stacks and buffers of a first job
        base = _rss(pid)
        peak, done, refused = 0, 0, 0
        while done < JOBS:
            batch = []
            try:
                for _ in range(min(AT_ONCE, JOBS - done)):
                    conn = dataplane.connect(sw.address, f"m{done}-{tag}", 0, 1, timeout=20.0)
                    batch.append(conn)
                    _fill(conn)
                    done += 1
                if len(batch) == AT_ONCE:  # the limit is reached: one more is refused
                    with pytest.raises(AdmissionError, match="slot memory exhausted"):
                        dataplane.connect(sw.address, f"over-{done}-{tag}", 0, 1, timeout=20.0)
                    refused += 1
                peak = max(peak, _rss(pid))
            finally:
                for conn in batch:
                    conn.close()
        with ControlClient(sw.address) as c:
            g = c.call("counters")["global"]
        after = _rss(pid)
    print(f"RSS: base {base / MIB:.1f} MiB, peak {peak / MIB:.1f} MiB "
          f"(limit {LIMIT_MB} MiB), after {JOBS} jobs {after / MIB:.1f} MiB")
    assert g["jobs_admitted"] == JOBS + 1 and g["jobs_refused_memory"] == refused > 0
    assert g["slot_memory_bytes"] == 0 and g["jobs_active"] == 0
    assert peak <= base + LIMIT_MB * MIB + OVERHEAD, (base, peak)
    assert after <= base + OVERHEAD, (base, after)  # pools went back to the system


def test_a_restart_while_draining_holds_two_pools_within_the_limit():
    with spawn(host="127.0.0.1", port=0, memory_mb=2 * POOL // MIB + 1, slots=SLOTS) as sw:
        job = "drain-" + uuid.uuid4().hex[:6]
        r0, r1 = ControlClient(sw.address), ControlClient(sw.address)
        try:
            register(r0, job, 0, 2)
            register(r1, job, 1, 2)
            r0.call("release")  # rank 0 left: this run drains until rank 1 leaves too
            with ControlClient(sw.address) as again:
                # rank 0 back (init() again): the job's next run, a pool of its own
                register(again, job, 0, 2)
                g = r1.call("counters")["global"]
                assert g["slot_memory_bytes"] == 2 * POOL and g["jobs_active"] == 2
                with ControlClient(sw.address) as other:
                    with pytest.raises(ControlPlaneError, match="slot memory exhausted"):
                        register(other, "other-" + job, 0, 1)
            r1.call("release")
            # The restarted run's pool goes when the daemon sees `again` close, which
            # its connection thread handles on its own time: wait for that (bounded).
            deadline = time.monotonic() + 10
            while True:
                g = r1.call("counters")["global"]
                if (g["slot_memory_bytes"], g["jobs_active"]) == (0, 0) \
                        or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert g["slot_memory_bytes"] == 0 and g["jobs_active"] == 0
        finally:
            r0.close()
            r1.close()
