"""A data socket the kernel caps: without CAP_NET_ADMIN, SO_RCVBUFFORCE is refused and
SO_RCVBUF stops at net.core.rmem_max, so bursts past it are dropped and resent and
nothing fails. Both netreduce-switch and a rank say so once, with both sizes and the
sysctl to raise; with the capability neither does. The job's window follows the
smallest rank buffer and the daemon's own ports. The processes drop the capability with util-linux's
setpriv, as a daemon or a training job run by a service user has none."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from netreduce import _native
from netreduce.protocol.socket_buffers import rmem_max
from tests.parallel.test_switch_signals import Daemon
from tests.procs import collect_ok
from tests.raw_register import register

ASKED = int(_native.engine_receive_buffer_asked)

def capped(fn):
    """For tests that drop CAP_NET_ADMIN and need the kernel to cap what they ask."""
    fn = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                            reason="needs root and setpriv to drop CAP_NET_ADMIN")(fn)
    return pytest.mark.skipif((rmem_max() or 0) >= ASKED,
                              reason="net.core.rmem_max holds the asked sizes: nothing is "
                                     "capped here")(fn)

NO_NET_ADMIN = ["setpriv", "--bounding-set=-net_admin", "--inh-caps=-net_admin"]

RANK = textwrap.dedent("""
    import logging, sys
    import numpy as np
    from netreduce.worker import dataplane
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    conn = dataplane.connect((sys.argv[1], int(sys.argv[2])), "capped", 0, 1, timeout=20.0)
    try:
        x = np.arange(1 << 20, dtype=np.float32)
        out = conn.allreduce(x)
        assert np.array_equal(out, x), "wrong sum"
        print("buffer", conn._engine.receive_buffer_bytes)
    finally:
        conn.close()
""")


def _rank(prefix, address):
    return subprocess.run([*prefix, sys.executable, "-c", RANK, address[0], str(address[1])],
                          capture_output=True, text=True, timeout=60)


@capped
def test_a_capped_receive_buffer_is_named_by_the_daemon_and_the_rank_and_stays_exact():
    d = Daemon(prefix=NO_NET_ADMIN)
    try:
        line = d.wait_log("netreduce-switch data ports: UDP receive buffer")
        assert "not the 64 MiB asked" in line, line
        assert "sysctl -w net.core.rmem_max=67108864" in line, line
        r = _rank(NO_NET_ADMIN, d.address)
        assert r.returncode == 0, r.stderr
        assert "rank 0/1: UDP receive buffer" in r.stderr, r.stderr
        assert f"aggregator 127.0.0.1:{d.address[1]}" in r.stderr, r.stderr
        assert f"net.core.rmem_max={ASKED}" in r.stderr, r.stderr
        got = int(r.stdout.split()[-1])
        assert 0 < got < 2 * ASKED
    finally:
        d.close()


@capped
def test_with_the_capability_the_buffers_are_as_asked_and_nothing_is_logged():
    d = Daemon()
    try:
        r = _rank([], d.address)
        assert r.returncode == 0, r.stderr
        assert "receive buffer" not in r.stderr, r.stderr
        assert int(r.stdout.split()[-1]) >= 2 * ASKED
        assert not [l for l in d.log if "receive buffer" in l], d.log
    finally:
        d.close()


WINDOW = textwrap.dedent("""
    import json, sys
    import numpy as np
    from netreduce.worker import dataplane
    rank = int(sys.argv[3])
    conn = dataplane.connect((sys.argv[1], int(sys.argv[2])), sys.argv[4], rank, 2, timeout=20.0)
    try:
        x = np.arange(4 << 20, dtype=np.float32) * (rank + 1)
        out = conn.allreduce(x, np.empty_like(x))
        assert np.array_equal(out, np.arange(4 << 20, dtype=np.float32) * 3), "wrong sum"
        print(json.dumps({"window": conn.window, "slots": conn.slots,
                          "payload": conn.payload_bytes, "stats": conn._engine.stats()}))
    finally:
        conn.close()
""")


def _job(prefixes, address, job):
    procs = [subprocess.Popen([*pre, sys.executable, "-c", WINDOW, address[0], str(address[1]),
                               str(rank), job], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for rank, pre in enumerate(prefixes)]
    return collect_ok(procs, timeout=120)


@capped
def test_the_job_window_fits_the_smallest_rank_buffer_on_every_rank():
    # Rank 1 runs without CAP_NET_ADMIN: its socket holds 2 x rmem_max, less than a
    # window of 1 KiB slots twice that size. Both ranks then use the window that fits
    # it (a chunk's slot follows the window, so they must agree), the sum is exact, and
    # the daemon says why; with rank 1 privileged too, the whole window.
    from netreduce.protocol.socket_buffers import datagram_bytes, slots_that_fit

    slots = int(2 * 2 * rmem_max() / datagram_bytes(1024))
    if slots > 65536:
        pytest.skip(f"net.core.rmem_max {rmem_max()} needs more than --slots 65536 to exceed")
    d = Daemon("--payload-bytes", "1024", "--slots", str(slots))
    try:
        capped = _job([[], NO_NET_ADMIN], d.address, "fit-capped")
        assert capped[0]["window"] == capped[1]["window"] < capped[0]["slots"], capped
        assert capped[0]["window"] == slots_that_fit(2 * rmem_max(), capped[0]["payload"])
        line = d.wait_log("job 'fit-capped': window")
        assert "rank 1's UDP receive buffer" in line, line
        full = _job([[], []], d.address, "fit-full")
        assert full[0]["window"] == full[1]["window"] == full[0]["slots"], full
    finally:
        d.close()


def test_the_job_window_fits_the_daemons_ports_shared_by_all_its_ranks():
    # 8 ranks x 16384 slots of 1 KiB would put 139 MB in flight at once, more than half
    # the daemon's own data port holds: the job's window is cut to what fits, for every
    # rank (register only: the window is fixed with the payload, by the last rank).
    from netreduce.protocol.client import ControlClient
    from netreduce.protocol.socket_buffers import DAEMON_SHARE, slots_that_fit

    d = Daemon("--payload-bytes", "1024", "--slots", "16384", "--log-level", "info")
    clients = [ControlClient(d.address) for _ in range(8)]
    try:
        own = clients[0].call("counters")["transport"]["receive_buffer_bytes"]
        want = slots_that_fit(own // 8, 1024, DAEMON_SHARE)
        if not 0 < want < 16384:
            pytest.skip(f"this daemon's data port holds {own} B: 16384 slots fit")
        replies = [register(c, "fit-own", r, 8, window=0)
                   for r, c in enumerate(clients)]
        assert replies[-1]["payload_bytes"] == 1024 and replies[-1]["slots"] == 16384
        assert replies[-1]["window_fit"] == want, replies[-1]
        assert all(r["window_fit"] == 0 for r in replies[:-1])  # not final yet
        line = d.wait_log("job 'fit-own': window")
        assert f"window {want} of 16384 slots" in line and "shared by 8 ranks" in line, line
        later = clients[0].call("payload", wait=0.0)
        assert later["window_fit"] == want, later
        # A job that set NETREDUCE_WINDOW keeps it: no fit.
        more = [ControlClient(d.address) for _ in range(8)]
        try:
            got = [register(c, "fit-set", r, 8, window=4096)
                   for r, c in enumerate(more)]
            assert got[-1]["window_fit"] == 0, got[-1]
        finally:
            for c in more:
                c.close()
    finally:
        for c in clients:
            c.close()
        d.close()


def test_a_rank_that_does_not_coalesce_gets_the_smaller_share_of_its_buffer():
    # Reported, not dropped: rank 0 coalesces (UDP_GRO) and holds 416 KiB, rank 1 holds
    # as much but takes 1 KiB datagrams one by one, each in a buffer of its own, so its
    # share is smaller, and the job's window is that (control connections only).
    from netreduce.protocol.client import ControlClient
    from netreduce.protocol.socket_buffers import (PLAIN_RANK_SHARE, RANK_SHARE,
                                                   slots_that_fit)

    d = Daemon("--payload-bytes", "1024", "--log-level", "info")
    a, b = ControlClient(d.address), ControlClient(d.address)
    try:
        register(a, "plain", 0, 2, window=0, receive_buffer=425984,
               receive_coalesced=True)
        last = register(b, "plain", 1, 2, window=0, receive_buffer=425984,
                      receive_coalesced=False)
        plain = slots_that_fit(425984, 1024, PLAIN_RANK_SHARE)
        assert plain < slots_that_fit(425984, 1024, RANK_SHARE) < last["slots"], last
        assert last["window_fit"] == plain, last
        assert "rank 1's UDP receive buffer" in d.wait_log("job 'plain': window")
    finally:
        a.close()
        b.close()
        d.close()
