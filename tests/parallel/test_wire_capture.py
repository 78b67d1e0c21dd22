"""Capture a real run's packets and have tshark decode them as RoCE (InfiniBand over
UDP) with the opcodes and fields docs/protocol.md promises."""
from __future__ import annotations

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
from tests.unit.test_wire import reference_icrc


def test_tshark_decodes_a_run_as_roce(tmp_path):
    if shutil.which("tshark") is None:
        pytest.skip("needs tshark (Debian package 'tshark')")
    if os.geteuid() != 0:
        pytest.skip("capturing on the loopback interface needs root")
    pcap = tmp_path / "run.pcap"
    with spawn(payload_bytes=4096, slots=8) as sw:
        port = sw.address[1]
        cap = subprocess.Popen(["tshark", "-i", "lo", "-f", f"udp port {port}", "-w", str(pcap), "-q"],
                               stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 30
            while time.time() < deadline:
                line = cap.stderr.readline()
                if "Capturing on" in line or not line:
                    break
            time.sleep(1.0)  # "Capturing on" comes a moment before the filter is live
            with dataplane.connect(sw.address, "wire", 0, 2) as r0, \
                    dataplane.connect(sw.address, "wire", 1, 2) as r1:
                a, b = np.arange(3000, dtype=np.float32), np.ones(3000, dtype=np.float32)
                ha, hb = r0.allreduce_async(a), r1.allreduce_async(b)
                ha.wait(), hb.wait()
                assert (a == np.arange(3000) + 1).all()
                key, index = r0.key, r0.job_index
            time.sleep(0.5)
        finally:
            cap.send_signal(signal.SIGINT)
            cap.wait(30)
    fields = ["infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.reth.r_key",
              "infiniband.reth.dmalen", "infiniband.reth.va", "udp.srcport",
              "infiniband.invariant.crc", "infiniband.bth.psn", "infiniband.immdt", "ip.src",
              "ip.dst", "udp.dstport", "ip.id", "ip.flags", "udp.payload"]
    out = subprocess.run(
        ["tshark", "-r", str(pcap), "-d", f"udp.port=={port},infiniband", "-T", "fields",
         "-E", "separator=|", "-E", "occurrence=f"] + [a for f in fields for a in ("-e", f)],
        capture_output=True, text=True, check=True).stdout.split()
    rows = [dict(zip(fields, line.split("|"))) for line in out]
    # 3000 floats = 12000 B = 3 packets per rank each way: 6 up, 6 down, plus any
    # retransmission (rank 1 may start after rank 0's first timeout).
    distinct = {(r["infiniband.bth.destqp"], r["infiniband.reth.va"], r["udp.srcport"]) for r in rows}
    assert len(distinct) == 12, rows
    for r in rows:
        assert int(r["infiniband.bth.opcode"]) == 43  # UC RDMA WRITE Only with Immediate
        assert int(r["infiniband.bth.destqp"], 0) >> 12 == index
        assert int(r["infiniband.reth.r_key"], 0) == key
        dmalen = int(r["infiniband.reth.dmalen"])
        assert dmalen in (4096, 12000 - 2 * 4096)
        # What each engine sent: its first message (immediate = message id 0), chunk c
        # of 1024 floats with PSN c; results echo both.
        offset = int(r["infiniband.reth.va"], 0) & (2**40 - 1)
        assert int(r["infiniband.bth.psn"]) == offset // 1024, r
        assert int(r["infiniband.immdt"], 16) == 0, r
        # The ICRC verifies against the independent reference, from the addresses and
        # ports on the wire (the reference assumes IPv4 ID 0 and DF, as Linux sends).
        assert int(r["ip.id"], 0) == 0 and int(r["ip.flags"], 0) == 0x02, r
        udp = bytes.fromhex(r["udp.payload"])
        pad = (-dmalen) % 4
        assert len(udp) == 32 + dmalen + pad + 4
        icrc = struct.unpack("<I", udp[-4:])[0]
        # tshark shows the trailer's 4 bytes as a big-endian number
        assert int(r["infiniband.invariant.crc"], 0) == int.from_bytes(udp[-4:], "big")
        want = reference_icrc(r["ip.src"], r["ip.dst"], int(r["udp.srcport"]),
                              int(r["udp.dstport"]), udp[:32], udp[32:32 + dmalen], pad)
        assert icrc == want != 0, r
    results = [r for r in rows if int(r["udp.srcport"]) == port]
    assert len({(r["infiniband.bth.destqp"], r["infiniband.reth.va"]) for r in results}) == 6
    assert all((int(r["infiniband.reth.va"], 0) >> 56) & 1 for r in results)
    # PSNs 0, 1, 2 from each rank, and back to each rank's QP
    up, down = {}, {}
    for r in rows:
        psn = int(r["infiniband.bth.psn"])
        if int(r["udp.srcport"]) == port:
            down.setdefault(int(r["infiniband.bth.destqp"], 0), set()).add(psn)
        else:
            up.setdefault(int(r["udp.srcport"]), set()).add(psn)
    assert list(up.values()) == [{0, 1, 2}] * 2 and list(down.values()) == [{0, 1, 2}] * 2
    assert sorted(qp & 0xFFF for qp in down) == [0, 1]
