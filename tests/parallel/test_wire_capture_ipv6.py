"""Capture a real run over IPv6 (loopback ::1) and check every packet on the wire:
tshark decodes it as RoCE over IPv6, and its ICRC, read from the trailer, equals the
ICRC an independent reference computes from the captured bytes with traffic class,
flow label and hop limit masked (tests/unit/test_wire_ipv6.py) — on packets the
kernel built, whose flow labels are its own. Needs root (capture) and tshark."""
from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import struct
import subprocess
import time

import numpy as np
import pytest

from netreduce import dataplane
from netreduce.switch import spawn
from tests.unit.test_wire_ipv6 import icrc_of_ipv6_packet


def test_tshark_decodes_an_ipv6_run_and_every_icrc_verifies(tmp_path):
    if shutil.which("tshark") is None:
        pytest.skip("needs tshark (Debian package 'tshark')")
    if os.geteuid() != 0:
        pytest.skip("capturing on the loopback interface needs root")
    pcap = tmp_path / "run6.pcap"
    with spawn(host="::1", payload_bytes=4096, slots=8) as sw:
        port = sw.address[1]
        cap = subprocess.Popen(["tshark", "-i", "lo", "-f", f"ip6 and udp port {port}", "-w",
                                str(pcap), "-q"], stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 30
            while time.time() < deadline:
                line = cap.stderr.readline()
                if "Capturing on" in line or not line:
                    break
            time.sleep(1.0)  # "Capturing on" comes a moment before the filter is live
            with dataplane.connect(sw.address, "wire6", 0, 2) as r0, \
                    dataplane.connect(sw.address, "wire6", 1, 2) as r1:
                a, b = np.arange(3000, dtype=np.float32), np.ones(3000, dtype=np.float32)
                ha, hb = r0.allreduce_async(a), r1.allreduce_async(b)
                ha.wait(), hb.wait()
                assert (a == np.arange(3000) + 1).all()
            time.sleep(0.5)
        finally:
            cap.send_signal(signal.SIGINT)
            cap.wait(30)
    fields = ["infiniband.bth.opcode", "ipv6.src", "ipv6.dst", "ipv6.tclass", "ipv6.flow",
              "ipv6.hlim", "udp.srcport", "udp.dstport", "udp.length", "udp.payload"]
    out = subprocess.run(
        ["tshark", "-r", str(pcap), "-d", f"udp.port=={port},infiniband", "-T", "fields",
         "-E", "separator=|", "-E", "occurrence=f"] + [a for f in fields for a in ("-e", f)],
        capture_output=True, text=True, check=True).stdout.split()
    rows = [dict(zip(fields, line.split("|"))) for line in out]
    assert len(rows) >= 12, rows  # 3 packets per rank each way, plus any resend
    for r in rows:
        assert int(r["infiniband.bth.opcode"]) == 43, r  # UC RDMA WRITE Only with Immediate
        udp_payload = bytes.fromhex(r["udp.payload"])
        udp_len = int(r["udp.length"])
        # Rebuild the packet from the captured fields, variant fields as captured.
        first = (6 << 28) | (int(r["ipv6.tclass"], 0) << 20) | int(r["ipv6.flow"], 0)
        pkt = (struct.pack(">IHBB", first, udp_len, 17, int(r["ipv6.hlim"])) +
               ipaddress.IPv6Address(r["ipv6.src"]).packed +
               ipaddress.IPv6Address(r["ipv6.dst"]).packed +
               struct.pack(">HHHH", int(r["udp.srcport"]), int(r["udp.dstport"]), udp_len, 0) +
               udp_payload)
        assert struct.unpack("<I", udp_payload[-4:])[0] == icrc_of_ipv6_packet(pkt) != 0, r
