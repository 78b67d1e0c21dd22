"""1 % of the packets reaching the aggregator dropped by a real nftables rule on
its input hook (numgen random): the results must still be exact."""
from __future__ import annotations

import subprocess
import uuid

import numpy as np

from netreduce.worker import dataplane
from netreduce.protocol.client import ControlClient
from netreduce.switch import spawn
from tests.conftest import require_root
from tests.parallel.ranks import run_ranks


def _ranks(rank, size, address, job):
    with dataplane.connect(address, job, rank, size, timeout=30.0, retransmit_ms=5.0) as conn:
        for count in (10**6 + 3, 5, 3 * 10**5):
            a = np.full(count, rank, dtype=np.int64)
            conn.allreduce(a)
            assert (a == size * (size - 1) // 2).all()
        return conn.stats()


def test_one_percent_nftables_loss_on_aggregator_input():
    require_root("nft")
    table = "nrloss_" + uuid.uuid4().hex[:6]
    with spawn(slots=32) as sw:
        port = sw.address[1]
        rules = (f"table inet {table} {{\n chain input {{\n type filter hook input priority 0;\n"
                 f" udp dport {port} numgen random mod 100 < 1 counter drop\n }}\n}}\n")
        subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)
        try:
            run_ranks(_ranks, 3, sw.address, "loss-" + table)
            listing = subprocess.run(["nft", "list", "table", "inet", table], capture_output=True,
                                     text=True, check=True).stdout
        finally:
            subprocess.run(["nft", "delete", "table", "inet", table], check=False)
        dropped = int(listing.split("counter packets ")[1].split()[0])
        assert dropped > 0, listing
        with ControlClient(sw.address) as c:
            assert c.call("counters")["global"]["slots_completed"] > 0
