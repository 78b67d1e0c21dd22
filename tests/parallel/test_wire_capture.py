"""Capture a real run's packets and have tshark decode them as RoCE (InfiniBand over
UDP) with the opcodes and fields docs/protocol.md promises; over IPv6 (loopback ::1)
too, where every packet's ICRC, read from the trailer, equals the ICRC an independent
reference computes from the captured bytes with traffic class, flow label and hop
limit masked (tests/unit/test_wire_ipv6.py) — on packets the kernel built, whose
flow labels are its own. Needs root (capture) and tshark.

Both with UDP GSO/GRO (NETREDUCE_UDP_OFFLOAD=auto) and without (off). Loopback carries
a GSO send whole, as one IP packet of several RoCEv2 datagrams, so the capture is
split by segment size first (pcap_segments.py), giving each segment the IPv4 ID the
kernel gives it when it segments (0, 1, 2, ...): the ICRC of every one must verify
with that ID. tests/root/test_gso_wire.py captures segments a real veth sent."""
from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
from typing import List, Tuple

import numpy as np
import pytest

from netreduce.worker import dataplane
from netreduce.switch import spawn
from tests.parallel.pcap_segments import split_gso
from tests.unit.test_wire import reference_icrc
from tests.unit.test_wire_ipv6 import icrc_of_ipv6_packet


def wait_until_capturing(pcap, host: str, probe: int, timeout: float = 30.0) -> None:
    """Send probe datagrams until one is in the capture file: the filter is live then
    (tshark says "Capturing on" a moment before it is, and writes in bursts)."""
    empty = None
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                       socket.SOCK_DGRAM) as s:
        while time.monotonic() < deadline:
            s.sendto(b"probe", (host, probe))
            time.sleep(0.05)
            size = os.path.getsize(pcap) if os.path.exists(pcap) else 0
            if empty is None and size:
                empty = size  # the file's header, written before any packet
            elif empty is not None and size > empty:
                return
    pytest.fail(f"the capture has none of the probes to {host}:{probe} within {timeout:g} s")


def wait_until_written(pcap, host: str, probe: int, timeout: float = 30.0) -> None:
    """Send a last probe until it is in the capture file: packets are written in the
    order they were captured, so every packet sent before it is there too (was a fixed
    0.5 s before the capture's end)."""
    mark = b"last-probe-" + os.urandom(8).hex().encode()
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                       socket.SOCK_DGRAM) as s:
        while time.monotonic() < deadline:
            s.sendto(mark, (host, probe))
            time.sleep(0.02)
            if mark in pcap.read_bytes():
                return
    pytest.fail(f"the capture wrote none of the last probes to {host}:{probe} within {timeout:g} s")


def capture(tmp_path, host: str, ip: str, fields: List[str],
            offload: str = "off") -> Tuple[List[dict], int, tuple, int]:
    """Two ranks all-reduce 3,000 floats (3 packets each way per rank) through a
    daemon on ``host`` while dumpcap captures; every packet's ``fields``, decoded as
    InfiniBand, the port and (key, job index) of the job, and how many captured IP
    packets were GSO sends of several datagrams (split before decoding)."""
    for tool in ("tshark", "dumpcap"):  # dumpcap: Debian's wireshark-common, tshark's dependency
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool} (Debian package 'tshark')")
    if os.geteuid() != 0:
        pytest.skip("capturing on the loopback interface needs root")
    os.environ["NETREDUCE_UDP_OFFLOAD"] = offload  # the daemon's and these ranks'
    pcap = tmp_path / "run.pcap"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # unicast: every result is a standard RoCE packet on the data port (captured)
    with spawn(host=host, payload_bytes=4096, slots=8, fanout="unicast") as sw, \
            socket.socket(family, socket.SOCK_DGRAM) as sink:
        port = sw.address[1]
        sink.bind((host, 0))  # the probe's destination (it only swallows the probes)
        probe = sink.getsockname()[1]
        # dumpcap, the capture engine tshark runs: the same capture, without tshark's
        # dissectors to load first (~1.3 s before the filter is live, at load 12)
        cap = subprocess.Popen(["dumpcap", "-i", "lo", "-f",
                                f"{ip} and (udp port {port} or udp port {probe})", "-P",
                                "-w", str(pcap), "-q"], stderr=subprocess.DEVNULL)
        try:
            wait_until_capturing(pcap, host, probe)
            with dataplane.connect(sw.address, "wire", 0, 2) as r0, \
                    dataplane.connect(sw.address, "wire", 1, 2) as r1:
                a, b = np.arange(3000, dtype=np.float32), np.ones(3000, dtype=np.float32)
                ha, hb = r0.allreduce_async(a), r1.allreduce_async(b)
                ha.wait(), hb.wait()
                assert (a == np.arange(3000) + 1).all()
                job = (r0.key, r0.job_index)
            wait_until_written(pcap, host, probe)
        finally:
            cap.send_signal(signal.SIGINT)
            cap.wait(30)
    split = tmp_path / "segments.pcap"
    sends = split_gso(pcap, split, port)
    out = subprocess.run(
        ["tshark", "-r", str(split), "-Y", f"udp.port=={port}", "-d",
         f"udp.port=={port},infiniband", "-T", "fields",
         "-E", "separator=|", "-E", "occurrence=f"] + [a for f in fields for a in ("-e", f)],
        capture_output=True, text=True, check=True).stdout.split()
    return [dict(zip(fields, line.split("|"))) for line in out], port, job, sends


@pytest.fixture
def offload_env():
    saved = os.environ.get("NETREDUCE_UDP_OFFLOAD")
    yield
    if saved is None:
        os.environ.pop("NETREDUCE_UDP_OFFLOAD", None)
    else:
        os.environ["NETREDUCE_UDP_OFFLOAD"] = saved


@pytest.mark.parametrize("offload", ["off", "auto"])
def test_tshark_decodes_a_run_as_roce(tmp_path, offload, offload_env):
    fields = ["infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.reth.r_key",
              "infiniband.reth.dmalen", "infiniband.reth.va", "udp.srcport",
              "infiniband.invariant.crc", "infiniband.bth.psn", "infiniband.immdt", "ip.src",
              "ip.dst", "udp.dstport", "ip.id", "ip.flags", "infiniband.bth.a",
              "infiniband.bth.reserved7", "udp.payload"]
    rows, port, (key, index), sends = capture(tmp_path, "127.0.0.1", "ip", fields, offload)
    # With GSO each rank's three chunks left in one send (one lane, one batch).
    assert (sends >= 2) if offload == "auto" else (sends == 0), sends
    # 3000 floats = 12000 B = 3 packets per rank each way: 6 up, 6 down, plus any
    # retransmission (rank 1 may start after rank 0's first timeout).
    distinct = {(r["infiniband.bth.destqp"], r["infiniband.reth.va"], r["udp.srcport"]) for r in rows}
    assert len(distinct) == 12, rows
    for r in rows:
        assert int(r["infiniband.bth.opcode"]) == 43  # UC RDMA WRITE Only with Immediate
        assert int(r["infiniband.bth.destqp"], 0) >> 12 == index
        assert int(r["infiniband.reth.r_key"], 0) == key
        dmalen = int(r["infiniband.reth.dmalen"])
        ack_req = r["infiniband.bth.a"] in ("1", "True")
        # BTH byte 8's reserved bits; every sender here is a kernel UDP socket, which
        # says its UDP checksum is set (0x08, NETREDUCE_ICRC_CHECK), under the ICRC
        ext = int(r["infiniband.bth.reserved7"], 0)
        assert ext & 0x08, r
        ext &= ~0x08
        if int(r["udp.srcport"]) != port:
            # A job's first message goes before any round-trip sample: every
            # contribution asks (BTH.A) for a held notice (docs/protocol.md)
            assert ack_req and ext == 0 and dmalen in (4096, 12000 - 2 * 4096), r
        elif dmalen == 0:
            # a held notice: the round holds this rank's contribution, waits for the other
            assert not ack_req and ext == 0x10, r
        else:
            assert not ack_req and ext & 0x10 == 0 and dmalen in (4096, 12000 - 2 * 4096), r
        # What each engine sent: its first message (immediate = message id 0), chunk c
        # of 1024 floats with PSN c; results echo both.
        offset = int(r["infiniband.reth.va"], 0) & (2**40 - 1)
        assert int(r["infiniband.bth.psn"]) == offset // 1024, r
        assert int(r["infiniband.immdt"], 16) == 0, r
        # The ICRC verifies against the independent reference, from the addresses,
        # ports and IPv4 ID on the wire: DF always; ID 0 for a plain send, k for
        # segment k of a GSO send.
        ip_id = int(r["ip.id"], 0)
        assert int(r["ip.flags"], 0) == 0x02 and (ip_id == 0 or offload == "auto"), r
        udp = bytes.fromhex(r["udp.payload"])
        pad = (-dmalen) % 4
        assert len(udp) == 32 + dmalen + pad + 4
        icrc = struct.unpack("<I", udp[-4:])[0]
        # tshark shows the trailer's 4 bytes as a big-endian number
        assert int(r["infiniband.invariant.crc"], 0) == int.from_bytes(udp[-4:], "big")
        want = reference_icrc(r["ip.src"], r["ip.dst"], int(r["udp.srcport"]),
                              int(r["udp.dstport"]), udp[:32], udp[32:32 + dmalen], pad, ip_id)
        assert icrc == want != 0, r
    # each of the three chunks reached the aggregator first from one rank, who was told
    notices = [r for r in rows if int(r["udp.srcport"]) == port and not int(r["infiniband.reth.dmalen"])]
    assert len({r["infiniband.reth.va"] for r in notices}) == 3, notices
    results = [r for r in rows if int(r["udp.srcport"]) == port and int(r["infiniband.reth.dmalen"])]
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


@pytest.mark.parametrize("offload", ["off", "auto"])
def test_tshark_decodes_an_ipv6_run_and_every_icrc_verifies(tmp_path, offload, offload_env):
    fields = ["infiniband.bth.opcode", "ipv6.src", "ipv6.dst", "ipv6.tclass", "ipv6.flow",
              "ipv6.hlim", "udp.srcport", "udp.dstport", "udp.length", "udp.payload"]
    rows, _, _, sends = capture(tmp_path, "::1", "ip6", fields, offload)
    assert (sends >= 2) if offload == "auto" else (sends == 0), sends
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
