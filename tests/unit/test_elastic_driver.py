"""The elastic driver's pieces in process (docs/elastic.md): its port (the schema, the
version exchange, the job's proof), Horovod's end-of-epoch decisions, host discovery
with the blacklist's cooldown, and the ranks an epoch's hosts get."""
import json
import socket

import pytest

from netreduce.launcher.elastic import assignment, discovery, membership, server
from netreduce.protocol import auth, messages
from netreduce.protocol.client import ControlConnection
from netreduce.errors import ControlPlaneError
from tests.raw_wire import connect, read_line


@pytest.fixture
def port():
    joins = []

    def on_join(worker, msg):
        joins.append((worker, msg.after))
        return messages.ElasticJoinReply(epoch=msg.after + 1, rank=0, size=1)
    srv = server.DriverServer("127.0.0.1", "job-a", "secret-a", {messages.ElasticJoin: on_join})
    srv.start()
    yield srv, joins
    srv.stop()


def test_a_worker_with_the_jobs_secret_joins(port):
    srv, joins = port
    with ControlConnection(srv.address) as conn:
        conn.request(messages.ElasticBind(job="job-a", worker="h0:1",
                                          auth=auth.prove_on(conn, "secret-a", "job-a", -1)))
        reply = conn.request(messages.ElasticJoin(after=3))
    assert (reply.epoch, joins) == (4, [("h0:1", 3)])


def test_the_port_refuses_strangers_and_other_versions(port):
    srv, joins = port
    with ControlConnection(srv.address) as conn:  # another secret
        with pytest.raises(ControlPlaneError, match="h0:0 .* not admitted .* does not verify"):
            conn.request(messages.ElasticBind(job="job-a", worker="h0:0",
                                              auth=auth.prove_on(conn, "other", "job-a", -1)))
        with pytest.raises(ControlPlaneError, match="before 'elastic_bind'"):
            conn.request(messages.ElasticJoin(after=0))
    with ControlConnection(srv.address) as conn:  # no secret at all
        with pytest.raises(ControlPlaneError, match="proof of the job's secret is missing"):
            conn.request(messages.ElasticBind(job="job-a", worker="h0:0"))
    raw = socket.create_connection(srv.address, timeout=5)
    raw.sendall(json.dumps({"cmd": "hello", "version": 1}).encode() + b"\n")
    reply = read_line(raw)
    assert not reply["ok"] and "speaks control protocol 2" in reply["error"], reply
    assert raw.recv(10) == b""  # closed
    raw = connect(srv.address)
    raw.sendall(b'{"cmd":"elastic_join","after":"x","id":7}\n')
    reply = read_line(raw)
    assert reply == {"ok": False, "id": 7, "error": reply["error"]} and "after" in reply["error"]
    assert joins == []


def _epoch(states, hosts=("a", "a", "b", "b")):
    slots = {f"{h}:{i % 2}": assignment.Slot(h, i % 2, i, len(hosts), 2, 0, 1)
             for i, h in enumerate(hosts)}
    m = membership.Membership(1, slots, 0)
    for name, state in states.items():
        m.record(name, state, 0 if state == membership.SUCCESS else -9)
    return m


def test_decisions_at_the_end_of_an_epoch():
    blacklisted = set()
    decide = lambda m, resets=0, limit=None: membership.decide(  # noqa: E731
        m, blacklisted.add, blacklisted.__contains__, resets, limit)
    R, S, F = membership.READY, membership.SUCCESS, membership.FAILURE
    assert decide(_epoch({"a:0": S, "a:1": S, "b:0": S, "b:1": S})).kind == "done"
    assert decide(_epoch({"a:0": R, "a:1": R, "b:0": R, "b:1": F})).kind == "reset"
    assert blacklisted == {"b"}
    failed = decide(_epoch({"a:0": F, "a:1": F, "b:0": F, "b:1": F}))
    assert failed.kind == "failed" and failed.code == 137, failed  # 128 + SIGKILL, as a shell says
    assert "every worker of epoch 1: 4 rank(s) on a:2, b:2 failed; the first, a:0, was killed " \
           "by SIGKILL" in failed.message
    blacklisted.clear()
    every = decide(_epoch({"a:0": F, "a:1": R, "b:0": R, "b:1": F}))
    assert every.kind == "failed" and "every host" in every.message
    blacklisted.clear()
    limit = decide(_epoch({"a:0": R, "a:1": R, "b:0": R, "b:1": R}), resets=2, limit=2)
    assert limit.kind == "failed" and "--reset-limit 2" in limit.message
    # a failure overrides READY (died while waiting), nothing overrides an exit
    m = _epoch({"a:0": R})
    m.record("a:0", F, 1)
    m.record("a:0", R)
    assert m.states["a:0"] == F and not m.record("c:0", R)


def test_discovery_order_and_the_blacklist_cooldown(monkeypatch):
    found = {"a": 2, "b": 2}
    hosts = discovery.HostManager(discovery.FixedHosts(found), cooldown=(10, 100))
    assert hosts.update() == discovery.Update.added
    found.update(c=1)
    found.pop("a")
    assert hosts.update(dict(found)) == discovery.Update.mixed
    found["a"] = 2
    hosts.update(dict(found))
    assert hosts.available() == [("b", 2), ("c", 1), ("a", 2)]  # first seen first
    now = [1000.0]
    monkeypatch.setattr(discovery.time, "time", lambda: now[0])
    monkeypatch.setattr(discovery.random, "uniform", lambda lo, hi: 0.5)
    assert hosts.blacklist("b") == 25.0  # 10 * 2^1 + 0.5 * 10
    assert hosts.blacklist("b") is None  # already
    assert hosts.available() == [("c", 1), ("a", 2)]
    now[0] += 26
    assert hosts.update(dict(found)) == discovery.Update.added  # its cooldown is over
    assert not hosts.is_blacklisted("b") and hosts.available_slots() == 5
    assert hosts.blacklist("b") == 45.0  # the second time: 10 * 2^2 + 5


def test_ranks_fill_hosts_in_order_up_to_max_np():
    slots = assignment.assign([("a", 2), ("b", 3), ("c", 2)], max_np=6)
    assert [(s.host, s.rank, s.local_rank, s.local_size) for s in slots] == [
        ("a", 0, 0, 2), ("a", 1, 1, 2), ("b", 2, 0, 3), ("b", 3, 1, 3), ("b", 4, 2, 3),
        ("c", 5, 0, 1)]
    assert {s.size for s in slots} == {6}
    assert [(s.cross_rank, s.cross_size) for s in slots if s.local_rank == 0] == [(0, 3), (1, 3), (2, 3)]
    assert membership.previous_hosts_check(membership.Membership(1, {s.name: s for s in slots}, 0),
                                           [("d", 4)]).startswith("no host of the previous")
