"""Two levels on the emulated testbed (benchmarks/two_level.py's layout): 2 racks x 2
hosts, a rack aggregator per rack, a spine, every link shaped. Through the public API,
exact results (dtypes, sizes 0, 1, a packet +- 1), and the wire bytes on the spine's
link are one partial sum per rack: about 2x what a worker sends, where one aggregator
for all four ranks receives about 4x. Needs root; skipped with the reason otherwise."""
from __future__ import annotations

import statistics
from typing import Tuple

import pytest

from benchmarks.two_level import RACKS, RANKS, SPINE, run_mode
from netreduce.testbed import Testbed, why_unusable
from netreduce.testbed.two_level import two_level_plan
from tests.root import scratch_subnet, scratch_testbed_name

REASON = why_unusable()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def _host_link_tx(run, per_host: int = 1) -> Tuple[float, float]:
    """What one worker host's link carries, (least, most): each host's tx bytes times
    its ranks' share of first sends, the median host's; and the most any host's link
    carried. Resends (and tail copies) follow the host's scheduling, not the tree:
    under load one rank's resends made its host's tx 10-70 % larger (CI of stops 46
    and 47: the median host 6.28 MB, the others' 5.6). Its rack aggregator drops them
    as duplicates, yet resends its partial for a member's resend, so the spine's bytes
    lie between 2x the first and 2x the most."""
    shares = []
    for h in range(RANKS):
        st = [r["stats"] for r in run["ranks"] if r["rank"] // per_host == h]
        sent = sum(s["packets_sent"] for s in st)
        first = sum(s["packets_sent"] - s["retransmits"] - s["tail_copies"] for s in st)
        shares.append(run["wire"][f"h{h}"]["tx_bytes"] * first / sent)
    return statistics.median(shares), max(run["wire"][f"h{h}"]["tx_bytes"] for h in range(RANKS))


def test_spine_link_carries_one_partial_per_rack():
    layout = two_level_plan(2, 2, "1gbit", name=scratch_testbed_name("t2")[:8],
                            subnet=scratch_subnet())
    assert (layout.rack_aggregators, layout.spine) == (list(RACKS), SPINE)
    with Testbed(plan=layout.plan, replace=True) as tb:
        single = run_mode(tb, "single", 2 << 20, 2)
        tree = run_mode(tb, "tree", 2 << 20, 2)
    for run in (single, tree):
        assert all(r["checked"] == 8 and r["algorithm"] == "flat" for r in run["ranks"]), run
    w = single["wire"]  # every worker's bytes to the one aggregator: about 4 S
    spine_rx, host_tx = w[f"h{SPINE}"]["rx_bytes"], _host_link_tx(single)[0]
    all_tx = sum(w[f"h{i}"]["tx_bytes"] for i in range(RANKS))
    assert RANKS * 0.9 < spine_rx / host_tx and spine_rx < 1.1 * all_tx, w
    w, (least, most) = tree["wire"], _host_link_tx(tree)  # one partial sum per rack: about 2 S
    assert len(RACKS) * 0.9 * least < w[f"h{SPINE}"]["rx_bytes"] < len(RACKS) * 1.1 * most, (least, most, w)
    for k, h in enumerate(RACKS):  # its two members' bytes in, and one result from the spine
        members_tx = sum(w[f"h{i}"]["tx_bytes"] for i in range(RANKS) if i * len(RACKS) // RANKS == k)
        assert 0.7 * least < w[f"h{h}"]["rx_bytes"] - members_tx < 1.3 * most, (least, most, w)


def test_hierarchical_hosts_through_the_tree():
    """Two ranks per host: the hierarchical all-reduce's shards (one sub-job per local
    rank) each go through the tree; every host link still carries S, the spine's 2 S."""
    layout = two_level_plan(2, 2, "1gbit", name=scratch_testbed_name("t3")[:8],
                            subnet=scratch_subnet())
    with Testbed(plan=layout.plan, replace=True) as tb:
        run = run_mode(tb, "tree", 2 << 20, 2, per_host=2)
    assert all(r["checked"] == 8 and r["algorithm"] == "hierarchical" for r in run["ranks"]), run
    w, (least, most) = run["wire"], _host_link_tx(run, per_host=2)
    assert 1.8 * least < w[f"h{SPINE}"]["rx_bytes"] < 2.2 * most, (least, most, w)


def test_loss_on_every_link_still_exact():
    """5 % UDP loss on every namespace's input (nftables): workers' packets, partial
    sums, the spine's results and the racks' results are all lost now and then; every
    result still exact (the ranks check them). nftables sees a UDP GSO send as one
    packet of up to 64 KiB (veth carries it whole), so 1 % of 2 MiB left some links
    without a single drop (1-2 per host in a failed run): 5 % of 4 MiB."""
    layout = two_level_plan(2, 2, "1gbit", name=scratch_testbed_name("t4")[:8],
                            subnet=scratch_subnet())
    with Testbed(plan=layout.plan, replace=True) as tb:
        tb.set_loss(0.05, proto="udp")
        run = run_mode(tb, "tree", 4 << 20, 3)
        drops = tb.loss_drops()
    assert all(r["checked"] == 8 for r in run["ranks"]), run
    assert drops[f"h{SPINE}"] > 0 and all(drops[f"h{h}"] > 0 for h in RACKS), drops


def test_failed_run_carries_the_aggregators_counters():
    """Every partial sum lost (--uplink-drop-rate 1 at the racks): every rank times out,
    and the error names each failed rank with the job's counters at its rack
    aggregator and spine (taken as it left) and the daemons' last output lines, so a
    run that stuck once can be read afterwards. The last rank waits 8 s, not 4: a rank
    that fails in init has left the job before it reads the counters, and an
    aggregator frees a job once every rank has left (all four at 4 s: every dump was
    empty in 2 of 6 runs on a quiet machine); ranks 0-2 read them while it holds on."""
    layout = two_level_plan(2, 2, "1gbit", name=scratch_testbed_name("t5")[:8],
                            subnet=scratch_subnet())
    with Testbed(plan=layout.plan, replace=True) as tb:
        with pytest.raises(RuntimeError) as failed:
            run_mode(tb, "tree", 1 << 20, 1, timeout=120, rack_args=["--uplink-drop-rate", "1"],
                     rank_timeout_s=[4, 4, 4, 8])
    message = str(failed.value)
    assert "tree: rank(s) 0, 1, 2, 3 failed" in message, message
    assert message.count("counters at failure: ") == RANKS, message
    assert '"uplink_dropped": ' in message and '"uplink_partials_sent": ' in message, message
    for h in (*RACKS, SPINE):
        assert f"netreduce-switch in h{h}, last lines:" in message, message
