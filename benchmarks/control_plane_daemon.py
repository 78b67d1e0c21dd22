"""The netreduce-switch that benchmarks/control_plane.py's modes run, from a checkout
(this one, or ``--before``/``--code``'s), and how many threads it runs."""
from __future__ import annotations

import os
import subprocess
import sys


def spawn_switch(pythonpath: str, *extra: str):
    env = dict(os.environ, PYTHONPATH=pythonpath)
    proc = subprocess.Popen([sys.executable, "-m", "netreduce.switch", "--host", "127.0.0.1",
                             "--port", "0", "--max-jobs", "64", *extra], stdout=subprocess.PIPE,
                            text=True, env=env, cwd=pythonpath)
    line = proc.stdout.readline()
    addr = line.split("listening on ")[1].split()[0]
    return proc, addr


def threads_of(pid: int) -> int:
    from common import proc_stat  # this checkout's (benchmarks/ is sys.path[0])
    try:
        return proc_stat.status_int(pid, "Threads")
    except KeyError:
        return -1
