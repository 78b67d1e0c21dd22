"""Run Horovod's own test files against netreduce (or against real Horovod), one test
per job, and write a raw JSON record of every test's outcome on every rank.

    python3 benchmarks/horovod_suite/run.py --horovod-src ~/src/horovod --suite torch
    python3 benchmarks/horovod_suite/run.py --horovod-src ~/src/horovod --suite torch \\
        --peer horovod                       # real Horovod (horovodrun --gloo) as the peer
    python3 benchmarks/horovod_suite/run.py --summarize A.json [--against B.json]

Horovod's tests are not part of this repository: ``--horovod-src`` is a Horovod
source tree holding ``test/`` (a checkout: ``git clone --branch v0.28.1
https://github.com/horovod/horovod``; the PyPI sdist has no tests). Its test files
import ``horovod.torch`` / ``.tensorflow`` / ``.keras`` / ``.mxnet``; for the netreduce
peer, ``names/horovod`` (first on the ranks' PYTHONPATH) makes those names *be*
netreduce's adapters and nothing more. Their test utilities need pytest, packaging,
mock and cloudpickle (and parameterized for the Keras file) in the ranks' python.

Each test runs alone, in its own ``netreduce-run -np N`` job (``horovodrun -np N -H
localhost:N --gloo`` for the horovod peer), so a test that hangs, crashes a rank or
leaves the job in a bad state costs only itself. A test passes when every rank
passed it, is skipped when every rank skipped it (or some skipped and the rest
passed), and fails otherwise: a failure on any rank, a rank that reported nothing
(crashed), or the job running past --timeout.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NAMES = os.path.join(HERE, "names")      # the horovod.* -> netreduce.* mapping
REPORT = os.path.join(HERE, "report")    # the per-rank pytest plugin

SUITES = {
    "torch": ["test/parallel/test_torch.py"],
    "mxnet": ["test/parallel/test_mxnet1.py"],
    "tensorflow": ["test/parallel/test_tensorflow.py", "test/parallel/test_tensorflow2_keras.py"],
}
# Launcher variables a test's job must not inherit from the shell that runs the harness.
_STRIP = ("NETREDUCE_SWITCH", "NETREDUCE_RANK", "NETREDUCE_SIZE", "NETREDUCE_LOCAL_RANK",
          "NETREDUCE_LOCAL_SIZE", "NETREDUCE_JOB", "NETREDUCE_JOB_SECRET", "MASTER_ADDR",
          "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def _default_python(suite: str) -> str:
    if suite == "mxnet":  # mxnet 1.9.1 lives in its own venv (scripts/env_mxnet.sh)
        cache = os.environ.get("NETREDUCE_CACHE") or os.path.expanduser("~/.cache/netreduce")
        return os.path.join(cache, "venv-mxnet", "bin", "python")
    return sys.executable


def _env(args, report_dir: Optional[str]) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _STRIP and not k.startswith("HOROVOD_")}
    paths = ([NAMES] if args.peer == "netreduce" else []) + [REPORT]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONDONTWRITEBYTECODE"] = "1"   # leave the Horovod tree as it was
    env.setdefault("OMP_NUM_THREADS", "1")  # N ranks share this host's cores
    if args.suite == "mxnet":
        env.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")
    if report_dir:
        env["HVD_SUITE_REPORT"] = report_dir
    for item in args.env:
        key, _, value = item.partition("=")
        env[key] = value
    return env


def _pytest(args, workdir: str) -> List[str]:
    # --rootdir: node ids relative to the test folder, whatever ini file the tree has
    return [args.python, "-m", "pytest", "-p", "hvd_suite_report", "-p", "no:cacheprovider",
            "-q", "--no-header", "-o", "addopts=", f"--rootdir={workdir}"]


def collect(args, workdir: str) -> List[str]:
    """The node ids of the suite's tests, as pytest collects them with this peer's
    ``horovod`` (one process, no launcher)."""
    files = [os.path.relpath(os.path.join(args.horovod_src, f), workdir) for f in args.files]
    proc = subprocess.run(_pytest(args, workdir) + ["--collect-only"] + (["-k", args.k] if args.k else [])
                          + files, cwd=workdir, env=_env(args, None), capture_output=True,
                          text=True, timeout=600)
    ids = [line.strip() for line in proc.stdout.splitlines() if "::" in line and
           not line.startswith(("ERROR", "FAILED"))]
    if not ids:
        sys.exit(f"collecting {files} found no tests (rc {proc.returncode}):\n"
                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return ids


def _launch(args, workdir: str, nodeid: str) -> List[str]:
    if args.peer == "horovod":
        return [shutil.which("horovodrun") or "horovodrun", "-np", str(args.np), "-H",
                f"localhost:{args.np}", "--gloo"] + _pytest(args, workdir) + [nodeid]
    return [shutil.which("netreduce-run") or "netreduce-run", "-np", str(args.np), "--"] + \
        _pytest(args, workdir) + [nodeid]


def _rank_outcome(lines: List[dict]) -> dict:
    phases = {r["when"]: r for r in lines}
    failed = [r for r in lines if r["outcome"] == "failed"]
    if failed:
        return {"outcome": "failed", "phase": failed[0]["when"], "message": failed[0]["message"]}
    if "call" in phases and phases["call"]["outcome"] == "passed":
        return {"outcome": "passed", "seconds": phases["call"]["seconds"]}
    skipped = [r for r in lines if r["outcome"] == "skipped"]
    if skipped:
        return {"outcome": "skipped", "message": skipped[0]["message"]}
    return {"outcome": "no report", "message": "the rank reported no outcome (it crashed, "
            "was killed, or never reached the test)"}


def run_one(args, workdir: str, nodeid: str) -> dict:
    report_dir = tempfile.mkdtemp(prefix="hvd-suite-")
    start = time.monotonic()
    timed_out = False
    try:
        proc = subprocess.Popen(_launch(args, workdir, nodeid), cwd=workdir, env=_env(args, report_dir),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
                try:
                    os.killpg(proc.pid, sig)  # the launcher and every rank it started
                except ProcessLookupError:
                    pass
                try:
                    output, _ = proc.communicate(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            else:
                output = ""
        ranks = []
        for r in range(args.np):
            path = os.path.join(report_dir, f"rank{r}.jsonl")
            lines = []
            if os.path.exists(path):
                with open(path) as f:
                    lines = [json.loads(line) for line in f if line.strip()]
            ranks.append(dict(rank=r, **_rank_outcome(lines)))  # one test per job
    finally:
        shutil.rmtree(report_dir, ignore_errors=True)
    outcomes = {r["outcome"] for r in ranks}
    if timed_out:
        outcome = "failed"
    elif outcomes == {"passed"}:
        outcome = "passed"
    elif outcomes <= {"passed", "skipped"}:
        outcome = "skipped"
    else:
        outcome = "failed"
    record = {"test": nodeid, "outcome": outcome, "rc": proc.returncode, "timed_out": timed_out,
              "seconds": round(time.monotonic() - start, 2), "ranks": ranks}
    if outcome == "failed":
        record["output_tail"] = (output or "")[-args.tail:]
    return record


def _meta(args) -> dict:
    def out(cmd: Sequence[str], cwd: Optional[str] = None, env: Optional[dict] = None) -> str:
        try:
            return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=120).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""
    probe = {"torch": "torch", "mxnet": "mxnet", "tensorflow": "tensorflow"}[args.suite] \
        if args.suite in SUITES else None
    framework = out([args.python, "-c", f"import {probe}; print({probe}.__version__)"]) \
        if probe else ""
    horovod = out(["git", "describe", "--tags", "--always"], cwd=args.horovod_src)
    if args.peer == "horovod":
        peer_version = out([args.python, "-c", "import horovod; print(horovod.__version__)"])
    else:  # the netreduce the ranks import (a checkout, an overlay or an install)
        where = out([args.python, "-c", "import netreduce; print(netreduce.__file__)"],
                    cwd=args.horovod_src, env=_env(args, None))  # not this checkout's cwd
        tree = os.path.dirname(os.path.dirname(where)) if where else ROOT
        commit = out(["git", "rev-parse", "HEAD"], cwd=tree)
        dirty = bool(out(["git", "status", "--porcelain", "--untracked-files=no"], cwd=tree))
        peer_version = f"{commit}{' (uncommitted changes)' if dirty else ''} at {tree}"
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "peer": args.peer, "peer_version": peer_version,
        "harness_commit": out(["git", "rev-parse", "HEAD"], cwd=ROOT),
        "label": args.label, "suite": args.suite, "files": args.files, "np": args.np,
        "python": args.python, "framework_version": framework,
        "horovod_tests_from": horovod or args.horovod_src,
        "rank_variables": "horovodrun's (HOROVOD_RANK...) on every rank, as Horovod's Gloo CI leg",
        "timeout_s": args.timeout, "jobs": args.jobs, "host": platform.node(),
        "cpus": os.cpu_count(), "env": args.env,
    }


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return ""


def _first_problem(test: dict) -> dict:
    """The rank that says most about a failure: one that failed (with its message)
    before one that only reported nothing (the launcher stopped it after the other
    failed)."""
    order = {"failed": 0, "skipped": 1, "no report": 2}
    ranks = [r for r in test["ranks"] if r["outcome"] != "passed"]
    return min(ranks, key=lambda r: order.get(r["outcome"], 3)) if ranks else {}


def totals(tests: List[dict]) -> dict:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for t in tests:
        counts[t["outcome"]] += 1
    counts["total"] = len(tests)
    return counts


def summarize(path: str, against: Optional[str]) -> str:
    with open(path) as f:
        rec = json.load(f)
    t = totals(rec["tests"])
    lines = [f"{path}: {rec['meta']['peer']} ({rec['meta'].get('label') or ''}) "
             f"{rec['meta']['suite']}: {t['passed']} passed, {t['failed']} failed, "
             f"{t['skipped']} skipped of {t['total']}"]
    if against:
        with open(against) as f:
            ref = json.load(f)
        ref_pass = {x["test"] for x in ref["tests"] if x["outcome"] == "passed"}
        mine = {x["test"]: x for x in rec["tests"]}
        both = sorted(n for n in ref_pass if mine.get(n, {}).get("outcome") == "passed")
        lines.append(f"passes {len(both)} of the {len(ref_pass)} that {ref['meta']['peer']} "
                     f"({ref['meta'].get('label') or ''}) passes")
        for n in sorted(ref_pass - set(both)):
            x = mine.get(n)
            why = "not run" if x is None else x["outcome"] + ": " + (
                "timeout; " if x["timed_out"] else "") + _first_problem(x).get("message", "")[:200]
            lines.append(f"  {n}: {why}")
    for x in rec["tests"]:
        if x["outcome"] == "failed" and not against:
            first = _first_problem(x)
            lines.append(f"  FAIL {x['test']}: {'timeout; ' if x['timed_out'] else ''}"
                         f"{first.get('message', '')[:200]}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--horovod-src", help="a Horovod source tree with test/ (git checkout)")
    p.add_argument("--suite", choices=sorted(SUITES), help="which of Horovod's test files")
    p.add_argument("--files", nargs="+", help="test files relative to --horovod-src "
                   "(default: the suite's)")
    p.add_argument("--peer", choices=("netreduce", "horovod"), default="netreduce")
    p.add_argument("--np", type=int, default=2, help="ranks per test (default 2)")
    p.add_argument("--python", help="the ranks' python (default: this one; the MXNet venv "
                   "for --suite mxnet)")
    p.add_argument("-k", help="pytest -k expression selecting tests")
    p.add_argument("--jobs", type=int, default=1, help="tests run at once (default 1)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per test job")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="extra environment for the ranks (repeatable)")
    p.add_argument("--label", default="", help="free text kept in the record (e.g. main)")
    p.add_argument("--out", help="JSON record (default benchmarks/results/"
                   "horovod_suite_<suite>_<peer>[_<label>].json)")
    p.add_argument("--tail", type=int, default=4000, help="output characters kept per failure")
    p.add_argument("--summarize", metavar="RECORD", help="print a record's figures and exit")
    p.add_argument("--against", metavar="RECORD", help="with --summarize: count passes among "
                   "the tests this record passes")
    args = p.parse_args(argv)
    if args.summarize:
        print(summarize(args.summarize, args.against))
        return
    if not args.horovod_src or not (args.suite or args.files):
        p.error("--horovod-src and --suite (or --files) are required")
    args.horovod_src = os.path.abspath(os.path.expanduser(args.horovod_src))
    args.files = args.files or SUITES[args.suite]
    missing = [f for f in args.files if not os.path.exists(os.path.join(args.horovod_src, f))]
    if missing:
        p.error(f"{args.horovod_src} has no {', '.join(missing)} (the PyPI sdist ships no "
                "tests: use a git checkout of the same version)")
    args.suite = args.suite or "custom"
    args.python = args.python or _default_python(args.suite)
    workdir = os.path.join(args.horovod_src, os.path.dirname(args.files[0]))
    suffix = f"_{args.label}" if args.label else ""
    out = args.out or os.path.join(ROOT, "benchmarks", "results",
                                   f"horovod_suite_{args.suite}_{args.peer}{suffix}.json")

    meta = _meta(args)
    meta["loadavg_start"] = _loadavg()
    ids = collect(args, workdir)
    print(f"{len(ids)} tests from {', '.join(args.files)}; peer {args.peer}, {args.np} ranks "
          f"each, {args.jobs} at a time; record: {out}", flush=True)
    results: Dict[str, dict] = {}
    lock = threading.Lock()

    def save() -> None:
        tests = [results[i] for i in ids if i in results]
        record = {"meta": dict(meta, loadavg_end=_loadavg()), "totals": totals(tests),
                  "tests": tests}
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out + ".tmp", "w") as f:
            json.dump(record, f, indent=1)
        os.replace(out + ".tmp", out)

    def one(nodeid: str) -> None:
        result = run_one(args, workdir, nodeid)
        with lock:
            results[nodeid] = result
            done = len(results)
            save()  # a run cut short keeps what it has
        first = _first_problem(result)
        note = "" if result["outcome"] == "passed" else \
            (" (timeout)" if result["timed_out"] else "") + " " + first.get("message", "")[:160]
        print(f"[{done}/{len(ids)}] {result['outcome'].upper():7s} {result['seconds']:6.1f}s "
              f"{nodeid.split('::')[-1]}{note}", flush=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(one, ids))
    save()
    print(summarize(out, None))


if __name__ == "__main__":
    main()
