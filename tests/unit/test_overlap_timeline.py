"""benchmarks/overlap_timeline.py's tail: where a step's wait after backward went,
from every rank's timeline (the split issue 33's step target is read from)."""
import json

from benchmarks import overlap_timeline

MS = 1000.0  # the timeline's unit is µs


def _timeline(path, spans):
    """A NETREDUCE_TIMELINE file: one row per tensor, spans (tensor, phase, start ms,
    end ms, args)."""
    events, tids = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0,
                     "args": {"name": "rank 0"}}], {}
    for name, phase, a, b, args in spans:
        if name not in tids:
            tids[name] = len(tids) + 1
            events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tids[name],
                           "args": {"name": name}})
        e = {"name": phase, "ph": "X", "pid": 0, "tid": tids[name], "ts": a * MS,
             "dur": (b - a) * MS}
        if args:
            e["args"] = args
        events.append(e)
    path.write_text(json.dumps(events))
    return str(path)


def test_tail_splits_the_wait_after_backward(tmp_path):
    # Rank 0: backward 100..500 ms, update at 700. Tensor a (1 MB) submitted at 150
    # (rank 1: 200), agreed at 250, on the wire 255..520; tensor b submitted at 480
    # (rank 1: 560, whose backward ends at 560), agreed at 600, on the wire 610..650.
    big, small = {"bytes": 1_000_000}, {"bytes": 100_000}
    tl0 = _timeline(tmp_path / "tl0.json", [
        ("a", "queued", 150, 250, None), ("a", "copy_in", 250, 255, big),
        ("a", "allreduce", 255, 520, big), ("a", "copy_out", 520, 521, big),
        ("b", "queued", 480, 600, None), ("b", "copy_in", 600, 601, small),
        ("b", "allreduce", 610, 650, small), ("b", "copy_out", 650, 651, small),
        ("(agreement rounds)", "round", 240, 250, None)])
    tl1 = _timeline(tmp_path / "tl1.json", [
        ("a", "queued", 200, 250, None), ("a", "allreduce", 255, 520, big),
        ("b", "queued", 560, 600, None), ("b", "allreduce", 610, 650, small)])
    steps0 = [[0 * MS, 100 * MS, 500 * MS, 700 * MS, 710 * MS]]
    steps1 = [[0 * MS, 110 * MS, 560 * MS, 700 * MS, 710 * MS]]
    out = overlap_timeline.tail([tl0, tl1], [steps0, steps1])
    step = out["steps"][0]
    assert step["wait_ms"] == 200.0
    assert step["skew_ms"] == 60.0
    # 500..520 wire, 520..560 b not yet submitted on rank 1, 560..600 the round,
    # 600..610 the hand-over, 610..650 wire, 650..700 landing
    assert step["after"] == {"wire": 60.0, "not_ready": 40.0, "agreement": 40.0,
                             "submit": 10.0, "landing": 50.0}
    assert sum(step["after"].values()) == step["wait_ms"]
    # during backward: idle until a was on every rank (100..200), agreeing it
    # (200..250), handing it over (250..255), then on the wire to 500
    assert step["during"] == {"wire": 245.0, "not_ready": 100.0, "agreement": 50.0,
                              "submit": 5.0}
    # a from 200 (265 ms long) to 465, b from 560 (ready everywhere) to 600
    assert step["ideal_end_ms"] == 500.0 and step["last_end_ms"] == 550.0
    assert step["MB_after_backward"] == round(1.0 * 20 / 265 + 0.1, 2)
    rows = step["messages"]
    assert [(r["ready0"], r["ready_all"], r["agreed"], r["start"], r["end"]) for r in rows] == [
        (50.0, 100.0, 150.0, 155.0, 420.0), (380.0, 460.0, 500.0, 510.0, 550.0)]
    assert "agreement 40.0" in overlap_timeline.describe_tail(out)
