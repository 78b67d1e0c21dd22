"""Aggregator daemons a test left behind: a ``netreduce-switch`` whose parent died
without taking it along (its parent is now init), started during this session. The
conftest looks after every test module and names, at the end of the session, each such
daemon still running with the module after which it was first seen orphaned, then
kills it so that the next run (or CI's) does not inherit it. A daemon told to stop
drains for up to --stop-timeout (10 s) before it exits, so only those still alive at
the end are reported."""
from __future__ import annotations

import os
import signal
from typing import Dict, List, Tuple

from netreduce.testbed import proc_stat

_TICKS = os.sysconf("SC_CLK_TCK")


def _uptime_ticks() -> int:
    with open("/proc/uptime") as f:
        return int(float(f.read().split()[0]) * _TICKS)


def _orphans(since_ticks: int) -> Dict[int, str]:
    """pid -> command line of each orphaned daemon started after ``since_ticks``."""
    found: Dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            if "netreduce.switch" not in cmd and "netreduce-switch" not in cmd:
                continue
            stat = proc_stat.read(entry)
        except OSError:
            continue  # gone meanwhile
        if stat.ppid == 1 and stat.starttime >= since_ticks:
            found[int(entry)] = cmd
    return found


class Watch:
    def __init__(self) -> None:
        self.since = _uptime_ticks()
        self.seen: Dict[int, Tuple[str, str]] = {}  # pid -> (module, command)

    def after(self, module: str) -> None:
        for pid, cmd in _orphans(self.since).items():
            self.seen.setdefault(pid, (module, cmd))

    def left_running(self) -> List[str]:
        """Report and kill the orphans still running."""
        alive = _orphans(self.since)
        lines = []
        for pid, cmd in sorted(alive.items()):
            module = self.seen.get(pid, ("the last module", ""))[0]
            lines.append(f"pid {pid}, orphaned after {module}: {cmd}")
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return lines
