"""One job on the testbed in a given code tree, for the paired A/B benchmarks
(lossprobe_ab, two_level_loss_ab): its daemons started from that tree, ranks
collected as each prints its last JSON line, the daemons stopped whatever happened."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Sequence, Tuple

from netreduce.testbed import Testbed
from netreduce.testbed.plan import Node

PORT = 4791


def daemon(tb: Testbed, node: Node, args: Sequence[str], code: str) -> subprocess.Popen:
    """netreduce-switch at ``node`` from the tree ``code`` (its output dropped)."""
    return tb.popen(node, [sys.executable, "-m", "netreduce.switch", "--host", node.address,
                           "--port", str(PORT), "--allow-open-jobs", *args],
                    env=dict(os.environ, PYTHONPATH=code), cwd=code,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_listening(tb: Testbed, addrs: Sequence[str], code: str, within_s: float = 30) -> None:
    """Until every address accepts the control port (from host 0), or RuntimeError."""
    probe = ("import socket, sys\nfor a in sys.argv[1:]:\n"
             f"    socket.create_connection((a, {PORT}), 1).close()")
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if tb.run(0, [sys.executable, "-c", probe, *addrs], env=dict(os.environ, PYTHONPATH=code),
                  capture_output=True).returncode == 0:
            return
        time.sleep(0.3)
    raise RuntimeError(f"the daemons at {', '.join(addrs)} did not listen within {within_s:.0f} s")


def collect(procs: Sequence[subprocess.Popen], timeout_s: float,
            keep_err: int) -> Tuple[List[Dict], List[str]]:
    """Each rank's last JSON line (a rank still running after ``timeout_s`` is killed),
    and the last ``keep_err`` characters of each failed rank's stderr."""
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate())
    ranks, errors = [], []
    for p, (out, err) in zip(procs, outs):
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if p.returncode == 0 and lines:
            ranks.append(json.loads(lines[-1]))
        else:
            errors.append(err[-keep_err:])
    return ranks, errors
