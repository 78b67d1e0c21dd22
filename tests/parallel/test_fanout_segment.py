"""--fanout segment end to end: a job whose ranks all share the daemon's segment
(here: its host) gets its multicast group, verified per rank as --fanout auto does."""
from __future__ import annotations

import uuid

from tests.parallel.ranks import rounds_of_sums, run_ranks


def test_a_job_on_the_daemons_segment_gets_its_group():
    from netreduce.protocol.client import ControlClient
    from netreduce.switch import spawn

    from netreduce.worker import dataplane

    job = "seg-" + uuid.uuid4().hex[:6]
    with spawn(fanout="segment", payload_bytes=4096) as sw:
        stats = [s for s, _ in run_ranks(rounds_of_sums, 3, sw.address, job, 10**6 + 3, 3)]
        with dataplane.connect(sw.address, job + "-1", 0, 1), ControlClient(sw.address) as c:
            counters = c.call("counters")  # while a job of one is still there
    g, one = counters["global"], counters["jobs"][job + "-1"]
    assert counters["fanout"] == "segment"
    assert one["fanout_reason"] == "multicast: every rank on this host's L2 segment", one
    assert all(s["group_datagrams"] > 0 for s in stats), stats
    # copies only while a rank's contributions did not say the group reached it (its
    # first window, and again after a second without a group datagram): well under
    # the 3 per result that unicast fan-out sends
    assert 0 < g["group_unicast_copies"] < 2 * g["slots_completed"], g
    assert g["drop_bad_icrc"] == 0
