#!/usr/bin/env python3
"""What a steady step costs the rank's Python, without the network: the control path
of one cached 4 KiB all-reduce (submit, route, the user thread's speculative step,
copy out, completion), A/B between two checkouts, alternated.

    python3 benchmarks/steady_step_cpu.py --before /tmp/nr-before --repeat 11
    python3 benchmarks/steady_step_cpu.py --before /tmp/nr-before --callgrind

One real ``Communicator`` (the code at each checkout) with two stand-ins: a
coordinator that logs each request at once and gives it a cache id, and a data plane
that answers as N identical ranks would (MIN: the vector itself; SUM: N times it),
with no wire and no other process. So the step's time is the communicator's, the
agreement's and the speculation's own Python, which is what a change there adds or
saves; the machine's load moves it much less than a multi-process run's.

Reports per step: CPU µs of the whole process (every thread: the executor's polls
too) and wall µs, each checkout's median over ``--repeat`` runs run alternately, and
the paired differences (after - before) of the runs made back to back.
``--callgrind``: instructions per step instead (valgrind, two step counts
subtracted, so start-up is not counted): exact, load-independent, slow (~1 min a run).
The raw record goes to benchmarks/results/iface/steady_step_<utc>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


# --- the worker: runs in a process whose PYTHONPATH is the checkout under test -------
def worker(args: argparse.Namespace) -> None:
    import numpy as np

    from netreduce import config
    from netreduce.ops import ReduceOp
    from netreduce.protocol import messages
    from netreduce.protocol.signature import Signature
    from netreduce.worker.communicator import Communicator
    from netreduce.worker.handle import Handle, Tensor
    from netreduce.worker.negotiation import Mailbox

    size = args.size

    class Coordinator:
        """A NegotiationClient stand-in: every request is logged at once (one entry
        each), a named one with a new cache id; an empty long-poll is answered empty
        after its wait."""

        def __init__(self, address: Any, job: str, rank: int, size: int, *, threshold: int,
                     capacity: int, start_timeout: float, timeout: float = 30.0,
                     agree: bool = False) -> None:
            self.agree, self.width, self.threshold = True, capacity, threshold
            self.next_seq, self.requests = 0, 0
            self.poll_conn = Mailbox("stand-in")
            self._seq, self._ids, self._backlog = 0, {}, []
            self._closed = threading.Event()

        def _entries(self, reqs: List[Any]) -> List[Any]:
            entries = []
            for req in reqs:
                if isinstance(req, int):
                    entries.append(messages.LogEntry(seq=self._seq, tensors=[req]))
                else:
                    new = self._ids.setdefault(req.name, len(self._ids))
                    entries.append(messages.LogEntry(seq=self._seq, tensors=[req.name],
                                                     assign={req.name: new}))
                self._seq += 1
            return entries

        def send_poll(self, reqs: List[Any], wait_ms: float, stall_s: float) -> None:
            self.requests += 1
            reqs, self._backlog = self._backlog + list(reqs), []
            if reqs:
                self.poll_conn.deliver(messages.NegotiateReply(entries=self._entries(reqs)))
            else:
                timer = threading.Timer(wait_ms / 1000.0, self.poll_conn.deliver,
                                        (messages.NegotiateReply(),))
                timer.daemon = True
                timer.start()

        def recv_poll(self) -> Any:
            return self.poll_conn.take()

        def submit(self, reqs: List[Any]) -> None:
            self.requests += 1
            self._backlog.extend(reqs)

        def watch(self) -> Any:
            self._closed.wait()
            return messages.WatchReply()

        def bye(self, done: int) -> None:
            pass

        def abort(self, reason: str) -> None:
            pass

        def close(self) -> None:
            self._closed.set()
            self.poll_conn.close()

    class DataPlane:
        """N identical ranks: MIN returns the vector, SUM N times it."""
        name = "stand-in"

        def allreduce(self, src: Any, dst: Any = None, op: str = "sum", dtype: Any = None,
                      scale: float = 1.0) -> None:
            if op in ("sum", "average"):
                np.multiply(src, size * scale, out=src if dst is None else dst)
            elif dst is not None:
                dst[...] = src

        def abort(self, reason: str) -> None:
            pass

        def close(self) -> None:
            pass

    knobs = config.snapshot({"NETREDUCE_CACHE_AGREEMENT": True})
    comm = Communicator(rank=0, size=size, job="steady", address=("127.0.0.1", 0),
                        dataplane=DataPlane(), knobs=knobs, client_factory=Coordinator)
    sig = Signature("allreduce", "float32", (args.elements,), "sum", 1.0, 1.0, -1)
    x = np.ones(args.elements, np.float32)
    out = np.empty_like(x)

    def step() -> None:
        handle = Handle([out], False)
        comm.submit([Tensor("g", sig, True, ReduceOp.Sum, x, out, handle)])
        handle.wait()

    for _ in range(args.warmup):
        step()
    assert out[0] == size, out[:4]
    ag = comm.agreement
    hits0 = ag.spec.hits if ag is not None else 0
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(args.steps):
        step()
    t1, c1 = time.perf_counter(), time.process_time()
    assert out[0] == size, out[:4]
    print(json.dumps({"cpu_us": (c1 - c0) / args.steps * 1e6,
                      "wall_us": (t1 - t0) / args.steps * 1e6,
                      "speculative": (ag.spec.hits - hits0) if ag is not None else 0,
                      "steps": args.steps}), flush=True)
    comm.shutdown(timeout=5.0)


# --- the driver ------------------------------------------------------------------------
def _commit(path: str) -> str:
    try:
        return subprocess.run(["git", "-C", path, "describe", "--always", "--dirty", "--abbrev=7"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def _worker_cmd(args: argparse.Namespace, steps: int) -> List[str]:
    return [sys.executable, os.path.abspath(__file__), "worker", "--size", str(args.size),
            "--elements", str(args.elements), "--warmup", str(args.warmup),
            "--steps", str(steps)]


def _run(code: str, args: argparse.Namespace, steps: int) -> Dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=code)
    out = subprocess.run(_worker_cmd(args, steps), env=env, cwd=code, capture_output=True,
                         text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"worker at {code} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _instructions(code: str, args: argparse.Namespace, steps: int) -> int:
    with tempfile.NamedTemporaryFile(suffix=".out") as f:
        env = dict(os.environ, PYTHONPATH=code)
        out = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={f.name}"]
                             + _worker_cmd(args, steps), env=env, cwd=code,
                             capture_output=True, text=True, timeout=3600)
        m = re.search(r"Collected : (\d+)", out.stderr)
        if out.returncode != 0 or not m:
            raise SystemExit(f"callgrind at {code} failed:\n{out.stderr[-3000:]}")
        return int(m.group(1))


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode")
    w = sub.add_parser("worker")
    for p in (ap, w):
        p.add_argument("--size", type=int, default=4, help="ranks the data plane stands for")
        p.add_argument("--elements", type=int, default=1024, help="float32 elements (4 KiB)")
        p.add_argument("--warmup", type=int, default=500)
        p.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--before", default="", help="the other checkout (same native module)")
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--callgrind", action="store_true",
                    help="instructions per step (valgrind), --steps and --steps/5 subtracted")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if args.mode == "worker":
        worker(args)
        return 0
    codes = {"after": REPO}
    if args.before:
        codes = {"before": os.path.abspath(args.before), "after": REPO}
    runs: Dict[str, List[Dict[str, Any]]] = {k: [] for k in codes}
    loads = []
    for _ in range(args.repeat):
        for name, code in codes.items():   # alternated: each pair ran back to back
            loads.append(os.getloadavg()[0])
            if args.callgrind:
                few = max(1, args.steps // 5)
                many, some = _instructions(code, args, args.steps), _instructions(code, args, few)
                runs[name].append({"instructions": (many - some) / (args.steps - few)})
            else:
                runs[name].append(_run(code, args, args.steps))
    keys = ["instructions"] if args.callgrind else ["cpu_us", "wall_us"]
    summary: Dict[str, Any] = {}
    print(f"# steady {args.elements * 4 // 1024} KiB step, N={args.size} stand-in, "
          f"{args.steps} steps x {args.repeat} runs, load {min(loads):.1f}-{max(loads):.1f}")
    for key in keys:
        for name in codes:
            vals = [r[key] for r in runs[name]]
            summary[f"{name} {key}"] = {"median": statistics.median(vals), "min": min(vals),
                                        "max": max(vals)}
            print(f"{name:7s} {key:13s} median {statistics.median(vals):10.2f}  "
                  f"[{' '.join(f'{v:.2f}' for v in vals)}]")
        if "before" in codes:
            diff = [a[key] - b[key] for a, b in zip(runs["after"], runs["before"])]
            summary[f"after - before {key}"] = {"median": statistics.median(diff),
                                                "min": min(diff), "max": max(diff)}
            print(f"{'after - before':21s} median {statistics.median(diff):+10.2f}  "
                  f"[{' '.join(f'{v:+.2f}' for v in diff)}]")
    path = args.out or os.path.join(
        HERE, "results", "iface",
        f"steady_step{'_callgrind' if args.callgrind else ''}_"
        f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"command": " ".join(sys.argv), "commits": {k: _commit(v) for k, v in codes.items()},
                   "load": loads, "summary": summary, "runs": runs}, f, indent=1)
    print(f"record: {os.path.relpath(path, REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
