#!/usr/bin/env python3
"""The flat data plane's per-call cost, paired A/B against another checkout (issue 33,
"one call for reduce, scaled or not": Connection.allreduce_async's one engine.submit
call in place of three branches must leave the hot path no slower).

    python benchmarks/scale_call_ab.py --base /work/wt/scaleapi-base --np 2 --runs 7 \\
        --json benchmarks/results/issue33/scaleapi_call_ab.json

Each run starts, for each checkout in turn (the order alternates run by run), a
netreduce-switch of that checkout on 127.0.0.1 and ``--np`` rank processes
(PYTHONPATH = the checkout, its in-place native module), each connect()ing the flat
data plane and timing ``--calls`` all-reduces of 1,024 float32 (4 KiB) into another
array, in three forms, one after the other:

* ``connection``: ``Connection.allreduce_async(x, out).wait()`` (scale 1.0);
* ``scaled``: the same with ``scale=0.5`` (the engine's copy times 0.5: an Average);
* ``flat``: ``Flat(connection).allreduce(x, out)``, what the executor calls for a lone
  tensor (netreduce/worker/group_message.py).

Reports per form and checkout: µs per call (the slowest rank's wall time), CPU µs
per call (utime + stime of every rank's whole process, every thread, summed), and,
from ``--calls`` more calls each timed alone up to the request handed to the engine
(``allreduce_async``; Flat's for ``flat``), the median ns of that call and its 10th
percentile (the ranks' mean): the Python path and the binding, which a preemption
under load does not move as it moves the others. Each as the median of the runs with
min-max, and the ratio of this checkout to the base per run.
The base must have a native module built in place (setup.py build_ext --inplace).

``--stub``: the Python path alone, resolvable under load: a Connection whose engine
is a stand-in returning at once, each form's ``allreduce_async`` timed by timeit's best
of ``--repeat`` x ``--calls`` in a process per checkout and run (ns per call)."""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FORMS = ("connection", "scaled", "flat")


def rank(args: argparse.Namespace) -> None:
    import numpy as np

    from netreduce.algorithms.flat import Flat
    from netreduce.worker import dataplane

    host, port = args.address.rsplit(":", 1)
    with dataplane.connect((host, int(port)), args.job, args.rank, args.np,
                           timeout=60.0) as conn:
        flat = Flat(conn)
        x = np.ones(1024, np.float32)
        out = np.empty_like(x)
        calls = {"connection": lambda: conn.allreduce_async(x, out).wait(),
                 "scaled": lambda: conn.allreduce_async(x, out, scale=0.5).wait(),
                 "flat": lambda: flat.allreduce(x, out)}
        submits = {"connection": lambda: conn.allreduce_async(x, out),
                   "scaled": lambda: conn.allreduce_async(x, out, scale=0.5),
                   "flat": lambda: flat.allreduce_async(x, out)}
        clock = time.perf_counter_ns
        result: Dict[str, Any] = {}
        for form in FORMS:
            call = calls[form]
            for _ in range(args.warmup):
                call()
            want = args.np * (0.5 if form == "scaled" else 1.0)
            assert (out == want).all(), (form, out[:4])
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            for _ in range(args.calls):
                call()
            t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
            # The call alone, up to the request handed to the engine (the Python path
            # and the binding, where this lever changes anything): each call timed,
            # the median and the 10th percentile, which a preemption does not move.
            submit, ns = submits[form], []
            for _ in range(args.calls):
                a = clock()
                req = submit()
                ns.append(clock() - a)
                req.wait()
            ns.sort()
            result[form] = {"us": (t1 - t0) / args.calls * 1e6,
                            "cpu_us": cpu / args.calls * 1e6,
                            "submit_ns": ns[len(ns) // 2], "submit_ns_p10": ns[len(ns) // 10]}
        print(json.dumps(result), flush=True)


def stub(args: argparse.Namespace) -> None:
    """The Python path alone: a Connection whose engine is a stand-in that returns at
    once (no aggregator, no engine thread), each form timed by timeit's best of
    ``--repeat`` x ``--calls``: what load does not move. Prints ns per call."""
    import timeit
    import types

    import numpy as np

    from netreduce.algorithms.flat import Flat
    from netreduce.worker.dataplane import Connection

    conn = Connection.__new__(Connection)
    conn.__dict__.update(_closed=False, address=("127.0.0.1", 4791), rack=None, job="j",
                         rank=0, size=2,
                         _engine=types.SimpleNamespace(submit=lambda *a, **k: None))
    flat = Flat(conn)
    x = np.ones(1024, np.float32)
    out = np.empty_like(x)
    forms = {"connection": lambda: conn.allreduce_async(x, out),
             "scaled": lambda: conn.allreduce_async(x, out, scale=0.5),
             "flat": lambda: flat.allreduce_async(x, out)}
    print(json.dumps({form: min(timeit.repeat(fn, number=args.calls, repeat=args.repeat))
                      / args.calls * 1e9 for form, fn in forms.items()}), flush=True)


def drive_stub(args: argparse.Namespace) -> None:
    trees = {"this": REPO, "base": os.path.abspath(args.base)}
    runs: List[Dict[str, Any]] = []
    for i in range(args.runs):
        order = ["base", "this"] if i % 2 == 0 else ["this", "base"]
        run: Dict[str, Any] = {"order": order, "load": os.getloadavg()[0]}
        for name in order:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "stub",
                                  "--calls", str(args.calls), "--repeat", str(args.repeat)],
                                 capture_output=True, text=True, check=True, cwd=trees[name],
                                 env=dict(os.environ, PYTHONPATH=trees[name])).stdout
            run[name] = json.loads(out.strip().splitlines()[-1])
        runs.append(run)
        print(json.dumps(run), flush=True)
    summary: Dict[str, Any] = {"load": _spread([r["load"] for r in runs])}
    for form in FORMS:
        this = [r["this"][form] for r in runs]
        base = [r["base"][form] for r in runs]
        summary[f"{form} python_ns"] = {"this": _spread(this), "base": _spread(base),
                                        "this/base": _spread([a / b for a, b in zip(this, base)])}
    _report(args, summary, runs)


def _switch(code: str) -> Any:
    proc = subprocess.Popen([sys.executable, "-m", "netreduce.switch", "--host", "127.0.0.1",
                             "--port", "0"], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=code), cwd=code)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return proc, line.split("listening on ")[1].split()[0]


def one_run(code: str, args: argparse.Namespace) -> Dict[str, Dict[str, float]]:
    proc, address = _switch(code)
    try:
        job = "ab-" + uuid.uuid4().hex[:8]
        ranks = [subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "rank", "--address", address,
             "--job", job, "--rank", str(r), "--np", str(args.np), "--calls", str(args.calls),
             "--warmup", str(args.warmup)],
            stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=code), cwd=code)
            for r in range(args.np)]
        outs = []
        for p in ranks:
            out, _ = p.communicate(timeout=600)
            if p.returncode != 0:
                raise SystemExit(f"a rank of {code} failed ({p.returncode})")
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        proc.terminate()
        proc.wait()
    return {form: {"us": max(o[form]["us"] for o in outs),
                   "cpu_us": sum(o[form]["cpu_us"] for o in outs),
                   "submit_ns": statistics.mean(o[form]["submit_ns"] for o in outs),
                   "submit_ns_p10": statistics.mean(o[form]["submit_ns_p10"] for o in outs)}
            for form in FORMS}


def _spread(vals: List[float]) -> Dict[str, float]:
    return {"median": round(statistics.median(vals), 2), "min": round(min(vals), 2),
            "max": round(max(vals), 2)}


def drive(args: argparse.Namespace) -> None:
    trees = {"this": REPO, "base": os.path.abspath(args.base)}
    runs: List[Dict[str, Any]] = []
    for i in range(args.runs):
        order = ["base", "this"] if i % 2 == 0 else ["this", "base"]
        run: Dict[str, Any] = {"order": order, "load": os.getloadavg()[0]}
        for name in order:
            run[name] = one_run(trees[name], args)
        runs.append(run)
        print(json.dumps(run), flush=True)
    summary: Dict[str, Any] = {"load": _spread([r["load"] for r in runs])}
    for form in FORMS:
        for metric in ("us", "cpu_us", "submit_ns", "submit_ns_p10"):
            this = [r["this"][form][metric] for r in runs]
            base = [r["base"][form][metric] for r in runs]
            summary[f"{form} {metric}"] = {
                "this": _spread(this), "base": _spread(base),
                "this/base": _spread([a / b for a, b in zip(this, base)])}
    _report(args, summary, runs)


def _report(args: argparse.Namespace, summary: Dict[str, Any], runs: List[Any]) -> None:
    for key, s in summary.items():
        print(f"{key:20s} {json.dumps(s)}")
    if args.json:
        commit = subprocess.run(["git", "-C", args.base, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "this": head, "base": commit,
                       "np": args.np, "calls": args.calls, "warmup": args.warmup,
                       "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "summary": summary, "runs": runs}, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    r = sub.add_parser("rank")
    r.add_argument("--address", required=True)
    r.add_argument("--job", required=True)
    r.add_argument("--rank", type=int, required=True)
    st = sub.add_parser("stub")
    for a in (ap, r, st):
        a.add_argument("--np", type=int, default=2, help="ranks (default 2)")
        a.add_argument("--calls", type=int, default=10_000, help="timed calls per form")
        a.add_argument("--warmup", type=int, default=500, help="untimed calls first")
        a.add_argument("--repeat", type=int, default=20, help="--stub: timeit's repeats")
    ap.add_argument("--base", default="", help="the other checkout (built in place)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--stub", action="store_true",
                    help="the Python path alone, with a stand-in engine (no aggregator)")
    ap.add_argument("--json", default="", help="record path")
    args = ap.parse_args()
    if args.cmd == "rank":
        rank(args)
    elif args.cmd == "stub":
        stub(args)
    elif not args.base:
        ap.error("--base is required")
    else:
        (drive_stub if args.stub else drive)(args)


if __name__ == "__main__":
    main()
