"""netreduce's data plane across the emulated testbed: three hosts and an aggregator in
their own namespaces, shaped links, and 1 % of the packets every namespace receives
dropped by nftables. Every result must still be exact. Needs root and the built
native module; skipped with the reason otherwise."""
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


# 4096: RoCE-sized payloads (one standard RoCE MTU); None: the largest payload one
# 9000-byte frame holds (what the testbed picks by default).
# fanout segment (auto for a job whose hosts all sit on the aggregator's bridge, as
# here): results by multicast, and by unicast to a rank whose group packets the loss
# took often enough that its contributions stopped saying the group reaches it.
@pytest.mark.parametrize("hosts, loss, payload, fanout",
                         [(3, 0.01, 4096, "unicast"), (3, 0.01, None, "unicast"),
                          (3, 0.01, 4096, "segment")])
def test_allreduce_exact_across_testbed_with_loss(native, hosts, loss, payload, fanout):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    with Testbed(hosts=hosts, rate="1gbit", loss=loss, name=scratch_testbed_name("p"), subnet=scratch_subnet(),
                 replace=True) as tb:
        args = (["--payload-bytes", str(payload)] if payload else []) + ["--fanout", fanout]
        switch = tb.spawn_switch(env=env, args=args)
        try:
            job = f"tb-{uuid.uuid4().hex[:6]}"
            host, port = switch.address
            procs = [tb.popen(r, [sys.executable, os.path.join(HERE, "dataplane_worker.py"), host,
                                  str(port), job, str(r), str(hosts)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                     for r in range(hosts)]
            results = collect_ok(procs, timeout=150)
            drops = tb.loss_drops()
        finally:
            switch.stop()
    for r in results:
        assert r["failures"] == [], r
        assert r["checked"] == 18
        if fanout == "segment":  # the group carried results to every host
            assert r["stats"]["group_datagrams"] > 0, r
    # The loss was real: the aggregator and the hosts each dropped some packets.
    assert drops["agg"] > 0 and sum(drops[h.name] for h in tb.hosts) > 0, drops
