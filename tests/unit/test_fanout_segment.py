"""--fanout segment's decision (netreduce/switch/fanout.py): a job gets its multicast
group only when every rank is this host or on a directly connected IPv4 subnet."""
from __future__ import annotations

from netreduce.switch import fanout

# eth0: default via 192.0.2.1, 192.0.2.0/24 on-link; br0: 10.79.0.0/24 on-link;
# 10.80.0.0/16 via 10.79.0.9 (a router on the bridge); a route that is down.
ROUTES = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
br0\t00004F0A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
br0\t0000500A\t09004F0A\t0003\t0\t0\t0\t0000FFFF\t0\t0\t0
eth1\t0000510A\t00000000\t0000\t0\t0\t0\t0000FFFF\t0\t0\t0
"""


def test_on_link_subnets_and_this_host_get_the_group():
    assert fanout.job_on_segment(["10.79.0.1", "10.79.0.4", "192.0.2.77"], ROUTES) is None
    assert fanout.job_on_segment(["127.0.0.1", "::ffff:10.79.0.2"], ROUTES) is None


def test_a_rank_behind_a_gateway_keeps_the_job_on_unicast():
    why = fanout.job_on_segment(["10.79.0.1", "10.80.3.4"], ROUTES)
    assert why == "10.80.3.4 is reached through gateway 10.79.0.9 (br0)"
    # the default route, not a route that is down, decides for 10.81.x
    assert "gateway 192.0.2.1 (eth0)" in fanout.job_on_segment(["10.81.0.1"], ROUTES)


def test_ipv6_and_unroutable_ranks_keep_the_job_on_unicast():
    assert "IPv6" in fanout.job_on_segment(["10.79.0.1", "fd00::2"], ROUTES)
    no_default = "\n".join(ROUTES.splitlines()[:1] + ROUTES.splitlines()[2:])
    assert fanout.job_on_segment(["203.0.113.5"], no_default) == "no route to 203.0.113.5"
