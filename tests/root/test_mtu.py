"""The payload follows the path (docs/protocol.md, "Payload size"): netreduce-switch
started with no --payload-bytes, as the README shows, gives each job the largest
payload whose RoCEv2 packet fits the smallest MTU its ranks see, on the testbed at
MTU 1500 and 9000 and with one host at a smaller MTU than the rest; the all-reduce
is exact and the chosen payload and its reason are reported. The same over IPv6
(every namespace has an IPv6 address on its veth; the daemon listens on the
aggregator's): IPv6's 40-byte header counted, MTU - 84 (1416 and 8912 B, not IPv4's
1432 and 8936), the reason naming ranks by their IPv6 addresses. A path that shrinks
after admission still fails with an error that names the fix. Needs root."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

import pytest

from netreduce.testbed import Testbed, why_unusable
from tests.conftest import require_root
from tests.procs import collect_ok
from tests.root import scratch_subnet, scratch_testbed_name

REASON = why_unusable()
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))

# One rank: rank r contributes r + 1 times seeded data; every rank can compute the
# exact reference. Prints the payload it was given, why, and what the aggregator
# says about the job.
WORKER = r"""
import json, sys
import numpy as np
from netreduce.worker import dataplane
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
                  "agg_reason": job_counters["payload_reason"],
                  "address": list(conn.address)}), flush=True)
conn.close()
"""


def _start_switch(tb: Testbed, host: str) -> subprocess.Popen:
    """netreduce-switch in the aggregator's namespace with no payload flag at all."""
    switch = tb.spawn_switch(env=ENV, host=host)
    line = switch.log[-1]
    shown = f"[{host}]:4791" if ":" in host else f"{host}:4791"
    assert shown in line and "path-MTU payload" in line, line
    return switch.proc


def _run_job(tb: Testbed, size: int, host: str) -> list:
    switch = _start_switch(tb, host)
    try:
        job = f"mtu-{uuid.uuid4().hex[:6]}"
        procs = [tb.popen(r, [sys.executable, "-c", WORKER, host, "4791", job, str(r), str(size)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
                 for r in range(size)]
        results = collect_ok(procs, timeout=120)
        return results
    finally:
        switch.terminate()
        switch.wait(20)


@pytest.mark.root
@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.parametrize("mtu, lowered, payload, reason", [
    (1500, None, 1432, r"payload 1432 B: path MTU 1500 (reported by|of the aggregator's route toward) rank"),
    (9000, None, 8936, r"payload 8936 B: path MTU 9000 (reported by|of the aggregator's route toward) rank"),
    # h1's own interface is at 1500 while the rest of the network is at 9000: only h1
    # knows, and the whole job must use what h1's path carries.
    (9000, 1500, 1432, r"payload 1432 B: path MTU 1500 reported by rank 1 \(host .*, 10\.78\.\d+\.\d+\)"),
])
def test_payload_follows_the_path_mtu_without_flags(mtu, lowered, payload, reason):
    tag = {1500: "u", 9000: "v"}[mtu] if lowered is None else "w"
    with Testbed(hosts=2, rate="1gbit", mtu=mtu, name=scratch_testbed_name(tag), subnet=scratch_subnet(),
                 replace=True) as tb:
        if lowered is not None:
            subprocess.run(["ip", "-n", tb.node(1).netns, "link", "set", "eth0", "mtu",
                            str(lowered)], check=True)
        results = _run_job(tb, 2, tb.aggregator.address)
    for r in results:
        assert r["failures"] == [], r
        assert r["payload"] == payload and r["agg_payload"] == payload, r
        assert re.match(reason, r["reason"]), r
        assert r["agg_reason"] == r["reason"], r
    assert [r["mtu"] for r in results] == [mtu, lowered or mtu]


@pytest.mark.root
@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.parametrize("mtu, payload", [(1500, 1416), (9000, 8912)])
def test_ipv6_testbed_payload_follows_the_path_without_flags(mtu, payload):
    tag = {1500: "x", 9000: "y"}[mtu]
    with Testbed(hosts=2, rate="1gbit", mtu=mtu, name=scratch_testbed_name(tag), subnet=scratch_subnet(),
                 replace=True, ipv6=True) as tb:
        agg6 = tb.aggregator.address6
        assert agg6.startswith("fd00:a:4e:") and all(h.address6 for h in tb.hosts)
        results = _run_job(tb, 2, agg6)
        hosts6 = [h.address6 for h in tb.hosts]
    for r in results:
        assert r["failures"] == [], r
        assert r["address"] == [agg6, 4791], r
        assert r["mtu"] == mtu and r["payload"] == payload == r["agg_payload"], r
        # "payload 1416 B: path MTU 1500 reported by rank 0 (host ..., fd00:a:4e:fd::1)"
        m = re.match(rf"payload {payload} B: path MTU {mtu} .*rank \d \(.*?([0-9a-f:]+)\)",
                     r["reason"])
        assert m and m.group(1) in hosts6, r


SHRINK = r"""
import subprocess
import numpy as np
from netreduce.worker import dataplane
from netreduce.errors import DataPlaneError
from netreduce.switch import spawn
with spawn() as sw:  # no payload flag: the job gets what MTU 9000 carries
    with dataplane.connect(sw.address, "mtu", 0, 1, timeout=5.0) as conn:
        print("PAYLOAD", conn.payload_bytes)
        subprocess.run(["ip", "link", "set", "lo", "mtu", "1500"], check=True)
        try:
            conn.allreduce(np.ones(10**5, np.float32))
            print("NO ERROR")
        except DataPlaneError as exc:
            print("ERROR", exc)
"""


def test_path_shrunk_after_admission_is_reported():
    require_root("ip")
    ns = "nrmtu-" + uuid.uuid4().hex[:6]
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "mtu", "9000", "up"], check=True)
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", SHRINK],
                             capture_output=True, text=True, timeout=60, env=ENV).stdout
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    assert "PAYLOAD 8936" in out, out
    assert "ERROR" in out and "exceeds the path MTU" in out and "--payload-bytes" in out, out
