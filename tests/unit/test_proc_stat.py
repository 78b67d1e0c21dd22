"""/proc/PID/stat (and status, schedstat), parsed in one place (netreduce/testbed/proc_stat.py): a command name
may hold spaces and ')', and the fields after it still read right."""
import ctypes
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import pytest

from netreduce.testbed import proc_stat

ROOT = pathlib.Path(__file__).resolve().parents[2]
# 15 bytes at most (TASK_COMM_LEN); a split on spaces reads "(Z" as the state and 7 as
# the parent, a split at the first ')' the same.
NAME = "x) (Z 7 7 ) S"
PR_SET_NAME = 15

# The child names its own thread, says so, and waits for its stdin to close.
CHILD = f"""
import ctypes, sys
assert ctypes.CDLL(None).prctl({PR_SET_NAME}, {NAME.encode()!r}, 0, 0, 0) == 0
print("named", flush=True)
sys.stdin.read()
"""


def test_parse_reads_the_fields_after_the_last_parenthesis():
    text = (f"4242 ({NAME}) S 1 4240 4239 0 -1 4194560 321 0 0 0 17 5 2 1 20 -3 1 0 "
            "987654 12345678 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n")
    s = proc_stat.parse(text)
    assert (s.pid, s.comm, s.state, s.ppid, s.pgrp, s.session) == (4242, NAME, "S", 1, 4240, 4239)
    assert (s.minflt, s.utime, s.stime, s.cutime, s.cstime) == (321, 17, 5, 2, 1)
    assert (s.nice, s.starttime) == (-3, 987654)
    assert s.cpu_seconds == pytest.approx(22 / proc_stat.TICKS)


def test_a_real_process_named_with_a_parenthesis():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert child.stdout.readline() == "named\n"
        s = proc_stat.read(child.pid)
        assert (s.pid, s.comm, s.ppid) == (child.pid, NAME, os.getpid())
        assert s.state in "RS" and s.session == s.pgrp == child.pid  # its own session
        assert s.nice == os.getpriority(os.PRIO_PROCESS, child.pid)
        assert child.pid in proc_stat.children(os.getpid())
        assert proc_stat.alive(child.pid)
        child.stdin.close()
        # Ended, not yet waited for: a zombie, still in /proc, not alive.
        deadline = time.monotonic() + 30
        while proc_stat.read(child.pid).state != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not proc_stat.alive(child.pid)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        child.stdout.close()
    assert not proc_stat.alive(child.pid)


def test_a_thread_named_with_a_parenthesis():
    named, done = threading.Event(), threading.Event()

    def run():
        ctypes.CDLL(None).prctl(PR_SET_NAME, NAME.encode(), 0, 0, 0)  # this thread's name
        named.set()
        done.wait(30)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        assert named.wait(30)
        mine = [s for s in proc_stat.threads() if s.comm == NAME]
        assert [s.pid for s in mine] == [t.native_id]
        assert mine[0].ppid == os.getppid()  # a thread's parent is its process's parent
    finally:
        done.set()
        t.join()


def _readers_besides_proc_stat(pattern: "re.Pattern[str]") -> list:
    """The project's Python files, proc_stat.py and this test aside, that match ``pattern``."""
    places = [ROOT / "netreduce", ROOT / "frameworks", ROOT / "tests", ROOT / "scripts"]
    files = [p for top in places for p in top.rglob("*.py")]
    files += [p for p in (ROOT / "benchmarks").rglob("*.py")  # not its results' one-off probes
              if "results" not in p.relative_to(ROOT / "benchmarks").parts]
    home = ROOT / "netreduce" / "testbed" / "proc_stat.py"
    return [str(p.relative_to(ROOT)) for p in files
            if p != home and p != pathlib.Path(__file__).resolve()
            and pattern.search(p.read_text(errors="replace"))]


def test_nothing_else_parses_proc_pid_stat():
    """One concept, one place (docs/design.md, "Where each concept lives")."""
    assert _readers_besides_proc_stat(re.compile(r"/proc/(\{[^}]*\}|self)(/task/\{[^}]*\})?/stat\b")) == []


def test_status_and_schedstat_of_a_thread():
    """A thread's status and schedstat, read by the one reader: a sleep is a voluntary
    context switch of the sleeping thread, counted in its own status."""
    tid = threading.get_native_id()
    before = proc_stat.ctx_switches("self", tid)
    time.sleep(0.01)
    after = proc_stat.ctx_switches("self", tid)
    assert after[0] > before[0] and after[1] >= before[1]
    assert proc_stat.status_int("self", "Threads") >= 1
    assert proc_stat.status_int(os.getpid(), "VmRSS") > 0  # KiB
    assert proc_stat.status("self", tid)["Pid"] == str(tid)
    cpu_ns, wait_ns, slices = proc_stat.schedstat("self", tid)
    assert cpu_ns > 0 and wait_ns >= 0 and slices > 0


def test_nothing_else_reads_proc_pid_status():
    """Context switches, threads and RSS (/proc/PID/status, schedstat) have one reader too."""
    pattern = re.compile(r"/proc/(\{[^}]*\}|self|%s)(/task/(\{[^}]*\}|%s))?/(status|schedstat)\b"
                         r"|ctxt_switches")
    assert _readers_besides_proc_stat(pattern) == []
