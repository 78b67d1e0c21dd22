"""benchmarks/overlap_fw_record.py: overlap_frameworks.py's CPU floor of a run (step_floor.py's (d) for the
Keras and MXNet steps): the paced floor's CPU scaled per byte to the step's gradient
bytes, the compute mode's ranks' CPU, over the cores; each mode's step against it."""
from benchmarks import overlap_fw_record, step_floor

S = 244_403_200  # AlexNet's float32 gradients, bytes
ROUND = 64 << 20


def _run(**modes):
    run = {"bound": {"forward": 0.4, "backward": 2.9, "update": 0.3, "S_bytes": S, "bound_s": 3.6},
           "floor": {"rank_cpu_s": 0.05, "aggregator_cpu_s": 0.15, "round_bytes": ROUND},
           "modes": {"compute": {"machine_cpu": {"ranks_cpu_s_per_step": 6.5, "busy_fraction": 0.99}},
                     "nr-hvd": {"step": 4.4, "machine_cpu": {
                         "ranks_cpu_s_per_step": 7.9, "aggregator_cpu_s_per_step": 0.4,
                         "busy_fraction": 1.0, "cpu_bound_s": 4.3}}}}
    run["modes"].update(modes)
    return run


def test_comm_cpu_scales_the_floor_per_byte():
    c = step_floor.comm_cpu_of({"rank_cpu_s": 0.05, "aggregator_cpu_s": 0.15}, 4, ROUND, S)
    scale = S / ROUND
    assert c["rank_cpu_s"] == round(0.05 * scale, 5)
    assert c["aggregator_cpu_s"] == round(0.15 * scale, 5)
    assert c["comm_cpu_s"] == round(4 * 0.05 * scale + 0.15 * scale, 5)
    assert step_floor.comm_cpu_of({"rank_cpu_s": 0.1, "aggregator_cpu_s": 0.2}, 2, S, S)["comm_cpu_s"] == 0.4


def test_cpu_floor_is_compute_plus_comm_over_the_cores():
    f = overlap_fw_record.cpu_floor_of(_run(), 4, 2)
    comm = (4 * 0.05 + 0.15) * S / ROUND
    assert f["comm_cpu_s"] == round(comm, 5)
    assert f["cpu_floor_s"] == round((6.5 + comm) / 2, 5)
    assert f["cpu_floor_vs_bound"] == round(f["cpu_floor_s"] / 3.6, 4)
    assert f["target_vs_cpu_floor"] == round(1.1 * 3.6 / f["cpu_floor_s"], 4)
    assert f["nr-hvd_vs_cpu_floor"] == round(4.4 / f["cpu_floor_s"], 4)
    assert f["nr-hvd_ranks_cpu_over_compute_s"] == round(7.9 - 6.5, 4)
    assert f["nr-hvd_aggregator_cpu_s"] == 0.4 and f["nr-hvd_busy"] == 1.0
    # the measured daemon in place of the floor's reflector
    daemon = (6.5 + 4 * 0.05 * S / ROUND + 0.4) / 2
    assert abs(f["nr-hvd_cpu_floor_daemon_s"] - daemon) < 1e-4
    assert "compute_vs_cpu_floor" not in f


def test_a_peer_without_an_aggregator_and_a_failed_mode():
    f = overlap_fw_record.cpu_floor_of(
        _run(**{"tf-mwms": {"step": 6.0, "machine_cpu": {"ranks_cpu_s_per_step": 9.0}},
                "nr-strategy": {"error": "boom"}}), 4, 2)
    assert f["tf-mwms_vs_cpu_floor"] == round(6.0 / f["cpu_floor_s"], 4)
    assert "tf-mwms_aggregator_cpu_s" not in f and "tf-mwms_cpu_floor_daemon_s" not in f
    assert not any(k.startswith("nr-strategy") for k in f)


def test_no_floor_without_its_parts():
    run = _run()
    run["modes"]["compute"] = {"forward": 0.4}  # no machine_cpu
    assert overlap_fw_record.cpu_floor_of(run, 4, 2) is None
    run = _run()
    del run["floor"]
    assert overlap_fw_record.cpu_floor_of(run, 4, 2) is None
    run = _run()
    run["floor"] = {"error": "floor run failed"}
    assert overlap_fw_record.cpu_floor_of(run, 4, 2) is None


def test_quiet_bound_and_own_cpu_read_the_floor_under_load():
    run = _run()
    run["bound"]["transfer"] = 1.955
    # the compute's F + B + U took 6.5 s on a shared machine while its ranks had 6.5
    # CPU-s per step, i.e. 3.25 s of both cores: at its own share F, B, U are halved
    run["modes"]["compute"]["step"] = 6.5
    f = overlap_fw_record.cpu_floor_of(run, 4, 2)
    assert f["quiet_bound_s"] == round(0.2 + max(1.45, 1.955) + 0.15, 5)
    assert f["quiet_target_vs_cpu_floor"] == round(1.1 * f["quiet_bound_s"] / f["cpu_floor_s"], 4)
    assert f["nr-hvd_own_cpu_s"] == round((7.9 + 0.4) / 2, 5)
    assert f["nr-hvd_own_cpu_vs_cpu_floor"] == round(f["nr-hvd_own_cpu_s"] / f["cpu_floor_s"], 4)
    assert "quiet_bound_s" not in overlap_fw_record.cpu_floor_of(_run(), 4, 2)


def test_a_variant_of_the_compute_mode_is_read_as_the_compute_mode():
    # compute%VARIANT (TF's pools A/B) has F, B, U and no stamps: its line is the compute
    # mode's (the driver raised KeyError 'step_min_max' on it), and it is no step to read
    # against the floor
    fbu = {"forward": 0.25, "backward": 2.6, "update": 0.3, "step": 3.15,
           "machine_cpu": {"ranks_cpu_s_per_step": 6.4}}
    assert overlap_fw_record.mode_line("compute%one", fbu) == "F 0.250 B 2.600 U 0.300 s"
    assert overlap_fw_record.mode_line("nr-hvd%one", {"step": 4.4, "step_min_max": [4.3, 4.6]}) \
        == "step 4.400 s (4.300-4.600)"
    f = overlap_fw_record.cpu_floor_of(_run(**{"compute%one": fbu}), 4, 2)
    assert "nr-hvd_vs_cpu_floor" in f and not any(k.startswith("compute%one") for k in f)
