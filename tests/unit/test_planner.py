"""The routing planner against brute force on small topologies: the LP bound is a
true lower bound, the rounded placement is feasible and within a small factor of
the exhaustive optimum, and the loads it reports are the loads its legs move."""
import itertools
import os

import numpy as np
import pytest

pytest.importorskip("scipy")

from netreduce.planner import Job, Problem, policy, spine_leaf, split_chunks  # noqa: E402
from netreduce.planner import topology as tp  # noqa: E402
from netreduce.planner.rounding import evaluate  # noqa: E402

HERE = os.path.dirname(__file__)
TOPOLOGIES = os.path.join(HERE, "..", "..", "benchmarks", "topologies")


def fabric(racks=2, hosts=2, spines=2, uplink=100.0, aggs=True, slow_spine=None):
    t = tp.Topology("test")
    spine_leaf(t, racks, hosts, spines, host_gbps=100, uplink_gbps=uplink,
               rack_aggregator_gbps=400 if aggs else None, spine_aggregator_gbps=400)
    if slow_spine is not None:  # rebuild the edges of one spine at a tenth of the rate
        t2 = tp.Topology("test-slow")
        for n in t.nodes.values():
            t2.add_node(n.name, n.kind, n.level)
        for e in t.edges[::2]:
            gbps = e.capacity * 8 / 1e9
            if f"spine{slow_spine}" in (e.src, e.dst) and "leaf" in e.src + e.dst:
                gbps /= 10
            t2.add_link(e.src, e.dst, gbps, e.latency * 1e6)
        t = t2
    return t


def brute_force(problem):
    """The exact optimum: every root per chunk x every path per source leg, loads
    summed leg by leg from the topology (independently of Problem.incidence)."""
    topo = problem.topo
    per_group = []
    for opts in problem.options:
        combos = []
        for o, (_, _, legs) in enumerate(opts):
            for paths in itertools.product(*[range(len(ch)) for _, ch in legs]):
                combos.append((o, list(paths)))
        per_group.append(combos)
    best = np.inf
    for picks in itertools.product(*per_group):
        load = np.zeros(len(topo.edges))
        for leg in problem.legs(picks):
            for e in leg.path:
                load[e] += leg.nbytes
        best = min(best, float((load / problem.capacity).max()))
    return best


def instances():
    rng = np.random.default_rng(7)
    for k in range(6):
        sizes = [int(s) for s in rng.integers(1, 50, size=3 + k % 2) * 1_000_000]
        t = fabric(spines=2 + k % 2, uplink=float(rng.choice([25, 40, 100])),
                   aggs=bool(k % 2 == 0))
        hosts = t.of_kind("host")
        yield t, [Job("j", hosts, sizes, rack_aggregation=bool(k % 2 == 0))]
    # two jobs sharing the fabric, each in one host of every rack
    t = fabric(racks=2, hosts=2, spines=2, uplink=40)
    yield t, [Job("a", ["r0h0", "r1h0"], [30_000_000, 10_000_000]),
              Job("b", ["r0h1", "r1h1"], [20_000_000, 20_000_000])]


@pytest.mark.parametrize("case", range(7))
def test_lp_bound_brute_force_and_rounding(case):
    topo, jobs = list(instances())[case]
    problem = Problem(topo, jobs)
    opt = brute_force(problem)
    grid = policy("grid", trials=32, seed=1).place_problem(problem)
    assert grid.bound <= opt * (1 + 1e-9), "the LP optimum must bound every placement"
    assert grid.congestion >= opt * (1 - 1e-9), "nothing beats the exhaustive optimum"
    assert grid.congestion <= 1.5 * opt, (grid.congestion, opt)
    for name in ("fixed", "hash"):
        assert policy(name).place_problem(problem).congestion >= opt * (1 - 1e-9)


def test_reported_loads_are_the_legs_loads():
    topo, jobs = list(instances())[0]
    placement = policy("hash").place(topo, jobs)
    load = np.zeros(len(topo.edges))
    for leg in placement.legs():
        assert leg.path == tuple(topo.paths(leg.src, leg.dst)[0]) or len(topo.paths(leg.src, leg.dst)) > 1
        load[list(leg.path)] += leg.nbytes
    np.testing.assert_allclose(placement.edge_loads(), load)
    assert placement.congestion == pytest.approx((load / placement.problem.capacity).max())


def test_grid_avoids_a_slow_spine_that_fixed_uses():
    # spine0's uplinks run at 10 Gbit/s: fixed (every chunk at spine0) pays for it,
    # the LP moves everything to spine1 and the rounding follows.
    topo = fabric(spines=2, uplink=100, slow_spine=0)
    job = Job("j", topo.of_kind("host"), [8_000_000] * 4)
    fixed = policy("fixed").place(topo, [job])
    grid = policy("grid").place(topo, [job])
    assert set(r for r in fixed.roots()[0]) == {"agg-spine0"}
    assert set(r for r in grid.roots()[0]) == {"agg-spine1"}
    assert grid.congestion == pytest.approx(grid.bound)
    assert fixed.congestion > 3 * grid.congestion


def test_grid_balances_uneven_chunks_over_spines():
    # chunk sizes 6,5,4,3,2 MB over 2 spines: the best split is 10/10.
    topo = fabric(spines=2, uplink=10)
    sizes = [6_000_000, 5_000_000, 4_000_000, 3_000_000, 2_000_000]
    problem = Problem(topo, [Job("j", topo.of_kind("host"), sizes)])
    grid = policy("grid", trials=64).place_problem(problem)
    opt = brute_force(problem)
    uplink = 10e9 / 8
    assert opt == pytest.approx(10_000_000 / uplink)
    assert grid.bound == pytest.approx(opt)  # 20 MB over two links, splittable
    assert grid.congestion <= 1.2 * opt


def test_paths_are_equal_cost_and_avoid_hosts():
    topo = fabric(racks=3, hosts=2, spines=4)
    across = topo.paths("r0h0", "r2h1")
    assert len(across) == 4 and all(len(p) == 4 for p in across)
    assert len(set(across)) == 4
    assert topo.paths("r0h0", "r0h1") == [tuple(topo.paths("r0h0", "r0h1")[0])]
    for p in across:
        inner = [topo.edges[e].dst for e in p[:-1]]
        assert all(topo.nodes[n].kind == "switch" for n in inner)
        assert topo.reverse(topo.reverse(p)) == p


def test_split_chunks_keeps_every_byte():
    sizes = [10, 1, 25, 0, 7]
    out = split_chunks(sizes, 4)
    assert sum(out) == sum(sizes) and max(out) <= 4
    assert split_chunks([9], 0) == [9]


def test_topology_files_load_alike():
    yaml_topo = tp.load(os.path.join(TOPOLOGIES, "two_racks.yaml"))
    assert len(yaml_topo.of_kind("host")) == 4
    assert yaml_topo.rack_aggregator("h2") == "agg-leaf1"
    big = tp.load(os.path.join(TOPOLOGIES, "spine_leaf_1024.json"))
    assert len(big.of_kind("host")) == 1024
    assert len(big.paths("r0h0", "r31h31")) == 8


@pytest.mark.parametrize("data, words", [
    ({"switches": ["s"], "hosts": [{"name": "h", "attach": "s", "gbps": 0}],
      "aggregators": [{"name": "a", "attach": "s", "gbps": 1}]}, ["h-s", "capacity"]),
    ({"switches": ["s"], "links": [{"a": "s", "b": "nowhere", "gbps": 1}]}, ["nowhere"]),
    ({"switches": ["s"], "hosts": [{"name": "h", "attach": "s", "gbps": 1}]}, ["no aggregators"]),
    ({"switches": ["s", "s"]}, ["twice"]),
])
def test_bad_topology_is_refused_by_name(data, words):
    with pytest.raises(tp.PlannerError) as e:
        tp.from_dict(data)
    for w in words:
        assert w in str(e.value)


def test_bad_job_is_refused_by_name(tmp_path):
    topo = fabric()
    with pytest.raises(tp.PlannerError, match="leaf0"):
        Problem(topo, [Job("j", ["leaf0"], [1])])
    with pytest.raises(tp.PlannerError, match="r0h0"):
        Problem(topo, [Job("j", ["r0h1"], [1], candidates=["r0h0"])])
    bad = tmp_path / "t.json"
    bad.write_text("{not json")
    with pytest.raises(tp.PlannerError, match="t.json"):
        tp.load(str(bad))
    with pytest.raises(tp.PlannerError, match="unknown placement policy"):
        policy("ecmp2")


def test_fixed_and_hash_are_deterministic():
    topo = fabric(spines=4)
    jobs = [Job(f"job{i}", topo.of_kind("host"), [1_000_000] * 8) for i in range(3)]
    for name in ("fixed", "hash"):
        a = policy(name).place(topo, jobs).roots()
        b = policy(name).place(topo, jobs).roots()
        assert a == b
    fixed = policy("fixed").place(topo, jobs).roots()
    assert all(len(set(r)) == 1 for r in fixed)  # one root per job
