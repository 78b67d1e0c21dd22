"""One run of one mode of benchmarks/overlap_frameworks.py on the testbed: the
aggregator or the framework's own helpers (ps-lite), the ranks (overlap_fw_ranks.py),
the machine's CPU over rank 0's timed steps, and what rank 0's timeline says of each
step (``waits``, ``describe``)."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MWMS_PORT = 23456


def _python(target: str) -> str:
    if target == "mxnet":
        from train_mxnet import venv_python
        return venv_python()
    return sys.executable


def run_mode(tb, label: str, args: argparse.Namespace, tmp: str) -> Dict[str, Any]:
    """One run of mode ``label`` (MODE, or MODE@CODE: the adapter from the checkout
    --code names CODE)."""
    import allreduce_launch as launch
    import common
    from train_mxnet import _wait_workers, start_ps_lite

    import overlap_step
    n = args.np
    mode, code, variant = overlap_step.parse_label(label)
    record: Dict[str, Any] = {"mode": label, "load": list(os.getloadavg())}
    python = _python(args.target)
    timeline = os.path.join(tmp, "timeline.json")
    argv = [python, os.path.join(HERE, "overlap_frameworks.py"), args.target, "--worker", "--mode", mode,
            "--batch-size", str(args.batch_size), "--steps", str(args.steps),
            "--warmup", str(args.warmup)]
    base = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1", "PYTHONUNBUFFERED": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2", "NRBENCH_IFNAME": tb.ifname,
            "NRBENCH_TREE": dict(c.split("=", 1) for c in args.code)[code] if code else ROOT}
    if variant:  # every rank's process, whatever the mode
        base.update(args.variants[variant])
    per_rank: List[Dict[str, str]] = [{"NRBENCH_RANK": str(r)} for r in range(n)]
    cleanup, helpers = [], []
    logs = [os.path.join(tmp, f"worker{r}.log") for r in range(n)]
    sampler = common.MachineCPUSampler()  # the whole machine and each rank's process
    try:
        if mode.startswith("nr-"):
            sw = tb.spawn_switch(args=shlex.split(args.switch_args))
            cleanup.append(sw.stop)
            sampler.watch("aggregator", sw.pid)
            base.update(NETREDUCE_SWITCH=f"{sw.address[0]}:{sw.address[1]}",
                        NETREDUCE_JOB=f"ov{args.target}-{uuid.uuid4().hex[:8]}",
                        NETREDUCE_SIZE=str(n), NETREDUCE_LOCAL_SIZE="1")
            if args.timeline:
                base["NETREDUCE_TIMELINE"] = timeline
            for item in args.nr_env:
                key, _, value = item.partition("=")
                base[key] = value
            for r in range(n):
                per_rank[r].update(NETREDUCE_RANK=str(r), NETREDUCE_LOCAL_RANK="0")
        elif mode == "tf-mwms":
            cluster = {"worker": [f"{h.address}:{MWMS_PORT}" for h in tb.hosts]}
            for r in range(n):
                per_rank[r]["TF_CONFIG"] = json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": r}})
        elif mode == "dist_sync":  # a scheduler on host 0, a server per host
            helpers += start_ps_lite(tb, python, base, per_rank, list(tb.hosts), tmp)
        procs = []
        sampler.__enter__()
        cleanup.append(lambda: sampler.__exit__(None))
        for r in range(n):
            env = launch.worker_env(dict(base, **per_rank[r]))
            for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                          "grpc_proxy", "all_proxy", "ALL_PROXY"):
                env.pop(proxy, None)
            with open(logs[r], "w") as log:
                procs.append(tb.popen(r, argv, env=env, cwd=ROOT, stdout=log,
                                      stderr=subprocess.STDOUT))
            sampler.watch("ranks", procs[-1].pid)
        t0 = time.monotonic()
        try:
            _wait_workers(procs, helpers, args.timeout, f"{mode} N={n}", tmp)
        except RuntimeError as exc:
            return dict(record, error=f"{exc}: worker 0: {common.log_tail(logs[0])}")
        record["wall_s"] = round(time.monotonic() - t0, 1)
    finally:
        common.stop(helpers, terminate=False)
        common.run_cleanups(cleanup)
    record["load"] += list(os.getloadavg())
    for path in logs:  # ps-lite numbers its workers itself: any log may hold rank 0
        for line in open(path, errors="replace"):
            if line.startswith("RESULT "):
                record.update(json.loads(line[7:]))
                break
    if "params" not in record:
        return dict(record, error=f"no RESULT line: worker 0: {common.log_tail(logs[0])}")
    timed = record.get("stamps") or record.get("cpu_stamps")
    if timed:  # rank 0's timed steps are back to back: their starts and the last end
        record["machine_cpu"] = overlap_step.machine_cpu(
            sampler, [[a] for a, _ in timed] + [[timed[-1][1]]], os.cpu_count() or 1)
    if "stamps" in record:
        steps = [b - a for a, b in record["stamps"]]
        record["step"] = round(statistics.median(steps) / 1e6, 5)
        record["step_min_max"] = [round(min(steps) / 1e6, 5), round(max(steps) / 1e6, 5)]
        if args.timeline and os.path.exists(timeline):
            record["timeline"] = waits(timeline, record["stamps"])
            if args.keep:
                import shutil
                shutil.copy(timeline, os.path.join(args.keep, f"{args.target}_{label}_"
                                                   f"{time.strftime('%H%M%S')}.timeline.json"))
    return record


def waits(path: str, stamps: List[List[float]]) -> Dict[str, Any]:
    """Per step, from rank 0's timeline (ms after the step started): when the core
    got the first and the last gradient, each data message's ready/start/end, the
    link's idle time between the first message's start and the last's end, and what
    the step waited after the last message (the update, the framework's own work)."""
    import overlap_timeline
    msgs = [m for m in overlap_timeline.groups(overlap_timeline.load_events(path))
            if not m.get("round")]
    subs = [e["ts"] for e in overlap_timeline.load_events(path)
            if e.get("ph") == "X" and e["name"] in ("negotiate", "queued")]  # submitted
    per = []
    for z, end in stamps:
        mine = [m for m in msgs if z <= m["start"] < end]
        ready = [s for s in subs if z <= s < end]
        if not mine:
            continue
        busy = sum(m["end"] - m["start"] for m in mine)
        span = mine[-1]["end"] - mine[0]["start"]
        ms = lambda v, z=z: round((v - z) / 1e3, 1)  # noqa: E731
        per.append({
            "step_ms": round((end - z) / 1e3, 1),
            "first_ready_ms": ms(min(ready)) if ready else None,
            "last_ready_ms": ms(max(ready)) if ready else None,
            "first_start_ms": ms(mine[0]["start"]), "last_end_ms": ms(mine[-1]["end"]),
            "transfer_ms": round(busy / 1e3, 1), "idle_between_ms": round((span - busy) / 1e3, 1),
            "after_last_ms": round((end - mine[-1]["end"]) / 1e3, 1),
            "messages": [{"MB": round(m["bytes"] / 1e6, 2), "tensors": len(m["tensors"]),
                          "ready": ms(max(m["submitted"])) if m["submitted"] else None,
                          "start": ms(m["start"]), "end": ms(m["end"])} for m in mine]})
    keys = [k for k in (per[0] if per else {}) if k.endswith("_ms")]
    med = {k: round(statistics.median([p[k] for p in per if p[k] is not None]), 1) for k in keys
           if any(p[k] is not None for p in per)}
    typical = min(per, key=lambda p: abs(p["step_ms"] - med["step_ms"])) if per else None
    return {"median": med, "typical_step": typical, "steps": per}



def describe(tl: Dict[str, Any], indent: str = "      ") -> str:
    m, out = tl["median"], []
    out.append(indent + "medians, ms after the step starts: gradients reach the core %s..%s; "
               "messages %s..%s, transfer %s, link idle between them %s; step waits %s after "
               "the last one (step %s)" % (
                   m.get("first_ready_ms"), m.get("last_ready_ms"), m.get("first_start_ms"),
                   m.get("last_end_ms"), m.get("transfer_ms"), m.get("idle_between_ms"),
                   m.get("after_last_ms"), m.get("step_ms")))
    for row in (tl.get("typical_step") or {}).get("messages", []):
        out.append(indent + "  %7.2f MB in %2d tensor(s): ready %7s, sent %7.1f .. %7.1f" % (
            row["MB"], row["tensors"], row["ready"], row["start"], row["end"]))
    return "\n".join(out)

