"""With UDP GSO on (NETREDUCE_UDP_OFFLOAD's default) the wire still carries standard
RoCEv2 packets, one per datagram, each with its own headers and a valid ICRC. veth
passes a GSO send on whole (it advertises UDP segmentation offload, as a NIC would),
so each namespace's veth has it switched off here (`ethtool -K eth0
tx-udp-segmentation off`): the kernel then cuts every send in software just before
the device, as a NIC's offload would on the wire, and the capture on the aggregator's
link sees the segments. Two ranks all-reduce through netreduce-switch on the testbed
at MTU 1500 and 9000 with no flags; tshark decodes every packet as InfiniBand. Every
packet fits the MTU; at MTU 1500 (1432-byte payloads, ICRC on) every ICRC verifies
against the IBTA rule with the IPv4 ID on the wire, and IDs above 0 show that the
kernel segmented GSO sends (segment k of a send gets ID k). Needs root, tshark and
ethtool."""
from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import uuid

import pytest

from netreduce.testbed import Testbed, why_unusable
from tests.procs import collect_ok
from tests.root import scratch_subnet, scratch_testbed_name, wait_for_capture_file
from tests.unit.test_wire import reference_icrc

REASON = why_unusable()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=REASON or "")]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
           NETREDUCE_UDP_OFFLOAD="auto")

WORKER = r"""
import json, sys
import numpy as np
from netreduce.worker import dataplane
host, port, job, rank, size = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
conn = dataplane.connect((host, port), job, rank, size, timeout=60.0)
failures = []
for count in (5, 100_003):
    parts = [np.random.default_rng(count + r).integers(-1000, 1000, count).astype(np.float32)
             for r in range(size)]
    out = conn.allreduce(parts[rank].copy(), np.empty(count, np.float32))
    if not np.array_equal(out, np.sum(parts, axis=0, dtype=np.float32)):
        failures.append(count)
print(json.dumps({"failures": failures, "payload": conn.payload_bytes, "path": conn.data_path}),
      flush=True)
conn.close()
"""

FIELDS = ["infiniband.bth.opcode", "ip.src", "ip.dst", "ip.id", "ip.flags", "ip.len",
          "udp.srcport", "udp.dstport", "udp.payload"]


def _switch(tb: Testbed) -> subprocess.Popen:
    switch = tb.spawn_switch(args=["--fanout", "unicast"], env=ENV)
    line = switch.log[-1]
    assert "data path udp gso+gro" in line, line
    return switch.proc


@pytest.mark.parametrize("mtu, payload, tag", [(1500, 1432, "g"), (9000, 8936, "j")])
def test_gso_sends_reach_the_wire_as_standard_roce_packets(tmp_path, mtu, payload, tag):
    for tool in ("tshark", "dumpcap", "ethtool"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool}")
    pcap = tmp_path / "agg.pcap"
    with Testbed(hosts=2, rate="10gbit", mtu=mtu, name=scratch_testbed_name(tag), subnet=scratch_subnet(),
                 replace=True) as tb:
        for node in tb.plan.nodes:  # segment where the packets leave each namespace
            tb.run(node, ["ethtool", "-K", tb.ifname, "tx-udp-segmentation", "off"], check=True,
                   capture_output=True)
        cap = tb.popen(tb.aggregator, ["dumpcap", "-q", "-i", tb.ifname, "-f", "udp portrange 4791-4792",
                                       "-w", str(pcap)], stderr=subprocess.DEVNULL)
        try:
            wait_for_capture_file(pcap, 20)
            switch = _switch(tb)
            try:
                job = "gso-" + uuid.uuid4().hex[:6]
                procs = [tb.popen(r, [sys.executable, "-c", WORKER, tb.aggregator.address, "4791",
                                      job, str(r), "2"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=ENV) for r in range(2)]
                results = collect_ok(procs, timeout=120)
            finally:
                switch.terminate()
                switch.wait(20)
            time.sleep(0.5)
        finally:
            cap.send_signal(signal.SIGINT)
            cap.wait(20)
    for r in results:
        assert r["failures"] == [] and r["payload"] == payload, r
        assert r["path"] == "udp gso+gro", r
    out = subprocess.run(["tshark", "-r", str(pcap), "-d", "udp.port==4791,infiniband", "-T", "fields",
                          "-E", "separator=|", "-E", "occurrence=f"] + [a for f in FIELDS for a in ("-e", f)],
                         capture_output=True, text=True, check=True).stdout.split()
    rows = [dict(zip(FIELDS, line.split("|"))) for line in out]
    # 100,008 floats each way per rank are hundreds of datagrams, most sent in runs.
    assert len(rows) > 2 * 2 * 100_003 * 4 // payload, len(rows)
    ids = set()
    for r in rows:
        assert int(r["infiniband.bth.opcode"]) == 43, r  # UC RDMA WRITE Only with Immediate
        assert int(r["ip.len"]) <= mtu and int(r["ip.flags"], 0) == 0x02, r  # a frame each, DF
        udp = bytes.fromhex(r["udp.payload"])
        dmalen = struct.unpack(">I", udp[24:28])[0]
        pad = (-dmalen) % 4
        assert len(udp) == 32 + dmalen + pad + 4, r
        ip_id = int(r["ip.id"], 0)
        ids.add(ip_id)
        if not udp[8] & 0x40:  # ICRC on; a job with payloads above 4 KiB sends the jumbo
            # software extension (BTH byte 8, 0x40) on every packet, with ICRC 0
            want = reference_icrc(r["ip.src"], r["ip.dst"], int(r["udp.srcport"]),
                                  int(r["udp.dstport"]), udp[:32], udp[32:32 + dmalen], pad, ip_id)
            assert struct.unpack("<I", udp[-4:])[0] == want, r
    assert max(ids) > 0, "no segment of a GSO send on the wire"
    assert mtu > 1500 or all(not bytes.fromhex(r["udp.payload"])[8] & 0x40 for r in rows)
    assert max(ids) < 64, ids  # at most 64 segments per send
