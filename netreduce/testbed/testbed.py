"""An emulated cluster on one Linux machine: N host namespaces and one aggregator
namespace on a bridge, with shaped links and optional random loss.

    with Testbed(hosts=4, rate="1gbit", loss=0.01) as tb:
        sw = tb.spawn_switch()
        procs = [tb.popen(i, ["python", "worker.py"]) for i in range(4)]
        ...
        print(tb.counters())          # wire bytes per node, from the veth counters

What is real and what is not (docs/testbed.md says more):
- Bandwidth: `tc tbf` on *both* ends of every veth pair, so each direction of a
  node's link is shaped to its rate (a namespace's egress = the host's upload, the
  root-side peer's egress = the host's download). The aggregator's link is
  hosts x rate, like a switch's aggregate capacity.
- Loss: an nftables rule on each namespace's *input* hook drops a random fraction of
  the IP packets arriving over the emulated link (after reassembly: one lost
  datagram, not one lost fragment). Dropping on output would make the sender's
  send() fail with EPERM instead of a silent loss.
- No propagation delay (this kernel has no netem); queueing delay behind the
  shaper is real, up to `queue_ms`.
Every byte still crosses the same two CPUs: the shaper makes the network the
bottleneck only while the processes themselves are not CPU-bound."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

from netreduce.process import terminate
from netreduce.testbed import proc_stat, sh
from netreduce.testbed.plan import (NS_IFNAME, Node, Plan, TestbedError, format_rate, make_plan,
                                    tbf_burst_bytes, tbf_limit_bytes)

STATE_DIR = "/run/netreduce-testbed"
# `ip netns exec NS` bind-mounts every file of /etc/netns/NS/ over /etc/ (ip-netns(8)).
ETC_NETNS = "/etc/netns"
LOSS_TABLE = "nrtb_loss"
# IP fragment reassembly memory per namespace. The data plane's default ~60 KiB
# datagrams are cut into 7 fragments at MTU 9000; the kernel default (4 MiB) would
# drop whole datagrams when a window of them arrives at once.
IPFRAG_HIGH_THRESH = 64 << 20
IPFRAG_LOW_THRESH = 48 << 20


def _owned(name: str, item: str) -> bool:
    return re.fullmatch(rf"{re.escape(name)}-(h\d+|agg|br)", item) is not None


def _kill_pids(pids: Sequence[int], grace_s: float = 3.0) -> None:
    """Terminate processes still running inside our namespaces (all started by us)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if proc_stat.alive(p)]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def teardown(name: str) -> List[str]:
    """Remove everything testbed `name` may have left: processes in its namespaces,
    the namespaces (their veth ends go with them), the root-side links and bridge,
    and the state file. Works from the names alone, so it also cleans up after a
    crashed `up`. Returns what it removed."""
    removed = []
    namespaces = [ns for ns in sh.list_netns() if _owned(name, ns)]
    ids = sh.netns_ids(namespaces)
    killed: set = set()

    def end_members() -> bool:
        pids = sorted(sh.netns_members(namespaces, ids) - killed)
        if pids:
            _kill_pids(pids)
            killed.update(pids)
            removed.extend(f"pid {p}" for p in pids)
        return bool(pids)

    end_members()
    for ns in namespaces:
        sh.run(["ip", "netns", "del", ns], check=False)
        removed.append(f"netns {ns}")
    # A process that had opened a namespace but not yet entered it when the first
    # look ran is inside it now (its name gone): look again until a look finds none.
    for _ in range(20):
        if not end_members():
            break
    # Deleting a namespace destroys its veth end and thereby the pair, but the
    # kernel does that asynchronously; delete any root-side end still listed.
    for link in sh.list_links():
        if _owned(name, link):
            sh.ip("link", "del", link, check=False)
            removed.append(f"link {link}")
    etc = os.path.join(ETC_NETNS, "")
    if os.path.isdir(ETC_NETNS):
        for entry in sorted(os.listdir(ETC_NETNS)):
            if _owned(name, entry):
                shutil.rmtree(etc + entry, ignore_errors=True)
                removed.append(f"{etc}{entry}")
        try:
            os.rmdir(ETC_NETNS)  # only if empty, i.e. nobody else uses it
        except OSError:
            pass
    try:
        os.unlink(os.path.join(STATE_DIR, f"{name}.json"))
        removed.append("state file")
    except FileNotFoundError:
        pass
    return removed


def leftovers(name: str) -> List[str]:
    """Namespaces and links of testbed `name` that still exist."""
    etc = [e for e in os.listdir(ETC_NETNS) if _owned(name, e)] if os.path.isdir(ETC_NETNS) else []
    return ([f"netns {ns}" for ns in sh.list_netns() if _owned(name, ns)]
            + [f"link {ln}" for ln in sh.list_links() if _owned(name, ln)]
            + [f"{ETC_NETNS}/{e}" for e in etc])


class SwitchHandle:
    """A `netreduce-switch` running inside the aggregator namespace."""

    def __init__(self, proc: subprocess.Popen, address):
        self.proc = proc
        self.address = address          # (host, port) for netreduce.worker.dataplane.connect
        self.pid = proc.pid             # `ip netns exec` execs the daemon: same pid
        self.log: List[str] = []
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.log.append(line.rstrip("\n"))

    def cpu_seconds(self) -> float:
        return proc_stat.cpu_seconds(self.pid)

    def stop(self, timeout: float = 5.0) -> None:
        terminate(self.proc, timeout)


class Testbed:
    """Build with up() (or `with`), use run()/popen()/spawn_switch(), read counters(),
    destroy with down(). Construct from parameters, or attach() to one that
    `netreduce-testbed up` left running."""

    __test__ = False  # not a pytest class, whatever a test module imports

    def __init__(self, hosts: int = 4, rate="1gbit", *, name: str = "nrtb",
                 subnet: str = "10.77.0.0/24", aggregator_rate=None, mtu: int = 9000,
                 queue_ms: float = 50.0, loss: float = 0.0, loss_proto: str = "all",
                 replace: bool = False, plan: Optional[Plan] = None, ipv6: bool = False):
        self.plan = plan or make_plan(hosts, rate, name=name, subnet=subnet,
                                      aggregator_rate=aggregator_rate, mtu=mtu,
                                      queue_ms=queue_ms, loss=loss, loss_proto=loss_proto,
                                      ipv6=ipv6)
        self.replace = replace
        self.is_up = False
        self._old_sigterm = None

    # -- shape ---------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def hosts(self) -> List[Node]:
        return self.plan.hosts

    @property
    def aggregator(self) -> Node:
        return self.plan.aggregator

    @property
    def ifname(self) -> str:
        return NS_IFNAME

    def node(self, which) -> Node:
        return self.plan.node(which)

    @classmethod
    def attach(cls, name: str = "nrtb") -> "Testbed":
        """The testbed `netreduce-testbed up --name NAME` created."""
        path = os.path.join(STATE_DIR, f"{name}.json")
        try:
            with open(path) as f:
                plan = Plan.from_dict(json.load(f))
        except FileNotFoundError:
            raise TestbedError(f"testbed {name!r} is not up (no {path}); "
                               f"start it with `netreduce-testbed up --name {name} ...`") from None
        tb = cls(plan=plan)
        tb.is_up = True
        return tb

    def describe(self) -> str:
        p = self.plan
        lines = [f"testbed {p.name}: {len(p.hosts)} hosts + aggregator on bridge {p.bridge} "
                 f"({p.bridge_address}/{p.prefixlen}), MTU {p.mtu}, queue {p.queue_ms:g} ms, "
                 f"loss {p.loss:g} ({p.loss_proto}) on each namespace's input"]
        for n in p.nodes:
            lines.append(f"  {n.name:>4}  netns {n.netns:<12} {n.address:<15} "
                         f"{format_rate(n.rate_bps):>8} each way  (root-side veth {n.peer})"
                         + (f"  {n.address6}" if n.address6 else ""))
        return "\n".join(lines)

    # -- life cycle ----------------------------------------------------------
    def up(self) -> "Testbed":
        sh.require_usable()
        existing = leftovers(self.name)
        if existing:
            if not self.replace:
                raise TestbedError(
                    f"testbed {self.name!r} already exists ({', '.join(existing[:4])}...); "
                    f"tear it down with `netreduce-testbed down --name {self.name}` or pass replace=True")
            teardown(self.name)
        try:
            self._build()
        except BaseException:
            teardown(self.name)
            raise
        self.is_up = True
        os.makedirs(STATE_DIR, exist_ok=True)
        with open(os.path.join(STATE_DIR, f"{self.name}.json"), "w") as f:
            json.dump(self.plan.to_dict(), f, indent=1)
        return self

    def down(self) -> List[str]:
        self.is_up = False
        return teardown(self.name)

    def __enter__(self) -> "Testbed":
        # Ctrl-C raises KeyboardInterrupt already; make SIGTERM unwind the same way so
        # that __exit__ tears everything down.
        if threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.signal(signal.SIGTERM, _raise_on_sigterm)
        try:
            return self.up()
        except BaseException:
            self._restore_signal()
            raise

    def __exit__(self, *exc) -> None:
        try:
            self.down()
        finally:
            self._restore_signal()

    def _restore_signal(self) -> None:
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    def _build(self) -> None:
        p = self.plan
        sh.ip("link", "add", "name", p.bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0")
        _disable_ipv6_root(p.bridge)
        for node in p.nodes:
            sh.ip("netns", "add", node.netns)
            sh.ip("link", "add", node.peer, "mtu", str(p.mtu), "type", "veth",
                  "peer", "name", NS_IFNAME, "mtu", str(p.mtu), "netns", node.netns)
            _disable_ipv6_root(node.peer)
            sh.ip("link", "set", node.peer, "master", p.bridge)
            sh.ip("link", "set", node.peer, "up")
            no6 = "0" if p.subnet6 else "1"  # IPv6 only where the plan gives addresses
            sh.run(["ip", "netns", "exec", node.netns, "sysctl", "-q", "-w",
                    f"net.ipv6.conf.all.disable_ipv6={no6}",
                    f"net.ipv6.conf.default.disable_ipv6={no6}",
                    f"net.ipv4.ipfrag_high_thresh={IPFRAG_HIGH_THRESH}",
                    f"net.ipv4.ipfrag_low_thresh={IPFRAG_LOW_THRESH}"])
            sh.ip("link", "set", "lo", "up", netns=node.netns)
            sh.ip("addr", "add", f"{node.address}/{p.prefixlen}", "dev", NS_IFNAME, netns=node.netns)
            if node.address6:  # nodad: usable at once, no duplicate detection to wait for
                sh.ip("addr", "add", f"{node.address6}/64", "dev", NS_IFNAME, "nodad",
                      netns=node.netns)
            sh.ip("link", "set", NS_IFNAME, "up", netns=node.netns)
            self._shape(node)
            self._write_hosts(node)
        # The bridge takes the smallest MTU of its ports unless told; set it last.
        sh.ip("link", "set", p.bridge, "mtu", str(p.mtu))
        sh.ip("addr", "add", f"{p.bridge_address}/{p.prefixlen}", "dev", p.bridge)
        sh.ip("link", "set", p.bridge, "up")
        self.set_loss(p.loss, p.loss_proto)

    def _write_hosts(self, node: Node) -> None:
        """Give each namespace its own /etc/hosts, as each machine of a cluster has: the
        machine's hostname resolves to the node's own testbed address (not 127.0.x.1),
        and every node is reachable by name (h0, nrtb-h0, agg, ...). Tools that find
        their own address from the hostname need this; Horovod 0.28.1's process-set
        Gloo context, for one, ignores HOROVOD_GLOO_IFACE and uses the hostname."""
        lines = ["127.0.0.1\tlocalhost",
                 f"{node.address}\t{socket.gethostname()}"]
        lines += [f"{n.address}\t{n.netns} {n.name}" for n in self.plan.nodes]
        lines.append(f"{self.plan.bridge_address}\t{self.plan.bridge}")
        folder = os.path.join(ETC_NETNS, node.netns)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "hosts"), "w") as f:
            f.write("\n".join(lines) + "\n")

    def _shape(self, node: Node) -> None:
        """tbf on both ends: the namespace side shapes what the node sends, the
        root-side peer shapes what the bridge delivers to it."""
        p = self.plan
        args = ["qdisc", "replace", "dev", None, "root", "tbf",
                "rate", f"{node.rate_bps}bit",
                "burst", str(tbf_burst_bytes(node.rate_bps, p.mtu)),
                "limit", str(tbf_limit_bytes(node.rate_bps, p.queue_ms, p.mtu))]
        try:
            sh.tc(*[NS_IFNAME if a is None else a for a in args], netns=node.netns)
            sh.tc(*[node.peer if a is None else a for a in args])
        except TestbedError as exc:
            raise TestbedError(f"{exc} (is the sch_tbf kernel module available?)") from None

    def set_loss(self, loss: float, proto: str = "all") -> None:
        """Drop `loss` of the IP packets each namespace receives over its link
        (0 removes the rule). Applies to the aggregator and every host."""
        if not 0.0 <= loss < 1.0:
            raise TestbedError(f"loss is a fraction in [0, 1), got {loss}")
        if proto not in ("all", "udp", "tcp"):
            raise TestbedError(f"loss proto must be all, udp or tcp, got {proto!r}")
        self.plan = _replace(self.plan, loss=float(loss), loss_proto=proto)
        match = "" if proto == "all" else f"meta l4proto {proto} "
        # numgen random draws uniformly in [0, 2^32); compare against the fraction
        # scaled to one million (resolution 1e-6).
        threshold = int(round(loss * 1_000_000))
        for node in self.plan.nodes:
            script = [f"table inet {LOSS_TABLE}", f"delete table inet {LOSS_TABLE}"]
            if threshold > 0:
                script += [
                    f"table inet {LOSS_TABLE} {{",
                    "  chain input {",
                    "    type filter hook input priority 0; policy accept;",
                    f'    iifname "{NS_IFNAME}" {match}numgen random mod 1000000 < {threshold} counter drop',
                    "  }",
                    "}"]
            try:
                sh.nft("\n".join(script) + "\n", netns=node.netns)
            except TestbedError as exc:
                raise TestbedError(f"{exc} (nftables with numgen support is needed for --loss)") from None

    # -- use -----------------------------------------------------------------
    def exec_argv(self, which, argv: Sequence[str]) -> List[str]:
        """argv that runs `argv` inside node `which`'s namespace (pid is kept:
        `ip netns exec` execs the command)."""
        return ["ip", "netns", "exec", self.node(which).netns, *argv]

    def popen(self, which, argv: Sequence[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self.exec_argv(which, argv), **kw)

    def run(self, which, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.exec_argv(which, argv), **kw)

    def spawn_switch(self, port: int = 4791, args: Sequence[str] = (), env: Optional[dict] = None,
                     timeout: float = 30.0, node: Optional[Node] = None,
                     host: Optional[str] = None) -> SwitchHandle:
        """Start `python -m netreduce.switch` in the aggregator namespace (or `node`'s),
        bound to its address (or `host`), and wait until it says it listens (the
        handle's log ends with that line). The daemon runs with its own
        defaults (each job's payload follows its path's MTU, with the slots to keep
        the same bytes in flight: 1462 x 1432 B at MTU 1500) unless `args` says
        otherwise, and admits jobs without a secret (--allow-open-jobs;
        --require-secret in `args` instead)."""
        agg = node or self.aggregator
        args = list(args)
        # The testbed's bridge joins namespaces of this host only: a trusted network,
        # whose ranks bring no secret unless a test gives them one (and says so here).
        if "--require-secret" not in args:
            args.append("--allow-open-jobs")
        argv = [sys.executable, "-m", "netreduce.switch", "--host", host or agg.address,
                "--port", str(port), *args]
        proc = self.popen(agg, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=env)
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line.rstrip())
            m = re.search(r"listening on (\S+):(\d+)", line)
            if m:
                handle = SwitchHandle(proc, (m.group(1).strip("[]"), int(m.group(2))))  # [IPv6]
                handle.log.extend(seen)
                return handle
        proc.kill()
        proc.wait()
        raise TestbedError(f"netreduce-switch in {agg.netns} ({host or agg.address}:{port}) did not report "
                           f"'listening on' within {timeout:.0f} s; it printed: {' | '.join(seen[-10:])}")

    def counters(self) -> Dict[str, Dict[str, int]]:
        """Wire counters of every node's link, from the node's point of view:
        tx = what it sent onto its link, rx = what the link delivered to it.
        Read from the root-side veth (its rx is the node's tx). Bytes are L2 frame
        bytes as the kernel counts them (Ethernet + IP + UDP/TCP headers + payload)."""
        out = {}
        for node in self.plan.nodes:
            base = f"/sys/class/net/{node.peer}/statistics/"
            vals = {}
            for ours, theirs in (("tx_bytes", "rx_bytes"), ("rx_bytes", "tx_bytes"),
                                 ("tx_packets", "rx_packets"), ("rx_packets", "tx_packets")):
                with open(base + theirs) as f:
                    vals[ours] = int(f.read())
            out[node.name] = vals
        return out

    def loss_drops(self) -> Dict[str, int]:
        """Packets each node's loss rule has dropped so far."""
        out = {}
        for node in self.plan.nodes:
            proc = sh.run(["ip", "netns", "exec", node.netns, "nft", "list", "table", "inet",
                           LOSS_TABLE], check=False)
            m = re.search(r"counter packets (\d+)", proc.stdout)
            out[node.name] = int(m.group(1)) if m else 0
        return out

    def qdisc_drops(self) -> Dict[str, int]:
        """Packets the shapers dropped because their queue (queue_ms) was full, per
        node, both directions summed."""
        out = {}
        for node in self.plan.nodes:
            total = 0
            for argv in (["tc", "-n", node.netns, "-s", "qdisc", "show", "dev", NS_IFNAME],
                         ["tc", "-s", "qdisc", "show", "dev", node.peer]):
                m = re.search(r"dropped (\d+)", sh.run(argv, check=False).stdout)
                total += int(m.group(1)) if m else 0
            out[node.name] = total
        return out


def _replace(plan: Plan, **changes) -> Plan:
    import dataclasses
    return dataclasses.replace(plan, **changes)


def _disable_ipv6_root(ifname: str) -> None:
    """No IPv6 on our root-side links: router solicitations and MLD reports would
    otherwise show up in the wire counters."""
    path = f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6"
    if os.path.exists(path):
        with open(path, "w") as f:
            f.write("1")


def _raise_on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")
