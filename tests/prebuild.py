"""Slow builds a test needs, started in the background when the session starts.

The suite runs one test at a time, and most of its time one of the two cores waits: on
a timeout a test is meant to hit, a daemon's start, a framework's import (the
rehearsals' CPU was ~1.15 of 2 cores). On a fresh machine (CI's) the sanitizer build of
tests/parallel/test_fuzz_smoke.py compiles the native data plane three ways with
clang (~60 CPU-s; fuzz/build.sh keeps the objects under ~/.cache/netreduce/fuzz, so a
warm machine compiles nothing) inside that one test, while nothing else runs. Started
at the session's start under ``nice -n 19``, it takes the cores' idle time instead (a
niced process yields to every test's own processes), and the test, when it comes,
waits for it and then runs scripts/sanitizers.sh as before: its own fuzz/build.sh finds
the objects and programs built, or builds what is missing and shows any compiler error.
A failed or unfinished background build changes nothing but the time."""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Dict, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the test's node id -> the command its slow build runs (from the checkout's root)
BUILDS = {
    "tests/parallel/test_fuzz_smoke.py::test_sanitizer_build_and_fuzz_smoke":
        ("clang++", ["bash", "fuzz/build.sh"]),
}

_running: Dict[str, subprocess.Popen] = {}


def start(selected_ids) -> None:
    """Starts, niced, the build of each selected test in BUILDS whose compiler is here."""
    if os.environ.get("NETREDUCE_TEST_PREBUILD", "1") == "0":
        return
    for nodeid, (compiler, cmd) in BUILDS.items():
        if nodeid in selected_ids and nodeid not in _running and shutil.which(compiler):
            _running[nodeid] = subprocess.Popen(
                ["nice", "-n", "19"] + cmd, cwd=ROOT, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def wait(nodeid: str, timeout: float = 600) -> Optional[int]:
    """Waits for the background build of ``nodeid``, if one was started; its exit status
    (None: none started). The caller's own build shows what went wrong, if anything."""
    proc = _running.pop(nodeid, None)
    if proc is None:
        return None
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return None


def stop_all() -> None:
    """At the session's end: a build no test waited for (deselected, interrupted) goes."""
    for nodeid in list(_running):
        _kill(_running.pop(nodeid))


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
    proc.wait()
