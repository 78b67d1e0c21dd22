"""--fanout auto across the emulated testbed: three hosts receive their job's results
through the multicast group until nftables starts dropping multicast into one of
them mid-job. That host's results must keep coming, exactly, from the aggregator's
unicast copies -- repaired once for the window that was in flight, not chunk by
chunk by its timeouts. Needs root and the built native module; skipped with the
reason otherwise."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from netreduce.protocol.client import ControlClient
from netreduce.testbed import Testbed, sh, why_unusable
from tests.procs import collect_ok
from tests.root import scratch_subnet, scratch_testbed_name

REASON = why_unusable()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BLOCK = ("table inet nrmcblock {\n  chain input {\n"
         "    type filter hook input priority 0; policy accept;\n"
         "    ip daddr 224.0.0.0/4 counter drop\n  }\n}\n")


def test_auto_fanout_keeps_a_host_whose_multicast_stops_mid_job():
    try:
        from netreduce import _native  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"netreduce._native is not built ({exc})")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    hosts, count, rounds1, rounds2 = 3, 1_000_003, 4, 12
    with Testbed(hosts=hosts, rate="1gbit", name=scratch_testbed_name("m"),
                 subnet=scratch_subnet(), replace=True) as tb:
        switch = tb.spawn_switch(env=env, args=["--fanout", "auto"])
        try:
            job = f"mc-{uuid.uuid4().hex[:6]}"
            host, port = switch.address
            procs = [tb.popen(r, [sys.executable, os.path.join(HERE, "fanout_worker.py"), host,
                                  str(port), job, str(r), str(hosts), str(count), str(rounds1),
                                  str(rounds2)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
                     for r in range(hosts)]
            for r, p in enumerate(procs):
                line = p.stdout.readline()
                assert line.startswith("PHASE1 "), (r, line, p.stderr.read()[-2000:] if not line else "")
            with ControlClient(switch.address) as c:
                before = c.call("counters")["global"]
            sh.nft(BLOCK, netns=tb.hosts[1].netns)  # multicast into host 1 stops
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            results = collect_ok(procs, timeout=120)
            with ControlClient(switch.address) as c:
                after = c.call("counters")["global"]
            dropped = tb.run(tb.hosts[1], ["nft", "list", "table", "inet", "nrmcblock"],
                             capture_output=True, text=True).stdout
        finally:
            switch.stop()
    for r in results:
        assert r["failures"] == [], r
        assert r["group_note"] == "", r
        # phase 1: every host got its results through the group
        assert r["phase1"]["group_datagrams"] > 0, r
    assert "packets" in dropped and " 0 bytes" not in dropped, dropped  # the rule dropped some
    p1 = results[1]
    completed = after["slots_completed"] - before["slots_completed"]
    copies = after["group_unicast_copies"] - before["group_unicast_copies"]
    # From the window in flight at the block on, host 1 got a unicast copy of every
    # result: most of phase 2's; the others none once their contributions said so.
    assert completed // 2 < copies <= completed + completed // 4, (completed, copies)
    # Repaired once for that window: host 1 resent a fraction of phase 2's chunks (with
    # the group alone, it would resend every one, each after a timeout)
    resent = p1["end"]["retransmits"] - p1["phase1"]["retransmits"]
    assert resent < completed // 3, (resent, completed)
