"""Collecting worker processes' reports: each worker prints one JSON line last."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import List

# netreduce-run prefixes each rank's lines as horovodrun does: "[2]<stdout>:..."
_RANK_PREFIX = re.compile(r"^\[\d+\]<std(?:out|err)>:")


def unprefixed(line: str) -> str:
    """A line netreduce-run printed, without its rank prefix."""
    return _RANK_PREFIX.sub("", line)


def collect(procs: List[subprocess.Popen], timeout: float) -> List[dict]:
    """Each process's last JSON line, with its return code and the tail of its
    stderr (or just those two when it printed none); kills whatever is left."""
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append(report(p, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def report(p: subprocess.Popen, out: str, err: str) -> dict:
    lines = [ln for ln in out.strip().splitlines() if ln.startswith("{")]
    base = {"returncode": p.returncode, "stderr": err[-3000:]}
    return dict(json.loads(lines[-1]), **base) if lines else base


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


def collect_ok(procs: List[subprocess.Popen], timeout: float) -> List[dict]:
    """Each process's last output line as JSON; fails the test naming the rank whose
    process exited non-zero, with its stderr's tail."""
    results = []
    for rank, p in enumerate(procs):
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}: {err[-2000:]}"
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


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
