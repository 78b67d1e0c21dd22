"""Capture a real run's packets and have tshark decode them as RoCE (InfiniBand over
UDP) with the opcodes and fields docs/protocol.md promises."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from netreduce import dataplane
from netreduce.switch import spawn


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
    out = subprocess.run(
        ["tshark", "-r", str(pcap), "-d", f"udp.port=={port},infiniband", "-T", "fields",
         "-E", "separator=,", "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp",
         "-e", "infiniband.reth.r_key", "-e", "infiniband.reth.dmalen", "-e", "infiniband.reth.va",
         "-e", "udp.srcport", "-e", "infiniband.invariant.crc"],
        capture_output=True, text=True, check=True).stdout.split()
    rows = [line.split(",") for line in out]
    # 3000 floats = 12000 B = 3 packets per rank each way: 6 up, 6 down, plus any
    # retransmission (rank 1 may start after rank 0's first timeout).
    distinct = {(r[1], r[4], r[5]) for r in rows}
    assert len(distinct) == 12, rows
    for opcode, qpn, rkey, dmalen, va, sport, icrc in rows:
        assert int(opcode) == 43  # UC RDMA WRITE Only with Immediate
        assert int(qpn, 0) >> 12 == index
        assert int(rkey, 0) == key
        assert int(dmalen) in (4096, 12000 - 2 * 4096)
        assert int(icrc, 0) != 0  # RoCE-sized packets carry a real ICRC
    results = [r for r in rows if int(r[5]) == port]
    assert len({(r[1], r[4]) for r in results}) == 6 and all((int(r[4], 0) >> 56) & 1 for r in results)
