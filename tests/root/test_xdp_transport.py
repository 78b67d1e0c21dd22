"""The AF_XDP transport on its own (native/transport/xdp): a host namespace of the
testbed sends plain kernel UDP datagrams to data ports in the aggregator namespace,
where the transport receives them through its XDP program and AF_XDP socket and
answers each one with frames it builds itself (Ethernet, IP, UDP, checksums); the
host's kernel checks every answer (a bad UDP checksum is dropped and counted). At
MTU 1500 and 9000 (multi-buffer frames), IPv4 and IPv6, datagrams of one byte up to
the MTU; a queue without a socket, an unresolved neighbour, and the refusals (no
privilege, another program attached) named. Needs root and the transport built."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from netreduce.testbed import Testbed, why_unusable
from tests.procs import collect_ok, last_json
from tests.root import scratch_subnet

REASON = why_unusable()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "xdp_worker.py")
PORT = 47910


def xdp_name(tag: str) -> str:
    """A testbed name of this run only, with this transport's prefix."""
    return f"xd{os.getpid() & 0xFFFFF:05x}{tag}"


@pytest.fixture(scope="module")
def native():
    try:
        from netreduce import _native
    except ImportError as exc:
        pytest.skip(f"netreduce._native is not built ({exc})")
    if "xdp" not in _native.build_info()["transports"]:
        pytest.skip("netreduce._native was built without the AF_XDP transport "
                    "(needs libxdp-dev, libbpf-dev and clang: scripts/install.sh)")
    return _native


def start_echo(tb, host: str, count: int, threads: int = 1) -> subprocess.Popen:
    p = tb.popen("agg", [sys.executable, WORKER, "echo", host, str(PORT), str(count),
                         "--threads", str(threads)],
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.strip() == "ready", (line, p.stderr.read() if p.poll() is not None else "")
    return p


def run_probe(tb, host: str, sizes, ports: int = 1, sources: int = 1) -> dict:
    proc = tb.run(0, [sys.executable, WORKER, "probe", host, str(PORT),
                      ",".join(map(str, sizes)), "--ports", str(ports), "--sources", str(sources)],
                  capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return last_json(proc.stdout)


def finish(p: subprocess.Popen) -> dict:
    return collect_ok([p], timeout=60)[0]


@pytest.fixture(scope="module", params=[1500, 9000], ids=["mtu1500", "mtu9000"])
def bed(request, native):
    with Testbed(hosts=1, rate="10gbit", mtu=request.param, ipv6=True,
                 name=xdp_name("m" if request.param == 1500 else "j"),
                 subnet=scratch_subnet(),
                 replace=True) as tb:
        yield tb


@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_datagrams_both_ways_through_af_xdp(bed, family):
    agg = bed.aggregator
    host = agg.address if family == "ipv4" else agg.address6
    room = bed.plan.mtu - (28 if family == "ipv4" else 48)  # the largest datagram one frame holds
    # One byte; around one receive buffer (3840 bytes less the headers) and one
    # transmit frame (4096); the MTU's largest.
    sizes = sorted({1, 17, 1000, room} | ({3790, 3800, 4050, 4060, 8000} if room > 4096 else set()))
    sources = 3
    echo = start_echo(bed, host, count=len(sizes) * sources)
    probe = run_probe(bed, host, sizes, sources=sources)
    done = finish(echo)
    assert probe["answered"] == probe["sent"] == len(sizes) * sources, probe
    assert probe["wrong"] == [] and probe["csum_errors"] == 0, probe
    info, stats = done["info"], done["stats"][0]
    # veth: native XDP, copy mode (the driver has no zero-copy), jumbo frames in
    # several buffers.
    assert info["mode"] == "native" and info["zero_copy"] is False, info
    assert info["multi_buffer"] is True, info
    assert "copy mode" in done["describe"][0], done["describe"]
    # Every datagram came through the AF_XDP socket; every answer but those sent
    # while the kernel's neighbour entry was unconfirmed left through it too.
    assert stats["rx_xsk"] == probe["sent"] and stats["rx_kernel"] == 0, stats
    assert done["program"]["steered"] == probe["sent"], done["program"]
    via_kernel = sum(v for k, v in stats.items() if k.startswith("tx_kernel"))
    assert stats["tx_xsk"] + via_kernel == probe["sent"] and stats["tx_xsk"] >= probe["sent"] - 2, stats
    assert stats["rx_malformed"] == 0 and stats["xsk_rx_dropped"] == 0, stats


def test_unresolved_neighbour_goes_through_the_kernel_then_af_xdp(bed):
    """The aggregator side has no neighbour entry for the host (the host knows the
    aggregator's MAC already, so it never ARPs): the first answers go through the
    kernel socket, whose send resolves the neighbour; the later ones through AF_XDP."""
    agg = bed.aggregator
    ns_mac = bed.run("agg", ["cat", f"/sys/class/net/{bed.ifname}/address"],
                     capture_output=True, text=True).stdout.strip()
    assert ns_mac
    bed.run(0, ["ip", "neigh", "replace", agg.address, "lladdr", ns_mac, "nud", "permanent",
                "dev", bed.ifname], check=True)
    bed.run("agg", ["ip", "neigh", "flush", "dev", bed.ifname], check=True)
    try:
        echo = start_echo(bed, agg.address, count=40)
        first = run_probe(bed, agg.address, [100, 200, 300, 400], sources=5)
        second = run_probe(bed, agg.address, [100, 200, 300, 400], sources=5)
        done = finish(echo)
    finally:
        bed.run(0, ["ip", "neigh", "del", agg.address, "dev", bed.ifname])
    assert first["answered"] == first["sent"] == 20 and second["answered"] == 20, (first, second)
    stats = done["stats"][0]
    assert stats["tx_kernel_unresolved"] >= 1, stats
    assert stats["tx_xsk"] >= 20, stats  # the second round, at least, all through AF_XDP


def test_queue_without_a_socket_is_served_by_the_kernel_socket(bed):
    """Two data ports on a one-queue veth: port PORT's frames are steered into queue 0's
    socket; port PORT+1 has no queue of its own, so the program passes its frames to
    the kernel and that port's socket answers them. Nothing is lost or misrouted."""
    agg = bed.aggregator
    sizes = [64, 1000]
    echo = start_echo(bed, agg.address, count=2 * len(sizes) * 2, threads=2)
    probe = run_probe(bed, agg.address, sizes, ports=2, sources=2)
    done = finish(echo)
    assert probe["answered"] == probe["sent"] == 8 and probe["wrong"] == [], probe
    assert "kernel UDP socket" == done["describe"][1], done["describe"]
    assert any(f"data port {PORT + 1}" in n for n in done["info"]["notes"]), done["info"]
    assert done["stats"][0]["rx_xsk"] == 4, done["stats"]
    assert done["program"]["passed_other_queue"] == 4, done["program"]


def test_refused_while_another_program_is_attached(bed):
    agg = bed.aggregator
    holder = start_echo(bed, agg.address, count=1)
    try:
        proc = bed.run("agg", [sys.executable, WORKER, "open", agg.address, str(PORT + 10)],
                       capture_output=True, text=True, timeout=60)
        second = last_json(proc.stdout)
    finally:
        run_probe(bed, agg.address, [10])
        finish(holder)
    assert second["error"] == "RefusedError", second
    assert "already attached on device eth0" in second["message"], second
    # Once the first is gone, so is its program (a BPF link dies with its process).
    proc = bed.run("agg", [sys.executable, WORKER, "open", agg.address, str(PORT + 10)],
                   capture_output=True, text=True, timeout=60)
    assert "error" not in last_json(proc.stdout), proc.stdout


def test_refused_without_privilege(bed):
    """Root without capabilities (setpriv drops them all): a RefusedError that names
    the device and the capabilities, not a crash."""
    agg = bed.aggregator
    proc = bed.run("agg", ["setpriv", "--bounding-set=-all", "--inh-caps=-all", sys.executable,
                           WORKER, "open", agg.address, str(PORT)],
                   capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 and "setpriv" in proc.stderr:
        pytest.skip(f"setpriv cannot drop capabilities here: {proc.stderr.strip()}")
    out = last_json(proc.stdout)
    assert out["error"] == "RefusedError", out
    assert "device eth0" in out["message"] and "CAP_BPF" in out["message"], out
