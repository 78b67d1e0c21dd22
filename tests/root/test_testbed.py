"""The emulated testbed does what docs/testbed.md says: namespaces and links exist
with the asked MTU and shapers, the rate holds within 10 %, the loss rule drops about
the asked fraction, and nothing is left behind afterwards. Needs root; skipped with
the reason otherwise."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from netreduce.testbed import Testbed, TestbedError, leftovers, parse_rate, why_unusable
from tests.procs import collect_ok
from tests.root import scratch_subnet, scratch_testbed_name

REASON = why_unusable()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TOOLS = [sys.executable, os.path.join(HERE, "nettools.py")]
NAME_L, NAME_R, NAME_A, NAME_D, NAME_M, NAME_T, NAME_X, NAME_C, NAME_E = \
    map(scratch_testbed_name, "lradmtxce")
# Each test has its own name and /24 (scratch_subnet: never one this run took before) so
# that a failed test cannot collide with the next.


def make(name: str, **kw) -> Testbed:
    kw.setdefault("hosts", 2)
    kw.setdefault("rate", "200mbit")
    return Testbed(name=name, subnet=scratch_subnet(), replace=True, **kw)


def start_sink(tb: Testbed, node, argv) -> subprocess.Popen:
    proc = tb.popen(node, TOOLS + argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def result(proc: subprocess.Popen, timeout: float = 30.0) -> dict:
    return collect_ok([proc], timeout)[0]


def tcp_rate(tb: Testbed, src, dst, seconds: float = 1.5, port: int = 5301) -> float:
    addr = tb.node(dst).address
    sink = start_sink(tb, dst, ["tcp-sink", addr, str(port)])
    tb.run(src, TOOLS + ["tcp-source", addr, str(port), str(seconds)], check=True, timeout=30)
    return result(sink)["rate_bps"]


def ip_stat(tb: Testbed, node, field: str) -> int:
    """A counter from the node's /proc/net/snmp "Ip:" lines (per namespace)."""
    lines = [ln.split() for ln in tb.run(node, ["cat", "/proc/net/snmp"], capture_output=True,
                                         text=True).stdout.splitlines() if ln.startswith("Ip:")]
    return int(lines[1][lines[0].index(field)])


def test_layout_mtu_shapers_and_connectivity():
    with make(NAME_L, hosts=3, rate="300mbit") as tb:
        assert {n.netns for n in tb.plan.nodes} <= set(
            subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
        for node in tb.plan.nodes:
            link = tb.run(node, ["ip", "-o", "link", "show", "eth0"], capture_output=True, text=True).stdout
            assert "mtu 9000" in link and "state UP" in link, link
            addr = tb.run(node, ["ip", "-o", "-4", "addr", "show", "eth0"], capture_output=True, text=True).stdout
            assert f"{node.address}/24" in addr
            inner = tb.run(node, ["tc", "qdisc", "show", "dev", "eth0"], capture_output=True, text=True).stdout
            outer = subprocess.run(["tc", "qdisc", "show", "dev", node.peer], capture_output=True, text=True).stdout
            want = "900Mbit" if node.name == "agg" else "300Mbit"  # aggregator: hosts x rate
            assert "tbf" in inner and want in inner, inner
            assert "tbf" in outer and want in outer, outer
            # As on a cluster, the hostname resolves to the node's own address.
            hosts = tb.run(node, ["getent", "hosts", socket.gethostname(), "h0"],
                           capture_output=True, text=True).stdout
            assert hosts.split()[0] == node.address and tb.node(0).address in hosts, hosts

        # A 4 KiB RoCE-sized payload crosses as one frame (no IP fragmentation).
        sink = start_sink(tb, "agg", ["udp-sink", tb.aggregator.address, "5302", "3"])
        # One datagram first so that ARP is resolved before the counters are read.
        tb.run(0, TOOLS + ["udp-source", tb.aggregator.address, "5302", "1", "4200", "1000"], check=True)
        before = tb.counters()
        tb.run(0, TOOLS + ["udp-source", tb.aggregator.address, "5302", "10", "4200", "1000"], check=True)
        got = result(sink)
        after = tb.counters()
        assert got == {"datagrams": 11, "bytes": 11 * 4200}
        # Ten frames of payload + UDP 8 + IP 20 + Ethernet 14 bytes; the kernel may add
        # a few small ones of its own (ARP re-validation, IGMP reports).
        for node, key in (("h0", "tx"), ("agg", "rx")):
            frames = after[node][f"{key}_packets"] - before[node][f"{key}_packets"]
            extra = after[node][f"{key}_bytes"] - before[node][f"{key}_bytes"] - 10 * (4200 + 42)
            assert 10 <= frames <= 13 and 0 <= extra <= (frames - 10) * 100, (node, frames, extra)
        assert ip_stat(tb, 0, "FragCreates") == 0 and ip_stat(tb, "agg", "ReasmReqds") == 0


def test_host_link_rate_within_10_percent():
    rate = parse_rate("200mbit")
    with make(NAME_R, hosts=2, rate="200mbit") as tb:
        measured = tcp_rate(tb, 0, 1)
    # TCP goodput under MTU 9000 is 8948/9014 of the wire rate.
    assert 0.90 * rate <= measured <= 1.10 * rate, f"{measured / 1e6:.1f} Mbit/s for a 200mbit link"


def test_aggregator_link_carries_n_times_the_host_rate():
    rate = parse_rate("100mbit")
    with make(NAME_A, hosts=3, rate="100mbit") as tb:
        agg = tb.aggregator.address
        sinks = [start_sink(tb, "agg", ["tcp-sink", agg, str(5310 + i)]) for i in range(3)]
        sources = [tb.popen(i, TOOLS + ["tcp-source", agg, str(5310 + i), "1.5"]) for i in range(3)]
        for s in sources:
            assert s.wait(30) == 0
        rates = [result(s)["rate_bps"] for s in sinks]
    # Three hosts at full rate at once: the aggregator's 3x link is not the bottleneck
    # (if it were, each would get a third). +-20 %: three sinks and sources on a loaded
    # machine read 112.6 Mbit/s once in 31 (flakehunt2, load 18-21); the shaping's own
    # accuracy is test_host_link_rate_within_10_percent's (one pair).
    for r in rates:
        assert 0.80 * rate <= r <= 1.20 * rate, [f"{x / 1e6:.1f}" for x in rates]


def test_loss_rule_drops_about_the_asked_fraction():
    n, loss = 3000, 0.10
    with make(NAME_D, hosts=2, rate="1gbit", loss=loss) as tb:
        addr = tb.node(1).address
        sink = start_sink(tb, 1, ["udp-sink", addr, "5303", "0.5"])
        tb.run(0, TOOLS + ["udp-source", addr, "5303", str(n), "1000", "20000"], check=True, timeout=30)
        got = result(sink)["datagrams"]
        drops = tb.loss_drops()
        assert sum(tb.qdisc_drops().values()) == 0  # every loss is the rule's, none the queue's
    lost = n - got
    # Binomial(3000, 0.1): sd ~16 packets; +-60 is ~3.7 sd.
    assert abs(lost - n * loss) <= 60, f"lost {lost} of {n}, asked {loss:.0%}"
    assert drops["h1"] == lost and drops["h0"] == 0


def test_loss_can_be_changed_and_removed():
    with make(NAME_M, hosts=1, rate="1gbit", loss=0.5, loss_proto="udp") as tb:
        rules = tb.run(0, ["nft", "list", "ruleset"], capture_output=True, text=True).stdout
        assert "numgen random mod 1000000 < 500000" in rules and "udp" in rules
        tb.set_loss(0.0)
        assert "numgen" not in tb.run(0, ["nft", "list", "ruleset"], capture_output=True, text=True).stdout


def test_teardown_leaves_nothing_even_on_error():
    tb = make(NAME_T, hosts=2)
    with pytest.raises(RuntimeError, match="boom"):
        with tb:
            proc = tb.popen(0, ["sleep", "300"])
            raise RuntimeError("boom")
    assert proc.wait(10) is not None  # the process inside was ended
    assert leftovers(NAME_T) == []
    assert not os.path.exists(f"/run/netreduce-testbed/{NAME_T}.json")
    assert NAME_T not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def test_teardown_ends_a_process_still_on_its_way_into_a_namespace(tmp_path):
    # `ip netns exec NS CMD` opens NS, enters it, then execs CMD: started just before
    # teardown (the test above, under load), it may not be inside yet when teardown
    # looks, and it enters a moment later, after NS's name is gone, where it lives on.
    # A stand-in with exactly that command line, still outside (Python running the
    # script "netns"): teardown must end it as it ends the processes inside.
    (tmp_path / "netns").write_text("import time\ntime.sleep(120)\n")
    with make(NAME_E, hosts=1) as tb:
        entering = subprocess.Popen(["ip", "netns", "exec", tb.node(0).netns, "sleep", "120"],
                                    executable=sys.executable, cwd=tmp_path)
    try:
        assert entering.wait(10) is not None
    finally:
        entering.kill()
        entering.wait()
    assert leftovers(NAME_E) == []


def test_up_refuses_to_clobber_an_existing_testbed():
    with make(NAME_X, hosts=1):
        with pytest.raises(TestbedError, match="already exists"):
            Testbed(1, "100mbit", name=NAME_X, subnet=scratch_subnet()).up()
    assert leftovers(NAME_X) == []


def test_cli_up_run_status_down():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    cli = [sys.executable, "-m", "netreduce.testbed.cli", "--name", NAME_C]

    def call(*args):
        return subprocess.run(cli + list(args), capture_output=True, text=True, env=env, timeout=60)

    try:
        subnet = scratch_subnet()
        up = call("up", "--hosts", "2", "--rate", "100mbit", "--subnet", subnet, "--replace")
        assert up.returncode == 0, up.stderr
        assert "h1" in up.stdout and "200mbit" in up.stdout  # aggregator: 2 x 100mbit
        run = call("run", "--host", "1", "--", "ip", "-o", "-4", "addr", "show", "eth0")
        host1 = subnet.replace(".0/24", ".2/24")  # hosts from .1
        assert run.returncode == 0 and host1 in run.stdout, run.stderr
        assert call("run", "--host", "0", "--", "sh", "-c", "exit 3").returncode == 3
        bad = call("run", "--host", "7", "--", "true")
        assert bad.returncode == 2 and "no host" in bad.stderr
        status = call("status")
        assert status.returncode == 0 and "tx bytes" in status.stdout
    finally:
        down = call("down")
    assert down.returncode == 0, down.stderr
    assert leftovers(NAME_C) == []
    again = call("run", "--host", "0", "--", "true")
    assert again.returncode == 2 and "not up" in again.stderr
