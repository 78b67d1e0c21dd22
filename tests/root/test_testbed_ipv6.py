"""IPv6 on the testbed: every namespace has an IPv6 address on its veth, and
netreduce-switch listens on the aggregator's IPv6 address with no payload flag, as
a user would start it. At MTU 1500 and 9000 the job's payload follows the path with
IPv6's 40-byte header counted (MTU - 84, a multiple of 8: 1416 and 8912 B, not
IPv4's 1432 and 8936), every all-reduce is exact, and the reason names the ranks
by their IPv6 addresses. Needs root."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid

import pytest

from netreduce.testbed import Testbed, why_unusable
from tests.root import scratch_testbed_name

REASON = why_unusable()
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))

# One rank over IPv6: seeded integer-valued float32 data (exact sums), sizes that
# are 1, not a multiple of the packet, and many packets; prints what it was given.
WORKER = r"""
import json, sys
import numpy as np
from netreduce import dataplane
host, port, job, rank, size = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
conn = dataplane.connect((host, port), job, rank, size, timeout=60.0)
failures = []
for count in (1, 4093, 300_001):
    parts = [np.random.default_rng(count + r).integers(-1000, 1000, count).astype(np.float32)
             for r in range(size)]
    out = conn.allreduce(parts[rank].copy(), np.empty(count, np.float32))
    if not np.array_equal(out, np.sum(parts, axis=0, dtype=np.float32)):
        failures.append(count)
job_counters = conn.counters()["jobs"][job]
print(json.dumps({"failures": failures, "payload": conn.stats()["payload_bytes"],
                  "reason": conn.payload_reason, "mtu": conn.path_mtu,
                  "agg_payload": job_counters["payload_bytes"],
                  "address": list(conn.address)}), flush=True)
conn.close()
"""


def _start_switch(tb: Testbed) -> subprocess.Popen:
    agg = tb.aggregator
    proc = tb.popen(agg, [sys.executable, "-m", "netreduce.switch", "--host", agg.address6,
                          "--port", "4791"],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    deadline = time.monotonic() + 30
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen.append(line)
        if "listening on" in line:
            assert f"[{agg.address6}]:4791" in line and "path-MTU payload" in line, line
            return proc
        if not line:
            break
    proc.kill()
    raise AssertionError(f"netreduce-switch did not start: {''.join(seen)}")


@pytest.mark.root
@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.parametrize("mtu, payload", [(1500, 1416), (9000, 8912)])
def test_ipv6_testbed_payload_follows_the_path_without_flags(mtu, payload):
    tag = {1500: "x", 9000: "y"}[mtu]
    subnet = {"x": "10.78.253.0/24", "y": "10.78.254.0/24"}[tag]
    with Testbed(hosts=2, rate="1gbit", mtu=mtu, name=scratch_testbed_name(tag), subnet=subnet,
                 replace=True, ipv6=True) as tb:
        agg6 = tb.aggregator.address6
        assert agg6.startswith("fd00:a:4e:") and all(h.address6 for h in tb.hosts)
        switch = _start_switch(tb)
        try:
            job = f"v6-{uuid.uuid4().hex[:6]}"
            procs = [tb.popen(r, [sys.executable, "-c", WORKER, agg6, "4791", job, str(r), "2"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
                     for r in range(2)]
            results = []
            for p in procs:
                out, err = p.communicate(timeout=120)
                assert p.returncode == 0, f"rank exited {p.returncode}: {err[-2000:]}"
                results.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            switch.terminate()
            switch.wait(20)
        hosts6 = [h.address6 for h in tb.hosts]
    for r in results:
        assert r["failures"] == [], r
        assert r["address"] == [agg6, 4791], r
        assert r["mtu"] == mtu and r["payload"] == payload == r["agg_payload"], r
        # "payload 1416 B: path MTU 1500 reported by rank 0 (host ..., fd00:a:4e:fd::1)"
        m = re.match(rf"payload {payload} B: path MTU {mtu} .*rank \d \(.*?([0-9a-f:]+)\)",
                     r["reason"])
        assert m and m.group(1) in hosts6, r
