"""netreduce-switch --transport xdp across the emulated testbed: the aggregator's data
port on an AF_XDP socket (native XDP, copy mode on veth), three hosts of ranks on
kernel sockets. Every result exact at MTU 1500 and 9000 over all dtypes and ops, with
1 % of the UDP packets each host receives dropped by nftables (an nftables rule in the
aggregator's namespace sees nothing of what XDP steers, so the hosts' rules do the
dropping) and repaired; a capture of the aggregator's own frames decodes as standard
RoCEv2 with valid ICRC, IP and UDP checksums; and where AF_XDP cannot be had (another
program attached, no capabilities) the daemon says why in its log and serves on
kernel sockets, or exits with the reason under --no-xdp-fallback. Needs root, the
transport built and (for the capture) tshark."""
from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

import pytest

from netreduce.protocol.client import ControlClient
from netreduce.testbed import Testbed, why_unusable
from tests.procs import last_json
from tests.root import loss_worker_reports, scratch_subnet, wait_for_capture_file
from tests.root.test_xdp_transport import native, xdp_name  # noqa: F401  (fixture)

REASON = why_unusable()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
XDP_WORKER = os.path.join(HERE, "xdp_worker.py")


def env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))


def run_stream(tb, switch, hosts: int, n: int, max_elems: int, seed: int):
    return loss_worker_reports(tb, switch, hosts, n, max_elems, seed, env())


def transport_of(switch) -> dict:
    """The daemon's data-port transport and its packet counts (the control port's
    `counters`), asked from the root namespace over the testbed's bridge."""
    with ControlClient(switch.address) as c:
        snap = c.call("counters")
    return snap["transport"], snap["global"]


@pytest.mark.parametrize("mtu", [1500, 9000])
def test_exact_results_through_the_xdp_aggregator_with_loss(native, mtu):
    hosts = 3
    with Testbed(hosts=hosts, rate="10gbit", mtu=mtu, loss=0.01, loss_proto="udp",
                 name=xdp_name("a" if mtu == 1500 else "b"),
                 subnet=scratch_subnet(), replace=True) as tb:
        # unicast: every result through the AF_XDP socket (counted below)
        switch = tb.spawn_switch(env=env(), args=["--transport", "xdp", "--fanout", "unicast"])
        try:
            ready = next(line for line in switch.log if "listening on" in line)
            assert "data path AF_XDP on queue 0 of eth0 (XDP native, copy mode" in ready, switch.log
            results = run_stream(tb, switch, hosts, n=300, max_elems=20000, seed=mtu)
            transport, totals = transport_of(switch)
            drops = tb.loss_drops()
        finally:
            switch.stop()
    for r in results:
        assert r["n_wrong"] == 0, r["wrong"]
    assert len({r["digest"] for r in results}) == 1
    # The loss was real and repaired: the hosts dropped results, the ranks resent.
    assert sum(drops[h.name] for h in tb.hosts) > 0, drops
    assert sum(r["stats"]["retransmits"] for r in results) > 0
    # And the aggregator's packets went through AF_XDP, both ways.
    stats = transport["port_stats"][0]
    assert transport["transport"] == "xdp" and transport["mode"] == "native", transport
    assert stats["rx_xsk"] >= 0.99 * totals["packets_in"] > 0, (stats, totals)
    assert stats["tx_xsk"] >= 0.99 * totals["packets_out"] > 0, (stats, totals)
    assert transport["program"]["steered"] >= stats["rx_xsk"], transport
    assert stats["rx_malformed"] == 0, stats


def reference_icrc(src, dst, sport, dport, header, payload, pad):
    from tests.unit.test_wire import reference_icrc as ref
    return ref(src, dst, sport, dport, header, payload, pad)


@pytest.mark.parametrize("mtu", [1500, 9000])
def test_capture_of_the_xdp_path_decodes_as_rocev2_with_valid_checksums(native, tmp_path, mtu):
    """The aggregator's results, built by the AF_XDP transport, captured on the wire
    (the aggregator's root-side veth end): tshark decodes each as InfiniBand over UDP
    (UC RDMA WRITE Only with Immediate), finds its IPv4 and UDP checksums good, and
    its ICRC equals an independent computation. RoCE-sized payloads (4096 B at MTU
    9000: each such frame leaves in two AF_XDP buffers)."""
    for tool in ("tshark", "dumpcap"):  # dumpcap: Debian's wireshark-common, tshark's dependency
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool} (Debian package 'tshark')")
    payload = 4096 if mtu == 9000 else 1432
    pcap = tmp_path / "xdp.pcap"
    with Testbed(hosts=2, rate="10gbit", mtu=mtu, name=xdp_name("c" if mtu == 1500 else "d"),
                 subnet=scratch_subnet(), replace=True) as tb:
        switch = tb.spawn_switch(env=env(), args=["--transport", "xdp", "--payload-bytes",
                                                  str(payload), "--fanout", "unicast"])
        # dumpcap, the capture engine tshark runs: the same capture, live ~1.3 s sooner
        # (no dissectors to load); tshark decodes the file below
        cap = subprocess.Popen(["dumpcap", "-i", tb.aggregator.peer, "-f", "udp port 4791",
                                "-w", str(pcap), "-q"], stderr=subprocess.DEVNULL)
        try:
            wait_for_capture_file(pcap, 30)
            results = run_stream(tb, switch, 2, n=20, max_elems=3000, seed=7)
            transport, _ = transport_of(switch)
            time.sleep(0.5)
        finally:
            cap.send_signal(signal.SIGINT)
            cap.wait(30)
            switch.stop()
    assert all(r["n_wrong"] == 0 for r in results)
    assert transport["port_stats"][0]["tx_xsk"] > 0, transport
    fields = ["infiniband.bth.opcode", "ip.src", "ip.dst", "udp.srcport", "udp.dstport", "ip.id",
              "ip.flags", "ip.checksum.status", "udp.checksum.status", "infiniband.reth.dmalen",
              "udp.payload"]
    out = subprocess.run(
        ["tshark", "-r", str(pcap), "-Y", "udp.srcport==4791", "-d", "udp.port==4791,infiniband",
         "-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE", "-T", "fields",
         "-E", "separator=|", "-E", "occurrence=f"] + [a for f in fields for a in ("-e", f)],
        capture_output=True, text=True, check=True).stdout.split()
    rows = [dict(zip(fields, line.split("|"))) for line in out]
    assert len(rows) >= 40, rows[:3]  # every result of 20 all-reduces, to 2 ranks
    sized = 0
    for r in rows:
        assert int(r["infiniband.bth.opcode"]) == 43, r  # UC RDMA WRITE Only with Immediate
        assert r["ip.checksum.status"] == "1" and r["udp.checksum.status"] == "1", r  # 1: good
        assert int(r["ip.id"], 0) == 0 and int(r["ip.flags"], 0) == 0x02, r  # ID 0, DF
        udp = bytes.fromhex(r["udp.payload"])
        dmalen = int(r["infiniband.reth.dmalen"])
        pad = (-dmalen) % 4
        assert len(udp) == 32 + dmalen + pad + 4, r
        want = reference_icrc(r["ip.src"], r["ip.dst"], int(r["udp.srcport"]),
                              int(r["udp.dstport"]), udp[:32], udp[32:32 + dmalen], pad)
        assert struct.unpack("<I", udp[-4:])[0] == want != 0, r
        sized += dmalen == payload
    assert sized > 0  # full-payload frames among them (two AF_XDP buffers at MTU 9000)


def wait_line(proc, pattern: str, timeout: float = 30.0) -> list:
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line.rstrip())
        if re.search(pattern, line):
            return seen
    return seen


def test_fallback_and_refusal_are_named_in_the_log(native):
    """A second daemon asking for AF_XDP on a device whose XDP hook the first holds:
    its log names the device and why, and it serves on kernel sockets (exact
    results); with --no-xdp-fallback it exits 2 with that reason. A daemon without
    capabilities falls back the same way, naming them."""
    hosts = 2
    with Testbed(hosts=hosts, rate="10gbit", mtu=1500, name=xdp_name("f"),
                 subnet=scratch_subnet(), replace=True) as tb:
        first = tb.spawn_switch(env=env(), args=["--transport", "xdp"])
        try:
            second = tb.spawn_switch(port=4800, env=env(), args=["--transport", "xdp"])
            try:
                results = run_stream(tb, second, hosts, n=30, max_elems=5000, seed=3)
                transport, _ = transport_of(second)
            finally:
                second.stop()
            strict = tb.run("agg", [sys.executable, "-m", "netreduce.switch", "--host",
                                    tb.aggregator.address, "--port", "4810", "--transport", "xdp",
                                    "--no-xdp-fallback"],
                            capture_output=True, text=True, timeout=60, env=env())
        finally:
            first.stop()
        bare = tb.popen("agg", ["setpriv", "--bounding-set=-all", "--inh-caps=-all",
                                sys.executable, "-m", "netreduce.switch", "--host",
                                tb.aggregator.address, "--port", "4820", "--transport", "xdp"],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env())
        try:
            bare_log = wait_line(bare, "listening on")
        finally:
            bare.kill()
            bare.wait()
    log = "\n".join(second.log)
    assert "--transport xdp: using kernel UDP sockets instead" in log, log
    assert "already attached on device eth0" in log, log
    assert "xdp fell back to kernel sockets" in log, log
    assert transport["transport"] == "udp" and "already attached" in transport["fallback"]
    assert all(r["n_wrong"] == 0 for r in results)
    assert strict.returncode == 2, (strict.stdout, strict.stderr)
    assert "already attached on device eth0" in strict.stderr, strict.stderr
    bare_text = "\n".join(bare_log)
    if "setpriv" in bare_text and "listening" not in bare_text:
        pytest.skip(f"setpriv cannot drop capabilities here: {bare_text}")
    assert "using kernel UDP sockets instead" in bare_text and "CAP_BPF" in bare_text, bare_text
    assert "device eth0" in bare_text, bare_text


FORGE = r"""
import json, socket, sys, time, uuid
from netreduce import _native
from netreduce.protocol.client import ControlClient
from tests.raw_register import data_socket, register
host, port = sys.argv[1], int(sys.argv[2])
with ControlClient((host, port)) as c:
    job = "xdp-forge-" + uuid.uuid4().hex[:6]
    s = data_socket(c)  # the rank's data address: the aggregator takes its packets from here
    grant = register(c, job, 0, 1, s)
    payload = bytes(64)
    fields = {"length": 64, "key": grant["key"], "dest_qp": grant["job_index"] << 12, "psn": 3,
              "udp_checksum": 1}
    s.sendto(_native.encode_header(fields) + payload + b"\xde\xad\xbe\xef",
             (host, grant["data_port"]))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        counters = c.call("counters")["jobs"][job]
        if counters["drop_bad_icrc"]:
            break
        time.sleep(0.05)
    print(json.dumps({"counters": counters, "transport": c.call("counters")["transport"]}))
"""


def test_xdp_path_checks_every_icrc_whatever_the_sender_says(native):
    """NETREDUCE_ICRC_CHECK=auto trusts only what a kernel socket verified: AF_XDP
    hands over frames no kernel checked, so a packet claiming a UDP checksum (BTH
    byte 8, 0x08) with a wrong ICRC is still dropped as bad_icrc there."""
    with Testbed(hosts=1, rate="10gbit", mtu=1500, name=xdp_name("f"),
                 subnet=scratch_subnet(), replace=True) as tb:
        switch = tb.spawn_switch(env=env(), args=["--transport", "xdp", "--payload-bytes", "1432"])
        try:
            # A rank of host 0 registers and forges its own packet, from its data address.
            out = tb.run(0, [sys.executable, "-c", FORGE, switch.address[0],
                             str(switch.address[1])], env=env(), check=True, capture_output=True, text=True,
                         cwd=REPO)
        finally:
            switch.stop()
    seen = last_json(out.stdout)
    counters, transport = seen["counters"], seen["transport"]
    assert transport["port_stats"][0]["rx_xsk"] > 0, transport  # it came through AF_XDP
    assert counters["drop_bad_icrc"] == 1 and counters["slots_completed"] == 0, counters
