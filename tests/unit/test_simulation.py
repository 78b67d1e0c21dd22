"""The SimGrid flow model against the closed forms it must reproduce (a check of
the model, not a timing): ring = 2(N-1)/N * S/B plus 2(N-1) link latencies, INA
through an aggregator whose link is no bottleneck = S/B plus its path latency, a
single aggregator behind one oversubscribed uplink = hosts_per_rack * S / uplink,
rack + spine aggregation = S/B whatever the rack count, and the host software term
(an exec of op_s + packets * packet_s per sender, step_s per ring step) adding
exactly its seconds; the two-level testbed's 4 S vs 2 S; the testbed fit recovers
known parameters."""
import pytest

pytest.importorskip("scipy")
from benchmarks.sim import simgrid_loader  # noqa: E402

if not simgrid_loader.available():
    pytest.skip("SimGrid is not installed (bash scripts/env_simgrid.sh)", allow_module_level=True)

from benchmarks.sim import experiments as ex, scenarios as sc  # noqa: E402
from netreduce.planner import Job  # noqa: E402

S = 16 << 20  # bytes


@pytest.mark.parametrize("n", [8, 16])
def test_ring_and_ina_on_a_star_match_closed_forms(n):
    gbps, lat = 1.0, 10e-6
    topo = ex.star(n, gbps, lat * 1e6)
    hosts = topo.of_kind("host")
    b = gbps * 1e9 / 8
    full = sc.ring(topo, [hosts], [S], overhead=1.0, full=True)
    one = sc.ring(topo, [hosts], [S], overhead=1.0)
    ring_closed = 2 * (n - 1) / n * S / b + 2 * (n - 1) * 2 * lat  # 2 links per step
    assert full["steps_simulated"] == 2 * (n - 1) and one["steps_simulated"] == 1
    assert full["time_s"] == pytest.approx(ring_closed, rel=0.01)
    assert one["time_s"] == pytest.approx(full["time_s"], rel=1e-6)
    job = Job("j", hosts, [S], rack_aggregation=False)
    ina = sc.ina(sc.place(topo, [job], "fixed"), overhead=1.0)
    assert ina["time_s"] == pytest.approx(S / b, rel=0.01)
    assert full["time_s"] / ina["time_s"] == pytest.approx(2 * (n - 1) / n, rel=0.02)


def test_wire_overhead_scales_the_time():
    topo = ex.star(8, 1.0, 10)
    hosts = topo.of_kind("host")
    job = Job("j", hosts, [S], rack_aggregation=False)
    base = sc.ina(sc.place(topo, [job], "fixed"), overhead=1.0)["time_s"]
    padded = sc.ina(sc.place(topo, [job], "fixed"), overhead=1.25)["time_s"]
    assert padded == pytest.approx(1.25 * base, rel=0.01)


def test_fabric_single_aggregator_and_rack_spine():
    # 4 racks x 4 hosts, 2 spines; uplinks at 25 Gbit/s (8:1), hosts at 100
    args = dict(racks=4, hosts_per_rack=4, spines=2, host_gbps=100.0, uplink_gbps=25.0,
                latency_us=1.0)
    topo = ex.fabric(**args)
    workers = sc.rack_major(topo)
    host_b, up_b = 100e9 / 8, 25e9 / 8
    single = Job("j", workers, [S], rack_aggregation=False, candidates=["agg-spine0"])
    t_single = sc.ina(sc.place(topo, [single], "fixed"), overhead=1.0)["time_s"]
    assert t_single == pytest.approx(4 * S / up_b, rel=0.01)  # 4 hosts' bytes per uplink
    chunks = [S // 8] * 8
    fixed = sc.ina(sc.place(topo, [Job("j", workers, chunks)], "fixed"), overhead=1.0)
    grid = sc.ina(sc.place(topo, [Job("j", workers, chunks)], "grid"), overhead=1.0)
    assert fixed["time_s"] == pytest.approx(S / up_b, rel=0.01)  # all through spine 0
    assert grid["time_s"] == pytest.approx(max(S / host_b, S / (2 * up_b)), rel=0.02)
    ring = sc.ring(topo, [workers], [S], overhead=1.0)
    # rack-major ring: the one flow leaving each rack takes one ECMP path, so every
    # step waits for S/16 bytes over one 25 Gbit/s uplink
    assert ring["time_s"] == pytest.approx(2 * 15 * (S / 16) / up_b, rel=0.02)


def test_software_term_matches_its_closed_form():
    # every sender spends op_s + packets * packet_s before its flows (a SimGrid exec),
    # every ring worker step_s before each step: t = that + the wire
    from benchmarks.sim.software import Software
    n, gbps, lat = 4, 1.0, 10e-6
    topo = ex.star(n, gbps, lat * 1e6)
    hosts = topo.of_kind("host")
    b = gbps * 1e9 / 8
    sw = Software(op_s=2e-3, packet_s=10e-6, step_s=1.5e-3, payload=8192)
    job = Job("j", hosts, [S], rack_aggregation=False)
    base = sc.ina(sc.place(topo, [job], "fixed"), overhead=1.0)["time_s"]
    t = sc.ina(sc.place(topo, [job], "fixed"), overhead=1.0, software=sw)["time_s"]
    assert t == pytest.approx(S / b + 2e-3 + (S // 8192) * 10e-6, rel=0.01)
    assert t - base == pytest.approx(sw.seconds(S), rel=1e-6)
    ring0 = sc.ring(topo, [hosts], [S], overhead=1.0)["time_s"]
    one = sc.ring(topo, [hosts], [S], overhead=1.0, software=sw)["time_s"]
    full = sc.ring(topo, [hosts], [S], overhead=1.0, software=sw, full=True)["time_s"]
    assert one - ring0 == pytest.approx(2 * (n - 1) * sw.step_s, rel=1e-6)
    assert full == pytest.approx(one, rel=1e-6)


def test_two_level_testbed_model_and_its_software_term():
    # 2 racks x 2 hosts at 200 Mbit/s: one aggregator's link carries 4 S, the
    # spine's 2 S (one partial sum per rack); the rack aggregators' software time
    # delays their partial sums, so the tree pays it once, not once per level
    from benchmarks.sim import calibrate
    from benchmarks.sim.software import Software
    topo = calibrate.two_level_topology("200mbit", 20.0)
    w = topo.of_kind("host")
    b = 200e6 / 8
    size = 4 << 20
    single = Job("j", w, [size], rack_aggregation=False, candidates=["agg-spine"])
    tree = Job("j", w, [size], rack_aggregation=True, candidates=["agg-spine"])
    sw = Software(op_s=50e-3)
    t1 = sc.ina(sc.place(topo, [single], "fixed"), overhead=1.0)["time_s"]
    t2 = sc.ina(sc.place(topo, [tree], "fixed"), overhead=1.0)["time_s"]
    t2s = sc.ina(sc.place(topo, [tree], "fixed"), overhead=1.0, software=sw)["time_s"]
    assert t1 == pytest.approx(4 * size / b, rel=0.01)
    assert t2 == pytest.approx(2 * size / b, rel=0.01)
    assert t2s == pytest.approx(2 * size / b + 50e-3, rel=0.01)


def test_testbed_fit_recovers_known_parameters():
    # records simulated with a known software term; the two-size fit must find it
    from benchmarks.sim import calibrate
    from benchmarks.sim.software import Software
    true = Software(op_s=3e-3, packet_s=7e-6)
    sizes = calibrate.FIT_SIZES
    recs, sim0 = [], {}
    for s in sizes:
        t = calibrate.simulate_star("netreduce", 4, s, 0.2, 20.0, true)
        recs.append({"impl": "netreduce", "np": 4, "size": s, "time_s": t,
                     "packets_per_rank": s // 8192})
        sim0[("netreduce", 4, s)] = calibrate.simulate_star("netreduce", 4, s, 0.2, 20.0)
    got = calibrate.fit_testbed(sim0, recs)[("netreduce", 4)]
    assert got.op_s == pytest.approx(true.op_s, rel=0.01)
    assert got.packet_s == pytest.approx(true.packet_s, rel=0.01)
