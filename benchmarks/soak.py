#!/usr/bin/env python3
"""Soak benchmark (issue 14): a long job under loss and worker restarts.

N worker processes (default 4) run an endless seeded stream of all-reduces of
random sizes (1 to 1 Mi elements), dtypes (float32, float64, int32, int64) and ops
through the public API against a real netreduce-switch daemon, with 1 % of every
worker's data packets dropped by the engine knob (NETREDUCE_DROP_RATE). Every
``--restart-every`` seconds one worker (in turn) is SIGKILLed and started again;
the others see the job fail with an error naming that rank, call
netreduce.shutdown() and netreduce.init() again, and the job resumes once the new
process has joined. Every result is checked bit for bit against numpy (float data
are quarter-integers, so every sum is exact); the daemon's RSS is sampled from
/proc every few seconds.

    PYTHONPATH=. python benchmarks/soak.py                       # 10 min, the figure
    PYTHONPATH=. python benchmarks/soak.py --seconds 40 --restart-every 15   # quick

Prints one JSON record (and writes it to --out): all-reduces checked, wrong
results (must be 0), restarts, job runs that ended in an error (expected: one per
restart, on every surviving rank), and the RSS samples.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Dict, List, Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DTYPES = ("float32", "float64", "int32", "int64")
# A run begun this close to the end would wait for ranks that are leaving: none is.
END_MARGIN_S = 5.0
OPS = ("sum", "min", "max")


# --- worker ----------------------------------------------------------------------
def contribution(step: int, rank: int, count: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng([step, rank])
    if dtype.startswith("int"):
        return rng.integers(-10**6, 10**6, count).astype(dtype)
    return (rng.integers(-4096, 4096, count) / 4).astype(dtype)


def case(step: int, max_elems: int):
    rng = np.random.default_rng([step, 1 << 20])
    count = max(1, int(np.exp(rng.uniform(0.0, np.log(max_elems + 1)))))
    return count, DTYPES[int(rng.integers(len(DTYPES)))], OPS[int(rng.integers(len(OPS)))]


def worker(deadline: float, max_elems: int) -> None:
    import netreduce as nr
    from netreduce.errors import NetReduceError
    ops = {"sum": (nr.Sum, np.add), "min": (nr.Min, np.minimum), "max": (nr.Max, np.maximum)}
    checked = wrong = runs = failed_runs = 0
    last_report = time.monotonic()

    def report(final: bool = False) -> None:
        print(json.dumps({"checked": checked, "wrong": wrong, "runs": runs,
                          "failed_runs": failed_runs, "final": final}), flush=True)

    while time.time() < deadline - END_MARGIN_S:  # no new run that could not form in time
        runs += 1
        try:
            nr.init()
            rank, size = nr.rank(), nr.size()
            step = 0
            while time.time() < deadline:
                count, dtype, op = case(step, max_elems)
                got = nr.allreduce(contribution(step, rank, count, dtype), op=ops[op][0],
                                   name=f"s{step}")
                want = contribution(step, 0, count, dtype)
                for r in range(1, size):
                    want = ops[op][1](want, contribution(step, r, count, dtype))
                if not np.array_equal(got, want):
                    wrong += 1
                    print(json.dumps({"wrong_at": step, "dtype": dtype, "op": op, "count": count}),
                          flush=True)
                checked += 1
                step += 1
                if time.monotonic() - last_report > 2.0:
                    report()
                    last_report = time.monotonic()
        except NetReduceError:
            failed_runs += 1  # a peer was restarted: rejoin
            report()  # banked now: this process may be the next one killed
        finally:
            try:
                nr.shutdown()
            except NetReduceError:
                pass
    report(final=True)


# --- driver ----------------------------------------------------------------------
def rss_kib(pid: int) -> int:
    from common import proc_stat  # this checkout's (benchmarks/ is sys.path[0])
    try:
        return proc_stat.status_int(pid, "VmRSS")
    except KeyError:
        return 0


class Rank:
    def __init__(self, rank: int, env: Dict[str, str], args: List[str]) -> None:
        self.rank, self.env, self.args = rank, env, args
        self.latest: Dict[str, int] = {}
        self.totals = {"checked": 0, "wrong": 0, "runs": 0, "failed_runs": 0}
        self.proc: Optional[subprocess.Popen] = None
        self.wrong_lines = 0  # each wrong result is also printed at once: none is lost to a kill
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, env=self.env, stdout=subprocess.PIPE, text=True)
        self.latest = {}
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            rec = json.loads(line)
            if "checked" in rec:
                self.latest = rec
            else:
                self.wrong_lines += 1
                print("WRONG", self.rank, rec, file=sys.stderr, flush=True)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        time.sleep(0.2)  # let the reader take the last line
        self._bank()

    def _bank(self) -> None:
        for k in self.totals:
            self.totals[k] += int(self.latest.get(k, 0))
        self.latest = {}

    def finish(self, timeout: float) -> None:
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        time.sleep(0.2)
        self._bank()


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--restart-every", type=float, default=60.0)
    p.add_argument("-n", "--ranks", type=int, default=4)
    p.add_argument("--loss", type=float, default=0.01)
    p.add_argument("--max-elems", type=int, default=1 << 20)
    p.add_argument("--out", default=None, help="also write the JSON record here")
    p.add_argument("worker", nargs="?", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker == "worker":
        worker(args.deadline, args.max_elems)
        return 0

    sys.path.insert(0, REPO)
    from netreduce.switch import spawn
    sw = spawn(host="127.0.0.1", port=0)
    job = "soak-" + uuid.uuid4().hex[:8]
    deadline = time.time() + args.seconds
    base = dict(os.environ, NETREDUCE_SWITCH=f"{sw.address[0]}:{sw.address[1]}",
                NETREDUCE_JOB=job, NETREDUCE_SIZE=str(args.ranks),
                NETREDUCE_DROP_RATE=str(args.loss), NETREDUCE_TIMEOUT="10",
                # a re-formed job waits this long at most for a rank (restart included)
                NETREDUCE_START_TIMEOUT="30",
                NETREDUCE_JOB_SECRET=uuid.uuid4().hex,
                PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, os.path.abspath(__file__), "worker", "--deadline", str(deadline),
           "--max-elems", str(args.max_elems)]
    t0 = time.time()
    ranks = [Rank(r, dict(base, NETREDUCE_RANK=str(r)), cmd) for r in range(args.ranks)]
    rss: List[List[float]] = []
    restarts = 0
    next_restart = t0 + args.restart_every
    try:
        while time.time() < deadline - 1.0:
            rss.append([round(time.time() - t0, 1), rss_kib(sw.proc.pid)])
            if time.time() >= next_restart and time.time() < deadline - args.restart_every / 3:
                victim = ranks[restarts % args.ranks]
                victim.kill()
                victim.start()
                restarts += 1
                next_restart += args.restart_every
            time.sleep(min(5.0, max(0.1, deadline - time.time() - 1.0)))
        for r in ranks:
            r.finish(timeout=60.0)
        rss.append([round(time.time() - t0, 1), rss_kib(sw.proc.pid)])
    finally:
        for r in ranks:
            if r.proc is not None and r.proc.poll() is None:
                r.proc.kill()
        sw.stop()
    warm = [kib for t, kib in rss if t >= min(30.0, args.seconds / 4)] or [rss[-1][1]]
    record = {
        "seconds": round(time.time() - t0, 1), "ranks": args.ranks, "loss": args.loss,
        "restart_every_s": args.restart_every, "restarts": restarts,
        "checked": sum(r.totals["checked"] for r in ranks) // args.ranks,
        "checked_per_rank": [r.totals["checked"] for r in ranks],
        "wrong": max(sum(r.totals["wrong"] for r in ranks), sum(r.wrong_lines for r in ranks)),
        "failed_runs_per_rank": [r.totals["failed_runs"] for r in ranks],
        "rss_kib_first": rss[0][1], "rss_kib_after_warmup_min": min(warm),
        "rss_kib_after_warmup_max": max(warm), "rss_kib_last": rss[-1][1],
        "rss_samples": rss, "load": os.getloadavg(),
    }
    text = json.dumps(record)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if record["wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
