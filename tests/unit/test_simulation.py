"""The SimGrid flow model against the closed forms it must reproduce (a check of
the model, not a timing): ring = 2(N-1)/N * S/B plus 2(N-1) link latencies, INA
through an aggregator whose link is no bottleneck = S/B plus its path latency, a
single aggregator behind one oversubscribed uplink = hosts_per_rack * S / uplink,
and rack + spine aggregation = S/B whatever the rack count."""
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
