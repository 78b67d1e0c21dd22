"""A rank's data address is part of its admission: the aggregator takes the rank's
contributions from the address it registered only, drops and counts the others
(bad_source), and so answers nobody else -- not a stranger who replays the rank's
packets (docs/operations.md, *Security*). Over IPv4 and IPv6 loopback, by hand: the
packets are the rank's own, byte for byte, sent from another socket."""
from __future__ import annotations

import io
import socket
import time
import uuid

import numpy as np
import pytest

from netreduce import _native, cli
from netreduce.errors import ControlPlaneError
from netreduce.protocol.address import format_address
from netreduce.protocol.client import ControlClient
from netreduce.switch import spawn
from netreduce.switch.settings import aggregator_args
from tests.raw_register import data_socket, jumbo_packet as _packet, register, two_ranks

I32 = 4


def _counters(client, job, until):
    """The job's counters once ``until`` holds of them (bounded: 20 s)."""
    deadline = time.monotonic() + 20
    while True:
        c = client.call("counters")["jobs"][job]
        if until(c) or time.monotonic() > deadline:
            return c
        time.sleep(0.01)


def _pending(sock) -> list:
    """Every datagram waiting in ``sock``, without waiting for more."""
    got = []
    sock.setblocking(False)
    try:
        while True:
            got.append(sock.recv(65536))
    except BlockingIOError:
        pass
    finally:
        sock.settimeout(10)
    return got


@pytest.fixture(scope="module", params=["127.0.0.1", "::1"], ids=["ipv4", "ipv6"])
def daemon(request):
    if request.param == "::1" and not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    with spawn(host=request.param, port=0) as sw:
        yield sw


def test_only_the_registered_address_is_answered(daemon):
    job = "addr-" + uuid.uuid4().hex[:6]
    with two_ranks(daemon.address, job) as (c0, socks, grant):
        stranger = data_socket(c0)  # the same host, another port: never registered
        try:
            stranger.settimeout(10)
            dst = (daemon.address[0], grant["data_port"])
            head = {"length": 64, "key": grant["key"], "slot": 3, "psn": 3, "msg_id": 7,
                    "dtype": I32}
            data = [np.arange(16, dtype=np.int32), np.full(16, 10, np.int32)]
            pkts = [_packet(dict(head, dest_qp=(grant["job_index"] << 12) | r), data[r].tobytes())
                    for r in range(2)]
            # Rank 0's packet from the stranger: dropped, counted, never added.
            stranger.sendto(pkts[0], dst)
            c = _counters(c0, job, lambda c: c["drop_bad_source"] >= 1)
            assert (c["drop_bad_source"], c["rounds_started"], c["bytes_reduced"]) == (1, 0, 0), c
            # The ranks from their own addresses: the round completes, results to them.
            for r in range(2):
                socks[r].sendto(pkts[r], dst)
            for r in range(2):
                got = socks[r].recv(65536)
                assert _native.decode_header(got)["result"]
                np.testing.assert_array_equal(np.frombuffer(got[32:96], np.int32), data[0] + data[1])
            # The replay of a completed round (what a captured packet is): from the rank,
            # its stored result comes back; from the stranger, nothing, and it is counted.
            stranger.sendto(pkts[0], dst)
            stranger.sendto(pkts[1], dst)
            socks[0].sendto(pkts[0], dst)
            assert _native.decode_header(socks[0].recv(65536))["result"]
            c = _counters(c0, job, lambda c: c["drop_bad_source"] >= 3)
            assert c["drop_bad_source"] == 3 and c["retransmitted_results"] == 1, c
            assert c["bytes_reduced"] == 2 * 64 and c["slots_completed"] == 1, c
            # The daemon handled the stranger's packets before rank 0's resend, whose
            # answer has come: anything for the stranger would be here by now.
            assert _pending(stranger) == [] and _pending(socks[1]) == []
            assert c0.call("counters")["global"]["drop_bad_source"] >= 3
            # ... and `netreduce info --switch` says so.
            info = cli.probe(format_address(daemon.address))
            assert info["jobs"][job]["drop_bad_source"] == 3 and info["drop_bad_source"] >= 3
            text = io.StringIO()
            cli._print_aggregator(info, text.write)
            assert "3 of its packets came from an address none of its ranks registered" in \
                text.getvalue()
        finally:
            stranger.close()


def test_a_data_address_not_where_the_rank_connects_from_is_refused(daemon):
    job = "addr-" + uuid.uuid4().hex[:6]
    with ControlClient(daemon.address) as c:
        own = c._sock.getsockname()[0]
        other = "127.0.0.2" if ":" not in own else "fd00::7"
        with pytest.raises(ControlPlaneError, match=rf"job '{job}' \(rank 0\): its data would come "
                                                    rf"from .*{other}.*:4242, but its control "
                                                    rf"connection comes from {own}"):
            c.call("register", job=job, rank=0, size=1,
                   data_address=f"[{other}]:4242" if ":" in other else f"{other}:4242")
        with pytest.raises(ControlPlaneError, match="'register' needs data_address"):
            c.call("register", job=job, rank=0, size=1)
        with pytest.raises(ControlPlaneError, match="not an address a rank's packets can come"):
            c.call("register", job=job, rank=0, size=1, data_address="0.0.0.0:4242")
        s = data_socket(c)  # the same connection, asked properly, is admitted
        try:
            assert register(c, job, 0, 1, s)["job_index"] > 0
            jobs = c.call("counters")["jobs"]
            assert jobs[job]["ranks"] == [0]
        finally:
            s.close()


def test_a_connection_registers_its_socket_and_sends_from_it(daemon):
    """dataplane.Connection binds its data socket before it registers, says its
    address, and its engine sends from that very socket (Engine(data_fd=...))."""
    from netreduce.worker import dataplane
    job = "addr-" + uuid.uuid4().hex[:6]
    conns = [dataplane.connect(daemon.address, job, r, 2, timeout=20.0) for r in range(2)]
    try:
        reqs = [c.allreduce_async(np.full(100_000, r + 1, np.float32)) for r, c in enumerate(conns)]
        for q in reqs:
            assert (q.wait() == 3).all()
        c = conns[0].counters()["jobs"][job]
        assert c["drop_bad_source"] == 0 and c["slots_completed"] > 0, c
    finally:
        for c in conns:
            c.close()


def test_the_native_binding_names_what_it_holds():
    agg = _native.Aggregator(**aggregator_args(host="127.0.0.1", port=0))
    index = agg.add_job(3, 1, 0)
    assert agg.rank_source(index, 0) == "no address"
    agg.bind_rank(index, 0, "10.0.0.5", 40001)
    agg.bind_rank(index, 1, "fd00::5", 40002)
    agg.bind_rank(index, 2, "10.0.0.7", 4791, 4)
    assert [agg.rank_source(index, r) for r in range(3)] == [
        "10.0.0.5:40001", "[fd00::5]:40002", "10.0.0.7:4791-4794"]
    agg.set_job_payload(index, 1024)  # the pool rebuilt smaller keeps its ranks' addresses
    assert agg.rank_source(index, 1) == "[fd00::5]:40002"
    with pytest.raises(ValueError, match="not one a packet can come from"):
        agg.bind_rank(index, 0, "239.1.1.1", 4000)
    with pytest.raises(ValueError, match="out of range"):
        agg.bind_rank(index, 3, "10.0.0.5", 4000)
