"""A rank naps when the link binds (engine/nap.h): across the emulated testbed at
1 Gbit/s a large all-reduce's engine sleeps between batches of results instead of
waking per arriving super-packet, results stay exact, and a 4 KiB all-reduce never
naps. Needs root and the built native module; skipped with the reason otherwise."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from netreduce.testbed import Testbed, why_unusable
from tests.procs import collect_ok
from tests.root import scratch_subnet, scratch_testbed_name

REASON = why_unusable()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


# 1432: MTU 1500's payload (~1,460 chunks in the window); None: the testbed's 9000-byte one.
@pytest.mark.parametrize("payload", [1432, None])
def test_link_bound_allreduce_naps_and_stays_exact(native, payload):
    hosts = 2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    with Testbed(hosts=hosts, rate="1gbit", name=scratch_testbed_name("z"), subnet=scratch_subnet(),
                 mtu=1500 if payload else 9000, replace=True) as tb:
        switch = tb.spawn_switch(env=env, args=["--payload-bytes", str(payload)] if payload else [])
        try:
            job = f"nap-{uuid.uuid4().hex[:6]}"
            host, port = switch.address
            procs = [tb.popen(r, [sys.executable, os.path.join(HERE, "nap_worker.py"), host, str(port),
                                  job, str(r), str(hosts)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                     for r in range(hosts)]
            results = collect_ok(procs, timeout=240)  # up to 5 rounds on a loaded host
        finally:
            switch.stop()
    for r in results:
        assert r["failures"] == [], r
        assert r["small_naps"] == 0, r  # small messages: the latency path never naps
        # the link binds: the engine napped (in one of the worker's rounds of large
        # all-reduces; a round the loaded host's CPU bound instead has none)
        assert r["naps"] > 0, r
