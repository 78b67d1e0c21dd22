"""IPv6 end to end on loopback: a netreduce-switch on ::1 (and on "::", which serves
IPv4 and IPv6 ranks in one daemon), rank processes that reach it by an IPv6
literal, all-reduces checked element by element for several sizes and dtypes, with
the jumbo extension (no payload flag) and with RoCE-sized packets that carry the
ICRC over the IPv6 pseudo-header; errors name IPv6 addresses in brackets."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import uuid

import numpy as np
import pytest

from netreduce import _native
from netreduce.worker import dataplane
from netreduce.protocol.client import ControlClient
from netreduce.errors import NetReduceError
from netreduce.switch import spawn
from tests.parallel.ranks import rounds_of_sums, run_ranks

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.float16]


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _has_ipv6_loopback(),
                                reason="no IPv6 on loopback (::1 cannot be bound)")


def _job() -> str:
    return "v6-" + uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def switch6():
    """The daemon as a user starts it on ::1, no payload flag (jumbo on loopback)."""
    proc = spawn(host="::1", port=0)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def switch6_roce():
    """RoCE-sized packets: every datagram carries an ICRC over the IPv6 header."""
    proc = spawn(host="::1", port=0, payload_bytes=4096)
    yield proc
    proc.stop()


def _sizes(payload: int, esize: int):
    per_packet = payload // esize
    return [0, 1, per_packet - 1, per_packet, per_packet + 1, (3 << 20) // esize + 5]


def _rank_sum(rank, size, address, job, payload, dtypes):
    """Rank r contributes r (and an index pattern): each element must come back as
    the exact sum, for every size and dtype, over one connection."""
    with dataplane.connect(address, job, rank, size, timeout=30.0) as conn:
        assert conn.address == address
        stats = conn.stats()  # waits until every rank registered and the payload is fixed
        assert stats["payload_bytes"] == payload, conn.payload_reason
        for dt in dtypes:
            for count in _sizes(payload, np.dtype(dt).itemsize):
                pattern = (np.arange(count) % 7).astype(dt)
                a = pattern + np.asarray(rank, dt)
                conn.allreduce(a)
                want = pattern * size + np.asarray(size * (size - 1) // 2, dt)
                bad = np.flatnonzero(a != want)
                assert bad.size == 0, f"{np.dtype(dt)} x {count}: {bad.size} wrong, first {bad[:5]}"
        return conn.stats()


@pytest.mark.parametrize("size", [2, 3])
def test_allreduce_over_ipv6_loopback_jumbo(switch6, size):
    assert switch6.address[0] == "::1"
    # Loopback's MTU 65536 less IPv6's 40-byte header (not IPv4's 20): 65448 B
    payload = _native.payload_for_mtu(65536, True)
    assert payload == 65448 < _native.payload_for_mtu(65536, False)
    run_ranks(_rank_sum, size, switch6.address, _job(), payload, DTYPES)


@pytest.mark.parametrize("size", [2, 3])
def test_allreduce_over_ipv6_with_icrc(switch6_roce, size):
    # The engine drops a result whose ICRC does not verify (the all-reduce would then
    # time out), the aggregator a contribution: both check the IPv6 pseudo-header.
    run_ranks(_rank_sum, size, switch6_roce.address, _job(), 4096,
              [np.float32, np.float64, np.int32])
    counters = _counters(switch6_roce.address)
    assert counters["drop_bad_icrc"] == 0 and counters["slots_completed"] > 0, counters


def _counters(address):
    with ControlClient(address, timeout=10.0) as client:
        return client.call("counters")["global"]


def _one(rank, size, address, job):
    with dataplane.connect(address, job, rank, size, timeout=30.0) as conn:
        a = np.arange(5000, dtype=np.float32) + rank
        conn.allreduce(a)
        assert np.array_equal(a, np.arange(5000, dtype=np.float32) * size + size * (size - 1) // 2)
        return conn.address


def test_dual_stack_daemon_serves_ipv4_and_ipv6_ranks_in_one_job():
    # Rank 0 over IPv4, rank 1 over IPv6, to one daemon on "::", with ICRC-checked
    # packets in both families.
    # (beyond loopback, and its ranks bring no secret: --allow-open-jobs)
    with spawn(host="::", port=0, payload_bytes=4096, extra_args=["--allow-open-jobs"]) as sw:
        assert sw.address[0] == "::1"
        port = sw.address[1]
        job = _job()

        def rank(r, size):
            return _one(r, size, ("127.0.0.1", port) if r == 0 else ("::1", port), job)

        assert run_ranks(rank, 2) == [("127.0.0.1", port), ("::1", port)]
        counters = _counters(("::1", port))
        assert counters["drop_bad_icrc"] == 0 and counters["slots_completed"] > 0, counters


def test_auto_fan_out_gives_a_rank_outside_the_group_unicast_copies():
    # --fanout auto on a dual-stack daemon: the IPv4 rank joins the job's (IPv4) group,
    # the IPv6 rank cannot and says why instead of failing; the aggregator sends that
    # rank its own copy of every result, so it waits for none: a handful of
    # retransmissions (a loaded machine's spurious ones included) where timing out on
    # each of its ~3,000 chunks would mean thousands.
    count, rounds = 1_000_003, 3
    with spawn(host="::", port=0, payload_bytes=4096, fanout="auto",
               extra_args=["--allow-open-jobs"]) as sw:
        port = sw.address[1]
        job = _job()

        def rank(r, size):
            return rounds_of_sums(r, size, ("127.0.0.1", port) if r == 0 else ("::1", port), job,
                            count, rounds)

        (s4, note4), (s6, note6) = run_ranks(rank, 2)
        counters = _counters(("::1", port))
    assert note4 == "" and "IPv4" in note6, (note4, note6)
    assert s4["group_datagrams"] > 0 and s6["group_datagrams"] == 0, (s4, s6)
    completed = counters["slots_completed"]
    # rank 1 a copy of every result; rank 0 only until its contributions said the group
    # reached it (its first window at most)
    assert completed <= counters["group_unicast_copies"] < 2 * completed, counters
    chunks = rounds * -(-count * 4 // 4096)
    assert s6["retransmits"] < chunks // 3, (s6, chunks)


def test_auto_fan_out_with_no_rank_in_the_group_sends_it_one_result_in_64():
    # Every rank over IPv6: none can join the (IPv4) group, so each gets its own copy
    # of every result and the group only the occasional probe, not a packet per result.
    count, rounds = 1_000_003, 2
    with spawn(host="::1", port=0, payload_bytes=4096, fanout="auto") as sw:
        stats = run_ranks(rounds_of_sums, 2, sw.address, _job(), count, rounds)
        g = _counters(sw.address)
    assert all(s["group_datagrams"] == 0 and note for s, note in stats), stats
    completed = g["slots_completed"]
    assert g["group_unicast_copies"] == 2 * completed, g
    group_sends = (g["packets_out"] - g["group_unicast_copies"] - g["held_notices"] -
                   g["retransmitted_results"])
    assert 0 < group_sends <= completed // 32, (group_sends, g)


def test_netreduce_info_over_ipv6(switch6):
    where = f"[::1]:{switch6.address[1]}"
    out = subprocess.run([sys.executable, "-m", "netreduce.cli", "info", "--json", "--switch",
                          where], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    agg = json.loads(out.stdout)["aggregator"]
    assert agg["address"] == where and agg["resolved"] == "::1" and agg["ipv6"] is True, agg
    # IPv6's 40-byte header counted: 65448 B on loopback, not IPv4's 65464
    assert agg["payload_bytes"] == 65448 and "unreachable" not in agg, agg


def test_unreachable_ipv6_aggregator_is_named_in_brackets():
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.bind(("::1", 0))
        port = s.getsockname()[1]  # nothing listens: closed once the block ends
    with pytest.raises(NetReduceError, match=rf"\[::1\]:{port}"):
        dataplane.connect(("::1", port), _job(), 0, 1, timeout=5.0)
    # An address nobody can route to (documentation prefix, RFC 3849): the error names
    # it in brackets whether the route or the connection fails.
    with pytest.raises(NetReduceError, match=r"\[2001:db8::1\]:4791"):
        dataplane.connect(("2001:db8::1", 4791), _job(), 0, 1, timeout=2.0)


def test_daemon_refuses_an_ipv6_address_it_does_not_have():
    out = subprocess.run([sys.executable, "-m", "netreduce.switch", "--host", "2001:db8::7",
                          "--port", "0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "[2001:db8::7]" in out.stderr, out.stderr


def test_multicast_fan_out_refuses_ipv6_ranks_with_the_fix():
    # Multicast groups are IPv4 (--multicast-base): an IPv6 rank cannot join one, and
    # is told so, with the aggregator named, instead of waiting for results.
    with spawn(host="::1", port=0, fanout="multicast") as sw:
        with pytest.raises(NetReduceError, match=r"\[::1\]:\d+.*IPv4.*--fanout unicast"):
            with dataplane.connect(sw.address, _job(), 0, 1, timeout=5.0) as conn:
                conn.allreduce(np.ones(4, np.float32))


LAUNCHED = r"""
import numpy as np
import netreduce as nr
nr.init()
a = np.full(70_000, nr.rank() + 1, np.float32)
out = nr.allreduce(a, op=nr.Sum)
assert (np.asarray(out) == nr.size() * (nr.size() + 1) / 2).all()
import os
print("OK", nr.rank(), os.environ["NETREDUCE_SWITCH"], flush=True)
nr.shutdown()
"""


def test_launcher_runs_a_job_on_an_ipv6_aggregator(switch6):
    import os
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NETREDUCE_SWITCH", None)
    where = f"[::1]:{switch6.address[1]}"
    proc = subprocess.run([sys.executable, "-m", "netreduce.launcher", "-np", "2", "--switch",
                           where, sys.executable, "-c", LAUNCHED], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    from tests.procs import unprefixed
    lines = sorted(unprefixed(ln).split()[-3:] for ln in proc.stdout.splitlines()
                   if " OK " in f" {unprefixed(ln)}")
    assert lines == [["OK", "0", where], ["OK", "1", where]], proc.stdout
