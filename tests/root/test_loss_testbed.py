"""1,000 all-reduces of random sizes, dtypes and ops (benchmarks/loss.py's stream)
across the emulated testbed -- three hosts and an aggregator in their own
namespaces, 1 Gbit/s links -- with 1 % and 5 % of the UDP packets every namespace
receives dropped by nftables (numgen random): data packets to the aggregator and
results to the ranks alike. Every result bit-identical to the numpy reference and
across ranks; no hang. Needs root; skipped with the reason otherwise.

On every socket path (NETREDUCE_UDP_OFFLOAD auto = GSO/GRO, off = a datagram per
send and receive) at MTU 1500 and 9000. veth carries a GSO send whole, so the input
hook's random drop takes a whole run of datagrams at once (a burst); with the veths'
UDP segmentation offload off (`per_segment`) the kernel cuts the runs before the
device and a dropped packet is one datagram, as on a real wire."""
from __future__ import annotations

import os
import shutil

import pytest

from netreduce.testbed import Testbed, why_unusable
from tests.root import loss_worker_reports, scratch_subnet, scratch_testbed_name

REASON = why_unusable()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("loss, mtu, offload, per_segment", [
    (0.01, 9000, "auto", False),
    (0.05, 9000, "auto", False),
    (0.01, 9000, "auto", True),
    (0.01, 1500, "auto", True),
    (0.01, 1500, "auto", False),
    (0.01, 1500, "off", False),
    (0.01, 9000, "off", False),
])
def test_thousand_allreduces_exact_under_nftables_loss(loss, mtu, offload, per_segment):
    pytest.importorskip("netreduce._native", reason="netreduce._native is not built (pip install -e .)")
    if per_segment and shutil.which("ethtool") is None:
        pytest.skip("needs ethtool (Debian package 'ethtool')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
               NETREDUCE_UDP_OFFLOAD=offload)
    hosts = 3
    with Testbed(hosts=hosts, rate="1gbit", loss=loss, loss_proto="udp", mtu=mtu,
                 name=scratch_testbed_name("l"), subnet=scratch_subnet(), replace=True) as tb:
        if per_segment:
            for node in tb.plan.nodes:
                tb.run(node, ["ethtool", "-K", tb.ifname, "tx-udp-segmentation", "off"],
                       check=True, capture_output=True)
        # The daemon's own default payload (the path's): 1432 or 8936 B.
        switch = tb.spawn_switch(env=env, args=["--payload-bytes", "65464"])
        try:
            results = loss_worker_reports(tb, switch, hosts, n=1000, max_elems=8192,
                                          seed=int(loss * 100), env=env)
            drops = tb.loss_drops()
        finally:
            switch.stop()
    for r in results:
        assert r["n_wrong"] == 0, r["wrong"]
    assert len({r["digest"] for r in results}) == 1
    # The loss was real, both ways: the aggregator and the hosts each dropped packets.
    assert drops["agg"] > 0 and sum(drops[h.name] for h in tb.hosts) > 0, drops
    assert sum(r["stats"]["retransmits"] for r in results) > 0
