"""A running netreduce-switch chooses each job's payload from its path and says why:
loopback keeps the 65464-byte jumbo extension with no flag, --payload-bytes caps it,
a rank that joins late still gets the same payload, and `netreduce info --switch`
reports the job's payload and reason."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

from netreduce import _native
from netreduce.worker import dataplane
from netreduce.protocol.client import ControlClient
from netreduce.errors import DataPlaneError
from netreduce.switch import spawn


def _job() -> str:
    return "payload-" + uuid.uuid4().hex[:6]


def test_loopback_keeps_the_jumbo_payload_without_a_flag(switch):
    job = _job()
    conns = [dataplane.connect(switch.address, job, r, 2) for r in range(2)]
    try:
        data = [np.arange(100_000, dtype=np.float32) * (r + 1) for r in range(2)]
        for q in [c.allreduce_async(a) for c, a in zip(conns, data)]:
            q.wait()
        assert all((a == np.arange(100_000, dtype=np.float32) * 3).all() for a in data)
        for c in conns:
            assert c.payload_bytes == _native.MAX_PAYLOAD == c.stats()["payload_bytes"]
            assert c.payload_reason.startswith(f"payload {_native.MAX_PAYLOAD} B: path MTU 6553")
            assert "(loopback)" in c.payload_reason and "jumbo extension" in c.payload_reason
        counters = conns[0].counters()["jobs"][job]
        assert counters["payload_bytes"] == _native.MAX_PAYLOAD
        assert counters["payload_reason"] == conns[0].payload_reason
        # 100 000 float32 in 65464-byte packets: 7 per rank (resends aside).
        st = conns[0].stats()
        assert st["packets_sent"] - st["retransmits"] == -(-400_000 // _native.MAX_PAYLOAD)
    finally:
        for c in conns:
            c.close()


def test_payload_bytes_caps_the_path_and_says_so():
    with spawn(payload_bytes=4096) as sw:
        with dataplane.connect(sw.address, _job(), 0, 1) as conn:
            assert conn.payload_bytes == 4096
            assert conn.payload_reason.startswith("payload 4096 B: netreduce-switch "
                                                  "--payload-bytes 4096")
            a = np.ones(5000, np.float32)
            conn.allreduce(a)
            st = conn.stats()
            assert st["packets_sent"] - st["retransmits"] == -(-20_000 // 4096)
            # A lower cap does not shrink the window: with --slots unset the job's
            # slots hold what 32 of the largest payloads do (2 MiB), not 32 x 4 KiB.
            assert conn.slots == 32 * _native.MAX_PAYLOAD // 4096 == 511


def test_slots_given_with_a_payload_cap_are_kept():
    with spawn(payload_bytes=4096, slots=32) as sw:
        with dataplane.connect(sw.address, _job(), 0, 1) as conn:
            assert (conn.payload_bytes, conn.slots) == (4096, 32)


def test_a_late_rank_fixes_the_payload_and_the_first_waits_for_it(switch):
    job = _job()
    first = dataplane.connect(switch.address, job, 0, 2, timeout=20.0)
    assert first.payload_bytes == 0  # not fixed while rank 1 is missing
    with ControlClient(switch.address) as probe:
        pending = probe.call("counters")["jobs"][job]
    assert pending["payload_reason"].startswith("pending until every rank has registered")
    results = {}

    def rank0():
        a = np.full(1000, 1.0, np.float32)
        first.allreduce(a)
        results[0] = a

    t = threading.Thread(target=rank0)
    t.start()
    time.sleep(0.5)  # rank 0 is waiting for rank 1 to register
    assert t.is_alive()
    with dataplane.connect(switch.address, job, 1, 2) as late:
        b = np.full(1000, 2.0, np.float32)
        late.allreduce(b)
        t.join(20)
        assert (b == 3).all() and (results[0] == 3).all()
        assert first.payload_bytes == late.payload_bytes == _native.MAX_PAYLOAD
    first.close()


def test_a_rank_that_never_registers_is_named():
    with spawn() as sw:
        job = _job()
        with dataplane.connect(sw.address, job, 0, 3, timeout=1.0) as conn:
            with pytest.raises(DataPlaneError, match=r"rank\(s\) 1, 2 have not registered .* 1 s"):
                conn.allreduce(np.ones(4, np.float32))


def test_netreduce_info_reports_each_jobs_payload(switch):
    job = _job()
    conns = [dataplane.connect(switch.address, job, r, 2) for r in range(2)]
    try:
        where = f"{switch.address[0]}:{switch.address[1]}"
        out = subprocess.run([sys.executable, "-m", "netreduce.cli", "info", "--switch", where],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert f"aggregator: {where}" in out.stdout
        assert f"this host: payload {_native.MAX_PAYLOAD} B: path MTU 6553" in out.stdout
        assert f"job '{job}' (2 of 2 ranks): {conns[0].payload_reason}" in out.stdout
        data = json.loads(subprocess.run(
            [sys.executable, "-m", "netreduce.cli", "info", "--json", "--switch", where],
            capture_output=True, text=True, timeout=60).stdout)
        assert data["aggregator"]["jobs"][job]["payload_bytes"] == _native.MAX_PAYLOAD
    finally:
        for c in conns:
            c.close()


def test_host_names_resolve_and_an_ipv6_address_is_named_in_brackets(switch):
    from netreduce.errors import AdmissionError, NetReduceError
    port = switch.address[1]
    with dataplane.connect(("localhost", port), _job(), 0, 1) as conn:
        assert conn.address == ("127.0.0.1", port)
        a = np.ones(3, np.float32)
        conn.allreduce(a)
        assert (a == 1).all()
    # This daemon listens on 127.0.0.1 only: over IPv6 nothing answers, and the error
    # names the address as the user writes it (tests/parallel/test_ipv6.py: IPv6 works).
    with pytest.raises(NetReduceError, match=rf"\[::1\]:{port}"):
        dataplane.connect(("::1", port), _job(), 0, 1, timeout=5.0)
    with pytest.raises(AdmissionError, match="'no-such-host.invalid' does not resolve"):
        dataplane.connect(("no-such-host.invalid", port), _job(), 0, 1)
