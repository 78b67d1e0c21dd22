"""pytest plugin (citime, not part of the repo): per test, wall seconds, this process's
and its reaped children's CPU seconds, and the machine's busy CPU seconds (/proc/stat)."""
import json
import os
import resource
import time

import pytest

_OUT = os.environ.get("CITIME_TIMING", "/tmp/citime/timing.jsonl")


def _stat():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = v[3] + v[4]
    return (sum(v) - idle) / hz, sum(v) / hz


def _cpu():
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    t0 = time.time()
    m0 = time.monotonic()
    b0, a0 = _stat()
    s0, c0 = _cpu()
    yield
    m1 = time.monotonic()
    b1, a1 = _stat()
    s1, c1 = _cpu()
    with open(_OUT, "a") as f:
        f.write(json.dumps({"id": item.nodeid, "t0": round(t0, 3), "wall": round(m1 - m0, 3),
                            "self": round(s1 - s0, 3), "children": round(c1 - c0, 3),
                            "busy": round(b1 - b0, 3), "total": round(a1 - a0, 3),
                            "load": os.getloadavg()[0]}) + "\n")
