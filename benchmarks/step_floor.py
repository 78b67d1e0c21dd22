#!/usr/bin/env python3
"""Issue 33's training step against the floor of this testbed: what backward + wait
can be at best for any all-reduce that sends each gradient once to the aggregator,
measured in the same testbed and run as the steps it bounds.

    # as root: N=4 ranks one per host, 1 Gbit/s, MTU 9000, resnet18 batch 1 (issue 33's
    # first target); 5 runs; record benchmarks/results/issue33/stepfloor_<UTC>.json
    python3 benchmarks/step_floor.py --runs 5 --testbed-name sf --subnet 10.100.0.0/24

Every run, on one testbed, in an order rotated from run to run:

* the training modes of benchmarks/overlap_step.py (``run_mode``: ddp-gloo, nr-hvd,
  nr-ddp, compute), nr-hvd with every rank's timeline and step stamps;
* (a) ``t_first``: from backward's start to the first gradient submitted (the hook),
  per rank and step, under the 4 ranks' real backward (nr-hvd's timelines); the
  step's ``t_first_all`` is the latest rank's, on rank 0's clock from rank 0's
  backward start (the aggregator can sum nothing before every rank has sent);
* (b) ``wire``: the whole gradient (S bytes) all-reduced as one engine message, back
  to back, by the same 4 ranks with nothing else running (benchmarks/one_vs_many.py's
  "one" shape): first byte out to last result in;
* (c) ``tail``: nr-hvd's landing after its last message (last result in -> the
  optimizer starts; overlap_timeline.tail's ``after.landing``), rank 0;
* (d) the CPU floor: (the compute mode's ranks' CPU per step + the communication's
  least CPU: 4 x a paced floor rank + the floor's reflector, per S bytes, from
  benchmarks/cpu_bounds.py's ``floor_point`` on the same links) / the cores.

Then the floor step = max(F + max(B, t_first_all + wire + tail) + U, (d)), F, B, U the
compute mode's; against it: the bound F + max(B, S/R) + U, the target (1.1 x the
bound), and the measured hvd and DDP steps (per run, then medians (min-max)). Where
the machine's load moves between a run's modes, read ``hvd_own_floor_s`` beside it:
the same time floor on the hvd step's own F, B, U (rank 0, the same steps), B taken
to the latest rank's backward end (``skew_ms``), and hvd's backward + wait over its
floor max(B + skew, t_first_all + wire + tail): the communication's part alone. ``--refloor RECORD``
recomputes a record's floors and summary without measuring.
The wire is measured on an idle machine and the first gradient under the step's
contention: the floor is one that an all-reduce on these cores could reach only
if sending cost no CPU beside the compute (that is (d)'s part).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
if ROOT not in sys.path:
    sys.path.insert(1, ROOT)

import common  # noqa: E402
import cpu_bounds  # noqa: E402  (floor_point: the paced floor rank and the reflector)
import overlap_step  # noqa: E402  (run_mode, bound, gradient_bytes)
import overlap_timeline  # noqa: E402  (load_events, submissions)

OUT = os.path.join(HERE, "results", "issue33")
MODES = ("ddp-gloo", "nr-hvd", "nr-ddp", "compute")
STEPS = ("nr-hvd", "nr-ddp", "ddp-gloo")  # the measured steps read against the floor


# =============================================================================
# The pure parts: the floor from what one run measured (tests/unit/test_step_floor.py).
# =============================================================================
def first_gradients(rank_steps: List[List[List[float]]], rank_subs: List[Dict[str, List[float]]]
                    ) -> Dict[str, Any]:
    """(a) per step (rank 0's timed steps): each rank's first submission after its own
    backward start, in ms from that start (``per_rank``), and the latest rank's
    first submission on rank 0's clock, in ms from rank 0's backward start
    (``all``). Steps are (zero_grad, backward start, backward end, update start,
    update end) in µs; rank r's step is the one whose update starts nearest rank 0's,
    as overlap_timeline.tail matches them. A rank without a submission in a step
    leaves that step out."""
    per_rank: List[List[float]] = [[] for _ in rank_steps]
    all_ms: List[float] = []
    for _z, b0, _b1, u0, _u1 in rank_steps[0]:
        latest: Optional[float] = None
        for r, steps in enumerate(rank_steps):
            if not steps:
                latest = None
                break
            s = min(steps, key=lambda k: abs(k[3] - u0))
            times = sorted(t for ts in rank_subs[r].values() for t in ts if s[1] <= t <= s[2])
            if not times:
                latest = None
                break
            per_rank[r].append((times[0] - s[1]) / 1e3)
            latest = times[0] if latest is None else max(latest, times[0])
        if latest is not None:
            all_ms.append((latest - b0) / 1e3)
    return {"per_rank_ms": [round(statistics.median(v), 2) if v else None for v in per_rank],
            "all_ms": round(statistics.median(all_ms), 2) if all_ms else None,
            "steps": len(all_ms)}


def comm_cpu_of(floor_rec: Dict[str, Any], ranks: int, floor_bytes: int, s_bytes: int
                ) -> Dict[str, float]:
    """(d)'s communication part from one paced-floor record (cpu_bounds.floor_point's
    ``rank_cpu_s`` and ``aggregator_cpu_s``, CPU-seconds per round of ``floor_bytes``
    per rank), scaled per byte to ``s_bytes`` (a step's gradient bytes): every floor
    rank's CPU and the reflector's, the least any INA all-reduce of those bytes costs on
    this testbed. The floor's cost per byte is flat past a few windows (it sends and
    receives each datagram once, sleeping between windows), so rounds of 64 MiB stand
    for a 244 MB step as well as rounds of its own size."""
    scale = s_bytes / floor_bytes
    rank, agg = floor_rec["rank_cpu_s"] * scale, floor_rec["aggregator_cpu_s"] * scale
    return {"rank_cpu_s": round(rank, 5), "aggregator_cpu_s": round(agg, 5),
            "comm_cpu_s": round(ranks * rank + agg, 5), "scale": round(scale, 5)}


def cpu_floor(ranks_cpu_s: float, comm_cpu_s: float, cores: int) -> float:
    """(d) in seconds: the compute's CPU-seconds per step (every rank's whole process,
    compute mode) plus the communication's least (``comm_cpu_of``), over the cores: a
    step on this machine can not be shorter, whatever the link allows."""
    return (ranks_cpu_s + comm_cpu_s) / cores


def floor(run: Dict[str, Any], s_bytes: int, rate_bps: float) -> Optional[Dict[str, Any]]:
    """The floor step of one run from its parts (seconds unless named _ms):
    ``phases`` {forward, backward, update} of the compute mode, ``t_first_ms`` (the
    latest rank's), ``wire_s``, ``tail_ms``, ``compute_ranks_cpu_s`` (the 4 ranks'
    CPU per step, compute mode), ``comm_cpu_s`` (the communication's least CPU per
    S bytes: every floor rank's and the reflector's), ``cores``; and the measured
    ``steps`` {mode: seconds}. None if a part is missing."""
    ph = run.get("phases") or {}
    need = [ph.get(k) for k in ("forward", "backward", "update")] + [
        run.get(k) for k in ("t_first_ms", "wire_s", "tail_ms", "compute_ranks_cpu_s",
                             "comm_cpu_s", "cores")]
    if any(v is None for v in need):
        return None
    f, b, u = ph["forward"], ph["backward"], ph["update"]
    transfer = s_bytes * 8 / rate_bps
    bound = f + max(b, transfer) + u
    comm = run["t_first_ms"] / 1e3 + run["wire_s"] + run["tail_ms"] / 1e3
    time_floor = f + max(b, comm) + u
    cpu_floor_s = cpu_floor(run["compute_ranks_cpu_s"], run["comm_cpu_s"], run["cores"])
    step_floor = max(time_floor, cpu_floor_s)
    out: Dict[str, Any] = {
        "bound_s": round(bound, 5), "target_s": round(1.1 * bound, 5), "transfer_s": round(transfer, 5),
        "backward_wait_floor_s": round(max(b, comm), 5), "comm_span_s": round(comm, 5),
        "time_floor_s": round(time_floor, 5), "cpu_floor_s": round(cpu_floor_s, 5),
        "floor_s": round(step_floor, 5), "binds": "cpu" if cpu_floor_s > time_floor else "time",
        "target_vs_floor": round(1.1 * bound / step_floor, 4),
        # what the time floor adds to S/R past backward's end: the first gradient, the
        # engine's rate below the link's (headers, the pipeline's fill), the landing
        "over_transfer_ms": {"first_gradient": round(run["t_first_ms"], 1),
                             "wire_over_S/R": round((run["wire_s"] - transfer) * 1e3, 1),
                             "tail": round(run["tail_ms"], 1)}}
    for mode, step in (run.get("steps") or {}).items():
        if step:
            out[f"{mode}_vs_floor"] = round(step / step_floor, 4)
            out[f"{mode}_vs_target"] = round(step / (1.1 * bound), 4)
    # The same floor on the hvd step's own forward, backward and update (rank 0, the
    # same steps): on a machine whose load moves between the modes of a run, the
    # compute mode's F, B, U are another minute's; these are not. Its backward term
    # is the latest rank's backward end on rank 0's clock (B + skew): the last
    # gradient (conv1's) can not be summed before the slowest rank has made it.
    hp = run.get("hvd_phases") or {}
    if all(hp.get(k) is not None for k in ("forward", "backward", "wait", "update")):
        skew = max(0.0, (run.get("skew_ms") or 0.0) / 1e3)
        bw = max(hp["backward"] + skew, comm)
        out["hvd_bw_wait_s"] = round(hp["backward"] + hp["wait"], 5)
        out["hvd_bw_wait_floor_s"] = round(bw, 5)
        out["hvd_bw_wait_vs_floor"] = round((hp["backward"] + hp["wait"]) / bw, 4)
        out["hvd_own_floor_s"] = round(hp["forward"] + bw + hp["update"], 5)
        out["hvd_own_bound_s"] = round(hp["forward"] + max(hp["backward"], transfer) + hp["update"], 5)
        out["hvd_own_floor_vs_bound"] = round(out["hvd_own_floor_s"] / out["hvd_own_bound_s"], 4)
    return out


def refloor(record: Dict[str, Any]) -> Dict[str, Any]:
    """A record's floors and summary computed again from its runs' parts (this file's
    arithmetic, e.g. after it changed): the record, updated."""
    s_bytes = record["summary"]["S_bytes"]
    from netreduce.testbed.plan import parse_rate
    rate = parse_rate(record["summary"]["rate"])
    for run in record["runs"]:
        hvd = run.get("modes", {}).get("nr-hvd") or {}
        run["hvd_phases"] = hvd.get("phases")
        run["skew_ms"] = ((hvd.get("tail") or {}).get("median") or {}).get("skew_ms")
        run["floor"] = floor(run, s_bytes, rate)
    summary = summarize(record["runs"])
    summary.update({k: record["summary"][k] for k in ("S_bytes", "rate", "mtu", "model")})
    record["summary"] = summary
    return record


def summarize(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Medians (min-max) over the runs of each floor figure and each part."""
    floors = [r["floor"] for r in runs if r.get("floor")]
    out: Dict[str, Any] = {"runs": len(runs), "with_floor": len(floors)}
    keys = sorted({k for f in floors for k, v in f.items() if isinstance(v, (int, float))})
    for k in keys:
        out[k] = common.spread([f.get(k) for f in floors])
    for k in ("first_gradient", "wire_over_S/R", "tail"):
        out["over_transfer_ms." + k] = common.spread([f["over_transfer_ms"][k] for f in floors], 1)
    for k in ("t_first_ms", "wire_s", "tail_ms", "skew_ms", "compute_ranks_cpu_s", "comm_cpu_s"):
        out["part." + k] = common.spread([r.get(k) for r in runs])
    for part in ("forward", "backward", "update"):
        out["compute." + part] = common.spread([(r.get("phases") or {}).get(part) for r in runs])
        out["nr-hvd." + part] = common.spread([(r.get("hvd_phases") or {}).get(part) for r in runs])
    for mode in STEPS:
        out[mode + ".step_s"] = common.spread([(r.get("steps") or {}).get(mode) for r in runs])
        out[mode + ".wait_s"] = common.spread([(r.get("waits") or {}).get(mode) for r in runs])
    out["hvd_tail_after_ms"] = {k: common.spread([(r.get("hvd_after") or {}).get(k) for r in runs], 1)
                                for k in overlap_timeline.TAIL_PARTS}
    out["load_1min"] = common.spread([x for r in runs for x in r.get("loads", [])], 2)
    return out


# =============================================================================
# The measurements.
# =============================================================================
def _mode_args(args: argparse.Namespace, mode: str, keep: str) -> argparse.Namespace:
    """overlap_step.run_mode's options for ``mode``: every rank's timeline for nr-hvd
    only (the other modes' steps without the timeline's writes)."""
    return argparse.Namespace(
        np=args.np, model=args.model, batch_size=1, warmup=args.warmup,
        batches_per_iter=args.batches_per_iter, iters=args.iters, timeline=False,
        timeline_ranks=(mode == "nr-hvd"), keep=keep if mode == "nr-hvd" else "",
        switch_args="", code=[], nr_env=[], variants={}, timeout=args.timeout)


def _first(keep: str, n: int, count: int) -> Dict[str, Any]:
    """(a) from the files run_mode kept for nr-hvd (LABEL_UTC.rank{r}.{phases,timeline}.json)."""
    steps, subs = [], []
    for r in range(n):
        ph = sorted(glob.glob(os.path.join(keep, f"*.rank{r}.phases.json")))
        tl = sorted(glob.glob(os.path.join(keep, f"*.rank{r}.timeline.json")))
        if not ph or not tl:
            return {"error": f"rank {r}: no kept phases or timeline"}
        with open(ph[-1]) as f:
            steps.append(json.load(f)[-count:])
        subs.append(overlap_timeline.submissions(overlap_timeline.load_events(tl[-1])))
    return first_gradients(steps, subs)


def wire(tb, iters: int) -> Dict[str, Any]:
    """(b) one_vs_many's ranks on this testbed: rank 0's seconds per S-byte message."""
    sw = tb.spawn_switch()
    try:
        host, port = sw.address
        me = os.path.join(HERE, "one_vs_many.py")
        procs = [tb.popen(r, [sys.executable, me, "rank", host, str(port), str(r), str(len(tb.hosts)),
                              str(iters), ROOT], stdout=subprocess.PIPE, text=True)
                 for r in range(len(tb.hosts))]
        outs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        sw.stop()
    rec = json.loads(outs[0].strip().splitlines()[-1])
    return {"one_s": rec["one"], "direct_s": rec["direct"], "bytes": rec["bytes"],
            "wire_s": statistics.median(rec["one"])}


def comm_cpu(tb, args, s_bytes: int, round_bytes: int = 0) -> Dict[str, Any]:
    """(d)'s communication part: cpu_bounds' paced floor at this testbed's rate and MTU,
    rounds of ``round_bytes`` (S bytes when 0), scaled per byte to S: every rank's CPU
    and the reflector's per S bytes (``comm_cpu_of``). ``args``: rate, mtu, floor_rounds."""
    from netreduce.testbed.plan import parse_rate
    window = common.parse_size("2M")
    nap = window / 8 / (parse_rate(args.rate) / 8)  # cpu_bounds --paced's nap
    size = round_bytes or s_bytes
    ns = argparse.Namespace(size=str(size), iters=args.floor_rounds, window="2M", fanout="group",
                            timeout=300)
    rec = cpu_bounds.floor_point(tb, ns, args.mtu, nap)
    out = comm_cpu_of(rec, len(tb.hosts), size, s_bytes)
    return dict(out, round_bytes=size, time_s=rec["time_s"], nap_s=nap,
                rank_sleeps=rec["rank_sleeps"], round_rank_cpu_s=rec["rank_cpu_s"],
                round_aggregator_cpu_s=rec["aggregator_cpu_s"])


def one_run(tb, args, i: int, s_bytes: int, rate: float) -> Dict[str, Any]:
    parts = list(MODES) + ["wire", "cpu"]
    order = parts[i % len(parts):] + parts[:i % len(parts)]
    run: Dict[str, Any] = {"run": i, "order": order, "modes": {}, "loads": []}
    for part in order:
        run["loads"].append(os.getloadavg()[0])
        try:
            if part == "wire":
                run["wire"] = wire(tb, args.wire_iters)
            elif part == "cpu":
                run["cpu"] = comm_cpu(tb, args, s_bytes)
            else:
                with tempfile.TemporaryDirectory(prefix=f"sf-{part}-") as tmp, \
                        tempfile.TemporaryDirectory(prefix="sf-keep-") as keep:
                    rec = overlap_step.run_mode(tb, part, _mode_args(args, part, keep), tmp)
                    if part == "nr-hvd" and "error" not in rec:
                        rec["first"] = _first(keep, args.np, args.iters * args.batches_per_iter)
                if "tail" in rec:  # its medians only: the per-step tables are long
                    rec["tail"] = {"median": rec["tail"]["median"]}
                run["modes"][part] = rec
        except Exception as exc:  # keep the other parts
            run.setdefault("errors", []).append(f"{part}: {exc!r}")
        print(f"  run {i} {part}: {_brief(run, part)}; load {os.getloadavg()[0]:.1f}", flush=True)
    m = run["modes"]
    comp, hvd = m.get("compute", {}), m.get("nr-hvd", {})
    run["phases"] = comp.get("phases")
    run["t_first_ms"] = (hvd.get("first") or {}).get("all_ms")
    run["t_first_per_rank_ms"] = (hvd.get("first") or {}).get("per_rank_ms")
    run["wire_s"] = (run.get("wire") or {}).get("wire_s")
    run["hvd_after"] = ((hvd.get("tail") or {}).get("median") or {}).get("after")
    run["tail_ms"] = (run["hvd_after"] or {}).get("landing")
    run["compute_ranks_cpu_s"] = (comp.get("machine_cpu") or {}).get("ranks_cpu_s_per_step")
    run["comm_cpu_s"] = (run.get("cpu") or {}).get("comm_cpu_s")
    run["cores"] = os.cpu_count() or 1
    run["steps"] = {k: (m.get(k, {}).get("phases") or {}).get("step") for k in STEPS}
    run["waits"] = {k: (m.get(k, {}).get("phases") or {}).get("wait") for k in STEPS}
    run["hvd_phases"] = hvd.get("phases")
    run["skew_ms"] = ((hvd.get("tail") or {}).get("median") or {}).get("skew_ms")
    run["floor"] = floor(run, s_bytes, rate)
    print("  run %d floor: %s" % (i, json.dumps(run["floor"])), flush=True)
    return run


def _brief(run: Dict[str, Any], part: str) -> str:
    if part in ("wire", "cpu"):
        return json.dumps({k: v for k, v in (run.get(part) or {}).items() if not isinstance(v, list)})
    rec = run["modes"].get(part) or {}
    if "error" in rec:
        return "error " + str(rec["error"])[:300]
    ph, mc = rec.get("phases") or {}, rec.get("machine_cpu") or {}
    return (f"step {ph.get('step')} (fwd {ph.get('forward')} bwd {ph.get('backward')} wait "
            f"{ph.get('wait')} upd {ph.get('update')}), ranks CPU/step {mc.get('ranks_cpu_s_per_step')}, "
            f"busy {mc.get('busy_fraction')}, first {(rec.get('first') or {}).get('all_ms')} ms, landing "
            f"{(((rec.get('tail') or {}).get('median') or {}).get('after') or {}).get('landing')} ms")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--warmup", type=int, default=10, help="the script's --num-warmup-batches")
    ap.add_argument("--batches-per-iter", type=int, default=10)
    ap.add_argument("--iters", type=int, default=5, help="the script's --num-iters")
    ap.add_argument("--wire-iters", type=int, default=4, help="(b): S-byte messages per run")
    ap.add_argument("--floor-rounds", type=int, default=5, help="(d): S-byte floor rounds per run")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--testbed-name", default="nrsf")
    ap.add_argument("--subnet", default="10.77.34.0/24")
    ap.add_argument("--out", default="")
    ap.add_argument("--refloor", default="", metavar="RECORD",
                    help="measure nothing: RECORD's floors and summary again (rewritten in place)")
    args = ap.parse_args(argv)
    if args.refloor:
        with open(args.refloor) as f:
            record = refloor(json.load(f))
        with open(args.refloor, "w") as f:
            json.dump(record, f, indent=1)
        print(json.dumps(record["summary"], indent=1))
        return 0
    from netreduce.testbed import Testbed
    from netreduce.testbed.plan import parse_rate
    s_bytes = overlap_step.gradient_bytes(args.model)
    rate = parse_rate(args.rate)
    utc = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = args.out or os.path.join(OUT, f"stepfloor_{utc}.json")
    runs: List[Dict[str, Any]] = []
    with Testbed(hosts=args.np, rate=args.rate, mtu=args.mtu, name=args.testbed_name,
                 subnet=args.subnet, replace=True) as tb:
        for i in range(args.runs):
            runs.append(one_run(tb, args, i, s_bytes, rate))
            summary = summarize(runs)
            summary.update(S_bytes=s_bytes, rate=args.rate, mtu=args.mtu, model=args.model)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:  # rewritten after every run: a stopped run keeps its runs
                json.dump({"command": "python3 benchmarks/step_floor.py " + " ".join(
                    sys.argv[1:] if argv is None else argv), "commit": overlap_step._commit(),
                    "utc": utc, "machine": common.machine_description(), "summary": summary,
                    "runs": runs}, f, indent=1)
    print(json.dumps(summary, indent=1))
    print(f"# wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
