"""A process's or thread's /proc/PID/stat, parsed in this one place (proc(5)), and
beside it the two other per-task files the tests and benchmarks read: ``status``
(context switches, threads, resident memory) and ``schedstat`` (run and wait time).

The second field, the command name in parentheses, is whatever the process or thread
named itself (prctl(PR_SET_NAME), pthread_setname_np, up to 15 bytes): it may hold
spaces and ')' — "x) (Z 1 2" is a valid name. So the fields after it are read from
after the *last* ')', which the kernel writes right after the name; a split on
spaces, or at the first ')', reads another process's parent or state.

Times stay in clock ticks (``TICKS`` a second), as the kernel counts them; a caller
that wants seconds has ``cpu_seconds``."""
from __future__ import annotations

import dataclasses
import os
from typing import Dict, Iterator, List, Tuple, Union

TICKS = os.sysconf("SC_CLK_TCK")   # clock ticks a second, the unit of the times below


@dataclasses.dataclass(frozen=True)
class Stat:
    """The fields of /proc/PID/stat that netreduce's tests and benchmarks read (proc(5)
    numbers them from 1: pid 1, comm 2, state 3, ...)."""

    pid: int
    comm: str        # the command or thread name, without its parentheses
    state: str       # R, S, D, Z (zombie: ended, its parent has not waited), T, ...
    ppid: int
    pgrp: int
    session: int     # the session id: a session leader's own pid
    minflt: int      # minor page faults, all threads (a thread's own in task/TID/stat)
    utime: int       # user CPU, clock ticks
    stime: int       # system CPU, clock ticks
    cutime: int      # user CPU of its waited-for children, clock ticks
    cstime: int      # system CPU of its waited-for children, clock ticks
    nice: int        # -20..19
    starttime: int   # when it started, clock ticks after boot

    @property
    def cpu_seconds(self) -> float:
        """utime + stime in seconds: every thread's, for a process's stat."""
        return (self.utime + self.stime) / TICKS


def parse(text: str) -> Stat:
    """The record of one /proc/PID/stat (or /proc/PID/task/TID/stat) text."""
    head, _, tail = text.rpartition(")")
    pid, _, comm = head.partition(" (")
    f = tail.split()  # f[0] is field 3 (state): field n is f[n - 3]
    return Stat(pid=int(pid), comm=comm, state=f[0], ppid=int(f[1]), pgrp=int(f[2]),
                session=int(f[3]), minflt=int(f[7]), utime=int(f[11]), stime=int(f[12]),
                cutime=int(f[13]), cstime=int(f[14]), nice=int(f[16]), starttime=int(f[19]))


def _task(pid: Union[int, str], tid: Union[int, str, None], name: str) -> str:
    return f"/proc/{pid}/{name}" if tid is None else f"/proc/{pid}/task/{tid}/{name}"


def read(pid: Union[int, str] = "self", tid: Union[int, str, None] = None) -> Stat:
    """Process ``pid``'s record, or its thread ``tid``'s; OSError when it is gone."""
    with open(_task(pid, tid, "stat")) as f:
        return parse(f.read())


def status(pid: Union[int, str] = "self", tid: Union[int, str, None] = None) -> Dict[str, str]:
    """Process ``pid``'s /proc/PID/status (or its thread ``tid``'s): {field: its text}
    ("Threads": "5", "VmRSS": "1234 kB"); OSError when it is gone."""
    with open(_task(pid, tid, "status")) as f:
        return {k: v.strip() for k, _, v in (line.partition(":") for line in f)}


def status_int(pid: Union[int, str], field: str, tid: Union[int, str, None] = None) -> int:
    """The number a status field starts with: "Threads" its threads, "VmRSS" its
    resident KiB; KeyError when the field is absent (VmRSS of a zombie)."""
    return int(status(pid, tid)[field].split()[0])


def ctx_switches(pid: Union[int, str] = "self", tid: Union[int, str, None] = None) -> Tuple[int, int]:
    """(voluntary, nonvoluntary) context switches so far of process ``pid`` (all its
    threads) or of its thread ``tid``: a voluntary one is a sleep (a wait, a blocking
    call), a nonvoluntary one a preemption. OSError when it is gone."""
    st = status(pid, tid)
    return int(st["voluntary_ctxt_switches"]), int(st["nonvoluntary_ctxt_switches"])


def schedstat(pid: Union[int, str] = "self", tid: Union[int, str, None] = None) -> Tuple[int, int, int]:
    """(on-CPU ns, ns waiting to run, timeslices) of process ``pid`` or its thread
    ``tid`` (/proc/PID/schedstat); OSError when it is gone."""
    with open(_task(pid, tid, "schedstat")) as f:
        cpu, wait, slices = map(int, f.read().split())
    return cpu, wait, slices


def cpu_seconds(pid: Union[int, str]) -> float:
    """user+system CPU seconds of a process (all its threads)."""
    return read(pid).cpu_seconds


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a zombie has ended; only its
    parent's wait() is missing)."""
    try:
        return read(pid).state != "Z"
    except (OSError, ValueError, IndexError):
        return False


def processes() -> Iterator[Stat]:
    """Every process's record that /proc shows now; one that ends meanwhile is left out."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                yield read(entry)
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile


def threads(pid: Union[int, str] = "self") -> Iterator[Stat]:
    """The record of each thread of process ``pid`` (``pid`` is the thread's id);
    one that ends meanwhile is left out. OSError when the process is gone."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            yield read(pid, tid)
        except (OSError, ValueError, IndexError):
            continue


def children(pid: int) -> List[int]:
    """The pids whose parent is ``pid`` now."""
    return [p.pid for p in processes() if p.ppid == pid]
