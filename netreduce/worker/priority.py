"""netreduce's own threads ahead of the user's compute on a busy core (issue 33).

A training step hands each gradient group to three threads of netreduce that do little
work but sit on its critical path: the executor (a round's result to the next group's
submission, agreement.py), the landing thread (a message's result to its tensors'
completion, pipeline.py) and the engine (native/engine, "nr-engine": the packets).
Each of them sleeps until something arrives and must then get a core at once: the link
idles from a round's end until every rank's executor has queued the next group. When
the ranks' backward keeps every core busy (4 ranks on 2 cores on the testbed), a
waking thread of default priority waits for one: 0.77 ms at the 90th percentile and
4.4 ms at the 99th with 4 busy processes on 2 cores, against 0.07 and 0.8 ms at nice
-10 (BENCHMARKS.md, issue 33, "hvdgap").

So each of these threads lowers its own nice to NETREDUCE_THREAD_NICE and, on Linux
6.12 and later, asks for a short time slice (``sched_setattr``'s runtime for
SCHED_OTHER: EEVDF then lets it preempt the running task at wake-up, instead of
waiting for that task's slice to end). They use little CPU (a rank's whole process
is ~0.05 s per step against the step's ~0.5 s), so the compute loses nothing it
would have had. Lowering a nice needs CAP_SYS_NICE (or RLIMIT_NICE): without it the
threads stay at the process's priority, silently, as they were before.
"""
from __future__ import annotations

import ctypes
import os
import platform
import threading
from typing import Optional

SLICE_NS = 100_000          # the shortest slice EEVDF grants (0.1 ms)
ENGINE_THREAD = "nr-engine"  # native/engine/requests.cc names its thread so
_SYSCALL = {"x86_64": 314, "aarch64": 274}  # sched_setattr(2)


class _Attr(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("policy", ctypes.c_uint32),
                ("flags", ctypes.c_uint64), ("nice", ctypes.c_int32),
                ("priority", ctypes.c_uint32), ("runtime", ctypes.c_uint64),
                ("deadline", ctypes.c_uint64), ("period", ctypes.c_uint64),
                ("util_min", ctypes.c_uint32), ("util_max", ctypes.c_uint32)]


_libc: Optional[ctypes.CDLL] = None


def _sched_setattr(tid: int, nice: int) -> bool:
    """SCHED_OTHER at ``nice`` with the short slice; False where the call is not there
    or is refused (the caller falls back to setpriority)."""
    global _libc
    number = _SYSCALL.get(platform.machine())
    if number is None:
        return False
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        attr = _Attr(size=ctypes.sizeof(_Attr), policy=0, nice=nice, runtime=SLICE_NS)
        return _libc.syscall(number, tid, ctypes.byref(attr), 0) == 0
    except (OSError, AttributeError):
        return False


def boost(nice: int, tid: Optional[int] = None) -> bool:
    """Thread ``tid`` (default: the caller) at ``nice`` with a short slice; 0 leaves it
    as it is. True when the nice took."""
    if nice == 0 or not hasattr(os, "setpriority"):
        return False
    tid = threading.get_native_id() if tid is None else tid
    if _sched_setattr(tid, nice):
        return True
    try:
        os.setpriority(os.PRIO_PROCESS, tid, nice)  # on Linux PRIO_PROCESS takes a thread id
        return True
    except OSError:
        return False


def boost_named(nice: int, name: str = ENGINE_THREAD) -> int:
    """Every thread of this process called ``name`` (native threads name themselves)
    at ``nice`` (again, for those set before: a thread id may have been reused): how
    many took it."""
    if nice == 0:
        return 0
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return 0
    count = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != name:
                    continue
        except OSError:
            continue  # gone meanwhile
        count += boost(nice, tid)
    return count
