"""The planner's placement as the several-aggregator data path's weights:
Placement.shares / save_weights (netreduce/planner/placement.py) and
planned_weights (netreduce/algorithms/multi_aggregator.py), read through
NETREDUCE_PLACEMENT."""
from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("scipy")

from netreduce.algorithms.multi_aggregator import planned_weights, spread  # noqa: E402
from netreduce.errors import NetReduceError  # noqa: E402
from netreduce.planner import Job, from_dict, policy, split_chunks  # noqa: E402

# Two racks under two spines whose uplinks differ (100 vs 40 Gbit/s), hosts faster
# than either, so the most loaded link is an uplink and the split matters.
TOPO = {
    "name": "uneven-spines", "switches": ["leaf0", "leaf1", "spine0", "spine1"],
    "hosts": [{"name": f"h{i}", "attach": f"leaf{i // 2}", "gbps": 400} for i in range(4)],
    "aggregators": [{"name": "agg-leaf0", "level": "rack", "attach": "leaf0", "gbps": 800},
                    {"name": "agg-leaf1", "level": "rack", "attach": "leaf1", "gbps": 800},
                    {"name": "agg-spine0", "level": "spine", "attach": "spine0", "gbps": 800},
                    {"name": "agg-spine1", "level": "spine", "attach": "spine1", "gbps": 800}],
    "links": [{"a": "leaf0", "b": "spine0", "gbps": 100}, {"a": "leaf0", "b": "spine1", "gbps": 40},
              {"a": "leaf1", "b": "spine0", "gbps": 100}, {"a": "leaf1", "b": "spine1", "gbps": 40}],
}
ADDRESSES = {"agg-spine0": "127.0.0.1:4801", "agg-spine1": "127.0.0.1:4802"}


def _plan(name):
    job = Job("resnet", workers=["h0", "h1", "h2", "h3"],
              chunks=split_chunks([25 << 20, 60 << 20, 13 << 20], 4 << 20))
    return policy(name).place(from_dict(TOPO), [job])


def test_grid_shares_follow_the_uplinks(tmp_path):
    plan = _plan("grid")
    shares = plan.shares()
    assert abs(sum(shares.values()) - 1.0) < 1e-9
    # spine0's uplinks are 100 Gbit/s, spine1's 40: GRID roots more bytes at spine0.
    assert shares["agg-spine0"] > shares["agg-spine1"] > 0, shares
    path = str(tmp_path / "placement.json")
    plan.save_weights(path, ADDRESSES)
    doc = json.load(open(path))
    assert doc["policy"] == "grid" and doc["approximation"] >= 1.0
    w = planned_weights([("127.0.0.1", 4801), ("127.0.0.1", 4802)], path)
    assert w == [shares["agg-spine0"], shares["agg-spine1"]]
    # the data path cuts a large buffer in those proportions
    parts = spread(10**6, 4, w, call=0)
    assert abs((parts[0][2] - parts[0][1]) / 10**6 - w[0] / sum(w)) < 1e-6


def test_an_aggregator_without_a_share_is_named(tmp_path):
    plan = _plan("fixed")  # every chunk at one root
    path = str(tmp_path / "placement.json")
    plan.save_weights(path, ADDRESSES)
    only = next(iter(plan.shares()))
    other = [a for n, a in ADDRESSES.items() if n != only][0]
    host, port = other.split(":")
    with pytest.raises(NetReduceError, match=f"gives aggregator {other} no share"):
        planned_weights([(host, int(port))], path)


def test_bad_files_are_refused(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"weights": 3}')
    with pytest.raises(NetReduceError, match="not a placement file"):
        planned_weights([("127.0.0.1", 4801)], str(path))
    with pytest.raises(NetReduceError, match="not a placement file"):
        planned_weights([("127.0.0.1", 4801)], str(tmp_path / "missing.json"))
    with pytest.raises(NetReduceError, match="no address given for root"):
        _plan("grid").save_weights(str(tmp_path / "x.json"), {})
