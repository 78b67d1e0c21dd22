"""netreduce-run's host lists (horovodrun's -H, --hostfile and discovery lines), rank
placement with Horovod's local and cross ranks, and which names are this machine."""
from __future__ import annotations

import socket

import pytest

from netreduce.launcher import hosts
from netreduce.launcher.hosts import Host, HostsError


def test_host_list():
    assert hosts.parse_hosts("h0:2,h1:4") == [Host("h0", 2), Host("h1", 4)]
    assert hosts.parse_hosts(" 10.0.0.2:1 , [fd00::2]:3 ") == [Host("10.0.0.2", 1), Host("fd00::2", 3)]
    assert hosts.parse_hosts("a,b:2", default_slots=1) == [Host("a", 1), Host("b", 2)]
    for bad, said in (("h0", "is not host:slots"), ("h0:x", "is not host:slots"),
                      ("h0:0", "has 0 slots"), ("h0:1,h0:2", "listed twice"), ("", "names no host")):
        with pytest.raises(HostsError, match=said):
            hosts.parse_hosts(bad)
    assert hosts.format_hosts([Host("h0", 2), Host("fd00::2", 1)]) == "h0:2,[fd00::2]:1"


def test_hostfile_as_horovodrun_and_open_mpi_write_it(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# the cluster\nnode1 slots=4\n\nnode2 slots=2 max_slots=8  # spare\nnode3\n")
    assert hosts.parse_hostfile(str(path)) == [Host("node1", 4), Host("node2", 2), Host("node3", 1)]
    for bad, said in (("node1 slots=0\n", "not a positive number"), ("node1 4\n", "line 1"),
                      ("# nothing\n", "names no host"), ("a slots=1\na slots=2\n", "listed twice")):
        path.write_text(bad)
        with pytest.raises(HostsError, match=said):
            hosts.parse_hostfile(str(path))
    with pytest.raises(HostsError, match="No such file"):
        hosts.parse_hostfile(str(tmp_path / "absent"))


def test_discovery_lines():
    assert hosts.parse_discovery("h0:2\nh1\n\n", default_slots=4) == [Host("h0", 2), Host("h1", 4)]
    assert hosts.parse_discovery("") == []
    with pytest.raises(HostsError, match="line 2"):
        hosts.parse_discovery("h0:2\nh1\n")  # no --slots-per-host for a bare name


def test_assign_host_by_host_with_horovods_local_and_cross_ranks():
    slots = hosts.assign([Host("a", 2), Host("b", 1), Host("c", 3)], 5)
    got = [(s.host, s.rank, s.local_rank, s.local_size, s.cross_rank, s.cross_size, s.size)
           for s in slots]
    # local rank 0 exists on a, b, c (cross size 3); local rank 1 on a and c (2); the
    # fifth rank is c's second, c's third slot stays empty.
    assert got == [("a", 0, 0, 2, 0, 3, 5), ("a", 1, 1, 2, 0, 2, 5), ("b", 2, 0, 1, 1, 3, 5),
                   ("c", 3, 0, 2, 2, 3, 5), ("c", 4, 1, 2, 1, 2, 5)]
    assert [s.host for s in hosts.assign([Host("a", 2), Host("b", 2)], 2)] == ["a", "a"]
    with pytest.raises(HostsError, match="more ranks than the 3 slots"):
        hosts.assign([Host("a", 2), Host("b", 1)], 4)


def test_which_names_are_this_machine():
    assert hosts.is_local("localhost") and hosts.is_local("127.0.0.1") and hosts.is_local("::1")
    assert hosts.is_local(socket.gethostname())
    assert not hosts.is_local("192.0.2.1")            # TEST-NET-1: nobody's address
    assert not hosts.is_local("no-such-host.invalid")  # unresolvable: ssh may know it
    assert hosts.route_source("127.0.0.1") == "127.0.0.1"
