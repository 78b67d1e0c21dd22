"""benchmarks/step_floor.py's pure parts: the first gradient of every rank from its
step stamps and submissions, and the floor step from one run's record."""
from benchmarks import step_floor

S = 46_760_000  # bytes
R = 1e9  # bits/s: S/R = 0.37408 s


def _run(**kw):
    run = {"phases": {"forward": 0.05, "backward": 0.20, "update": 0.10},
           "t_first_ms": 20.0, "wire_s": 0.38, "tail_ms": 2.0,
           "compute_ranks_cpu_s": 0.6, "comm_cpu_s": 0.2, "cores": 2,
           "steps": {"nr-hvd": 0.60, "nr-ddp": 0.61, "ddp-gloo": 0.83}}
    run.update(kw)
    return run


def test_time_floor_is_forward_plus_first_gradient_wire_tail_plus_update():
    f = step_floor.floor(_run(), S, R)
    assert f["bound_s"] == round(0.05 + S * 8 / R + 0.10, 5)
    assert f["target_s"] == round(1.1 * f["bound_s"], 5)
    assert f["comm_span_s"] == round(0.020 + 0.38 + 0.002, 5)
    assert f["time_floor_s"] == round(0.05 + 0.402 + 0.10, 5)
    assert f["cpu_floor_s"] == 0.4  # (0.6 + 0.2) / 2
    assert f["floor_s"] == f["time_floor_s"] and f["binds"] == "time"
    assert f["target_vs_floor"] == round(f["target_s"] / f["floor_s"], 4)
    assert f["nr-hvd_vs_floor"] == round(0.60 / f["floor_s"], 4)
    assert f["ddp-gloo_vs_target"] == round(0.83 / (1.1 * f["bound_s"]), 4)
    parts = f["over_transfer_ms"]
    assert parts == {"first_gradient": 20.0, "wire_over_S/R": round((0.38 - S * 8 / R) * 1e3, 1),
                     "tail": 2.0}


def test_backward_longer_than_the_stream_and_cpu_binding():
    f = step_floor.floor(_run(phases={"forward": 0.05, "backward": 0.5, "update": 0.1}), S, R)
    assert f["backward_wait_floor_s"] == 0.5 and f["time_floor_s"] == 0.65
    f = step_floor.floor(_run(compute_ranks_cpu_s=1.2, comm_cpu_s=0.3), S, R)
    assert f["binds"] == "cpu" and f["floor_s"] == 0.75


def test_a_missing_part_gives_no_floor():
    assert step_floor.floor(_run(wire_s=None), S, R) is None
    assert step_floor.floor(_run(phases=None), S, R) is None


def test_first_gradient_per_rank_and_latest_on_rank_zero_clock():
    # (zero_grad, backward start, backward end, update start, update end), µs
    r0 = [[0, 100, 300, 400, 450], [1000, 1100, 1300, 1400, 1450]]
    r1 = [[10, 120, 310, 401, 451], [1010, 1150, 1310, 1399, 1449]]
    subs0 = {"fc.weight": [130, 1120], "conv1.weight": [290, 1290]}
    subs1 = {"fc.weight": [125, 1190], "conv1.weight": [300, 1300], "late": [5000]}
    out = step_floor.first_gradients([r0, r1], [subs0, subs1])
    # rank 0: 30 and 20 µs after its backward start; rank 1: 5 and 40
    assert out["per_rank_ms"] == [round(0.025, 2), round(0.0225, 2)]
    # the latest first submission from rank 0's backward start: 130-100, 1190-1100
    assert out["all_ms"] == round((0.030 + 0.090) / 2, 2) and out["steps"] == 2


def test_a_rank_without_a_submission_leaves_the_step_out():
    r0 = [[0, 100, 300, 400, 450]]
    out = step_floor.first_gradients([r0, r0], [{"a": [150]}, {}])
    assert out["all_ms"] is None and out["steps"] == 0


def test_summary_takes_medians_of_the_runs():
    runs = []
    for w in (0.38, 0.39, 0.40):
        run = _run(wire_s=w, loads=[1.0], hvd_after={"landing": 2.0})
        run["floor"] = step_floor.floor(run, S, R)
        runs.append(run)
    s = step_floor.summarize(runs)
    assert s["with_floor"] == 3
    assert s["part.wire_s"]["median"] == 0.39
    assert s["floor_s"]["median"] == runs[1]["floor"]["floor_s"]
    assert s["hvd_tail_after_ms"]["landing"]["median"] == 2.0


def test_the_hvd_steps_own_floor_from_its_own_phases_and_the_ranks_skew():
    hp = {"forward": 0.1, "backward": 0.3, "wait": 0.2, "update": 0.05, "step": 0.7}
    f = step_floor.floor(_run(hvd_phases=hp), S, R)  # no skew: the stream binds
    assert f["hvd_bw_wait_floor_s"] == round(0.402, 5) and f["hvd_bw_wait_s"] == 0.5
    assert f["hvd_bw_wait_vs_floor"] == round(0.5 / 0.402, 4)
    assert f["hvd_own_floor_s"] == round(0.1 + 0.402 + 0.05, 5)
    assert f["hvd_own_bound_s"] == round(0.1 + S * 8 / R + 0.05, 5)
    f = step_floor.floor(_run(hvd_phases=hp, skew_ms=150.0), S, R)  # the last rank binds
    assert f["hvd_bw_wait_floor_s"] == 0.45
    assert "hvd_own_floor_s" not in step_floor.floor(_run(), S, R)


def test_refloor_recomputes_a_record():
    run = _run(loads=[1.0])
    run["modes"] = {"nr-hvd": {"phases": {"forward": 0.1, "backward": 0.3, "wait": 0.2,
                                          "update": 0.05, "step": 0.7},
                               "tail": {"median": {"skew_ms": 150.0}}}}
    record = {"summary": {"S_bytes": S, "rate": "1gbit", "mtu": 9000, "model": "resnet18"},
              "runs": [run]}
    out = step_floor.refloor(record)
    assert out["runs"][0]["floor"]["hvd_own_floor_s"] == round(0.1 + 0.45 + 0.05, 5)
    assert out["summary"]["with_floor"] == 1 and out["summary"]["S_bytes"] == S
