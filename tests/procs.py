"""Collecting worker processes' reports: each worker prints its report last, as one
JSON line (an object: the line starts with "{")."""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

# netreduce-run prefixes each rank's lines as horovodrun does: "[2]<stdout>:..."
_RANK_PREFIX = re.compile(r"^\[\d+\]<std(?:out|err)>:")
TAIL = 3000  # characters of a rank's stderr that a report or a failure shows
STACKS_TAIL = 12000  # ... where it holds every thread's stack (collect(stacks=True))


def unprefixed(line: str) -> str:
    """A line netreduce-run printed, without its rank prefix."""
    return _RANK_PREFIX.sub("", line)


def last_json(out: str) -> Optional[dict]:
    """A worker's report: the last line of ``out`` that starts with "{", as JSON (None
    where there is none); a framework's chatter before it and a warning at exit after
    it do not count."""
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else None


Outputs = Dict[int, Tuple[str, str]]  # rank -> (stdout, stderr)


def _wait_all(procs: List[subprocess.Popen], timeout: float,
              failed: Optional[Callable[[int, str, str], bool]] = None,
              stacks: bool = False) -> Tuple[Outputs, List[int]]:
    """Every process's output, read together (a rank that waits on a later one cannot
    block on a pipe nobody reads). Ends once every process has, ``timeout`` seconds
    after the call, or at the first rank that ``failed(rank, stdout, stderr)`` calls a
    failure; then kills the ones still running (their output is in the answer too)
    and answers (the outputs, the ranks it killed). With ``stacks``, SIGABRT first
    and up to 30 s for them to end: under PYTHONFAULTHANDLER=1 a rank prints every
    thread's stack."""
    ended: "queue.Queue[Tuple[int, str, str]]" = queue.Queue()

    def drain(rank: int, p: subprocess.Popen) -> None:
        out, err = p.communicate()
        ended.put((rank, out or "", err or ""))

    readers = [threading.Thread(target=drain, args=(r, p), daemon=True)
               for r, p in enumerate(procs)]
    for t in readers:
        t.start()
    got: Outputs = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < len(procs):
            try:
                rank, out, err = ended.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            got[rank] = (out, err)
            if failed is not None and failed(rank, out, err):
                break
    finally:
        killed = [r for r in range(len(procs)) if r not in got]
        if stacks:
            for r in killed:
                procs[r].send_signal(signal.SIGABRT)
            for r in killed:
                readers[r].join(30)
        for r in killed:
            procs[r].kill()
        for t in readers:  # a killed rank's pipes close: its reader ends
            t.join(30)
    while not ended.empty():
        rank, out, err = ended.get()
        got[rank] = (out, err)
    return got, killed


def _killed(got: Outputs, killed: List[int], timeout: float, tail: int = TAIL) -> str:
    return (f"rank(s) {', '.join(map(str, killed))} still running after {timeout} s, killed:\n"
            + "\n---\n".join(f"rank {r}: {got.get(r, ('', ''))[1][-tail:]}" for r in killed))


def collect(procs: List[subprocess.Popen], timeout: float, stacks: bool = False) -> List[dict]:
    """Each process's report (last_json) with its return code and the tail of its
    stderr (or just those two where it printed none), in rank order. Ranks still
    running ``timeout`` seconds after the call are killed and fail the test, named
    with their stderr; with ``stacks`` after a SIGABRT, which under
    PYTHONFAULTHANDLER=1 prints where each of their threads was."""
    got, killed = _wait_all(procs, timeout, stacks=stacks)
    if killed:
        raise AssertionError(_killed(got, killed, timeout, STACKS_TAIL if stacks else TAIL))
    return [report(p, *got[r]) for r, p in enumerate(procs)]


def report(p: subprocess.Popen, out: str, err: str) -> dict:
    base = {"returncode": p.returncode, "stderr": (err or "")[-TAIL:]}
    found = last_json(out or "")
    return dict(found, **base) if found is not None else base


def finish(out: dict) -> None:
    """A worker's last act: print its report as the one JSON line, then shut netreduce
    down (an error there is not the report's: the report is already out)."""
    import netreduce as nr
    from netreduce.errors import NetReduceError
    print(json.dumps(out), flush=True)
    try:
        nr.shutdown()
    except NetReduceError:
        pass


def collect_ok(procs: List[subprocess.Popen], timeout: float, any_exit: bool = False
               ) -> List[dict]:
    """Each process's report (last_json), in rank order. The first rank to exit
    non-zero (with ``any_exit``, whatever its exit) or without a report fails the
    test, named with its stderr's tail (stdout's where it wrote no stderr), once the
    ranks still running are killed: they would only wait for it until they time out.
    So do ranks still running ``timeout`` seconds after the call."""
    problem: Dict[int, str] = {}

    def failed(rank: int, out: str, err: str) -> bool:
        rc = procs[rank].returncode
        if rc != 0 and not any_exit:
            problem[rank] = f"rank {rank} exited {rc}"
        elif last_json(out) is None:
            problem[rank] = f"rank {rank} printed no JSON report (exit {rc})"
        return rank in problem

    got, killed = _wait_all(procs, timeout, failed)
    for rank, what in problem.items():
        out, err = got[rank]
        also = f" (rank(s) {', '.join(map(str, killed))} still running: killed)" if killed else ""
        raise AssertionError(f"{what}{also}: {(err or out)[-TAIL:]}")
    if killed:
        raise AssertionError(_killed(got, killed, timeout))
    return [last_json(got[r][0]) for r in range(len(procs))]


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch_script(script: str, np_: int, timeout: float = 120, **env: str
                  ) -> subprocess.CompletedProcess:
    """``netreduce-run -np np_ -- python -c script`` from the checkout, with this
    checkout first on PYTHONPATH and ``env`` added; stdout and stderr together."""
    full = dict(os.environ, **env)
    full["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "netreduce.launcher", "-np", str(np_), "--",
                           sys.executable, "-c", script], cwd=ROOT, env=full,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
