"""Host layout from the exchanged records (netreduce/algorithms/hosts.py) and the algorithm
choice made from it (netreduce/algorithms/select.py): pure functions, no processes."""
from __future__ import annotations

import numpy as np
import pytest

from netreduce.algorithms import hosts as topology
from netreduce.algorithms.select import choose
from netreduce.algorithms.hosts import Record, TopologyError


def rec(rank, host, lr, ln, known=True):
    return Record(rank, 100 + host, lr, ln, known, 1000 + rank, f"h{host}")


def test_encode_decode_roundtrip_through_a_sum():
    ident = (12345, "node-a/netns:4026531992")
    rows = sum(topology.encode(r, 3, r, 3, True, ident, 77 + r) for r in range(3))
    recs = topology.decode(rows)
    assert [(r.rank, r.host_id, r.local_rank, r.local_size, r.pid, r.label) for r in recs] == \
        [(r, 12345, r, 3, 77 + r, "node-a/netns:4026531992") for r in range(3)]


def test_hosts_numbered_by_lowest_rank_and_ordered_by_local_rank():
    recs = [rec(0, 1, 1, 2), rec(1, 0, 0, 2), rec(2, 0, 1, 2), rec(3, 1, 0, 2)]
    lay = topology.layout(recs, rank=2)
    assert lay.hosts == [[3, 0], [1, 2]]
    assert (lay.host_index, lay.local_rank, lay.local_size, lay.num_hosts) == (1, 1, 2, 2)
    assert choose("auto", lay) == "hierarchical"


def test_launcher_that_did_not_say_groups_by_host_identity():
    recs = [rec(r, r // 2, 0, 1, known=False) for r in range(4)]
    assert topology.layout(recs, 0).hosts == [[0, 1], [2, 3]]


def test_contradicting_launcher_is_refused_naming_ranks_and_hosts():
    # The launcher says four local ranks on one host; they sit on two.
    recs = [rec(r, r // 2, r, 4) for r in range(4)]
    with pytest.raises(TopologyError) as err:
        topology.layout(recs, 0)
    msg = str(err.value)
    assert "host 'h0' runs ranks [0, 1]" in msg and "host 'h1' runs ranks [2, 3]" in msg
    assert "rank 2: local rank 2 of 4" in msg


def test_duplicate_local_rank_is_refused():
    with pytest.raises(TopologyError, match="ranks \\[0, 1\\]"):
        topology.layout([rec(0, 0, 0, 2), rec(1, 0, 0, 2)], 0)


def test_choice():
    one_each = topology.layout([rec(r, r, 0, 1) for r in range(3)], 0)
    assert choose("auto", one_each) == "flat"
    assert choose("hierarchical", one_each) == "hierarchical"
    single = topology.layout([rec(0, 0, 0, 1)], 0)
    assert choose("hierarchical", single) == "flat"
    uneven = topology.layout([rec(0, 0, 0, 2), rec(1, 0, 1, 2), rec(2, 1, 0, 1)], 0)
    assert choose("auto", uneven) == "flat"  # shards would not line up across hosts
    with pytest.raises(TopologyError, match="same number of ranks on every host"):
        choose("hierarchical", uneven)
    assert choose("flat", topology.layout([rec(0, 0, 0, 2), rec(1, 0, 1, 2)], 0)) == "flat"


def test_host_identity_tells_network_namespaces_apart():
    host_id, label = topology.host_identity()
    assert 0 < host_id < 2**63 and "netns:" in label
    assert np.int64(host_id) == host_id
