#!/usr/bin/env python3
"""Line rate per core (issue 19): what one all-reduce byte costs the aggregator and
the engine in CPU, beside what the kernel itself needs to move the same bytes over
the same veth, and how many cores a 100 Gbit/s port would take.

    # the aggregator's and the engines' CPU per GB at MTU 1500 and 9000 (root)
    PYTHONPATH=. python3 benchmarks/linerate.py cost --mtu 1500,9000 --np 2 \\
        --json benchmarks/results/linerate_cost.json
    # the kernel's floor on the same veth: iperf3 UDP at the data plane's datagram
    # sizes, TCP with its offloads, a UDP GSO/GRO probe
    PYTHONPATH=. python3 benchmarks/linerate.py floor --mtu 1500,9000 \\
        --json benchmarks/results/linerate_floor.json

`cost`: N ranks, each in its own network namespace on a bridge (netreduce.testbed,
shapers removed: nothing limits the rate but the CPUs), one netreduce-switch in the
aggregator's namespace with the daemon's defaults (payload from the path MTU). Each
rank all-reduces S bytes of float32 once to warm up, then --iters times; rank 0 reads
the aggregator's utime+stime (/proc/PID/stat, all threads) around the timed
iterations, every rank its own. Reported: GB of worker input (N x S x iters, the
bytes the ranks hand the aggregator) per aggregator CPU-second, the engine's CPU
seconds per GB of its own buffer, and the whole machine's busy CPU-seconds over the
same window (/proc/stat; includes the softirq work that veth does in whichever
process sent the packet, and anything else running). --variant runs each point once
per named environment (e.g. offload on and off) in alternation, so that ratios come
from the same run.

`floor`: iperf3 between two of the same testbed's namespaces (client in h0, server
in the aggregator's), UDP at the netreduce datagram size for the MTU (1468 B at 1500,
8972 B at 9000) with no rate limit, then TCP; the server's and the client's CPU
(/proc) per GB moved. A Python probe adds UDP_SEGMENT sends and UDP_GRO receives of
the same datagrams (the issue's probe).

Timings depend on a quiet machine: every record carries the load average.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
if REPO not in sys.path:  # last: a PYTHONPATH naming another tree (an old build) wins
    sys.path.append(REPO)

import common  # noqa: E402

ROCE_OVERHEAD = 32 + 4  # BTH + RETH + ImmDt, ICRC (docs/protocol.md)


def datagram_bytes(mtu: int) -> int:
    """The UDP payload of a full netreduce packet at `mtu` (IPv4): header + the
    largest multiple-of-8 payload that fits + ICRC."""
    payload = (mtu - 20 - 8 - ROCE_OVERHEAD) // 8 * 8
    return payload + ROCE_OVERHEAD


def thread_cpu(pid: int) -> Dict[str, float]:
    """utime+stime per thread name of process `pid` (threads of one name summed): the
    aggregator's data threads are nr-data-N, an engine's nr-engine."""
    out: Dict[str, float] = {}
    tick = common.proc_stat.TICKS
    for stat in common.proc_stat.threads(pid):
        name, tid = stat.comm, stat.pid
        out[name] = out.get(name, 0.0) + stat.cpu_seconds
        # user and system time apart: the data path's own code against the kernel's
        out[name + ":user"] = out.get(name + ":user", 0.0) + stat.utime / tick
        # how often the thread slept and was woken (each wake-up is a schedule and a poll)
        try:
            sw = common.proc_stat.ctx_switches(pid, tid)[0]
            out[name + ":sleeps"] = out.get(name + ":sleeps", 0.0) + sw
        except OSError:
            pass
    return out


def diff(after: Dict[str, float], before: Dict[str, float]) -> Dict[str, float]:
    return {k: round(v - before.get(k, 0.0), 3) for k, v in after.items()}


# =============================================================================
# Rank side (cost): one process per rank inside its namespace.
# =============================================================================
def rank_main(cfg: dict) -> int:
    import numpy as np
    from netreduce.worker import dataplane
    rank, n = cfg["rank"], cfg["np"]
    count = cfg["size"] // 4
    conn = dataplane.connect(tuple(cfg["switch"]), job=cfg["job"], rank=rank, size=n,
                             timeout=cfg["timeout"])
    src = np.full(count, float(rank + 1), dtype=np.float32)
    dst = np.empty_like(src)
    want = float(n * (n + 1) // 2)
    ok = True
    for _ in range(2):  # warm-up; the second one lines the ranks up
        conn.allreduce(src, dst)
        ok &= bool((dst == want).all())
    stats0 = conn.stats()
    if rank == 0:
        agg0 = common.pid_cpu_seconds(cfg["switch_pid"])
        threads0 = thread_cpu(cfg["switch_pid"])
        m0 = common.machine_cpu()
    own0 = thread_cpu(os.getpid())
    c0 = common.self_cpu_seconds()
    t0 = time.perf_counter()
    for _ in range(cfg["iters"]):
        conn.allreduce(src, dst)
    wall = time.perf_counter() - t0
    cpu = common.self_cpu_seconds() - c0
    rec = {"rank": rank, "wall_s": wall, "cpu_s": cpu, "threads_cpu_s": diff(thread_cpu(os.getpid()), own0)}
    if rank == 0:
        rec["switch_cpu_s"] = common.pid_cpu_seconds(cfg["switch_pid"]) - agg0
        rec["switch_threads_cpu_s"] = diff(thread_cpu(cfg["switch_pid"]), threads0)
        m1 = common.machine_cpu()
        rec["machine_busy"] = common.machine_busy_fraction(m0, m1)
        rec["machine_cpu_s"] = rec["machine_busy"] * wall * (os.cpu_count() or 1)
    ok &= bool((dst == want).all())
    stats1 = conn.stats()
    rec["ok"] = ok
    rec["payload_bytes"] = conn.payload_bytes
    rec["stats"] = {k: stats1.get(k, 0) - stats0.get(k, 0) for k in stats1
                    if isinstance(stats1.get(k), int)}
    rec["stats_end"] = stats1  # gauges (srtt_us, rto_us) as they stand at the end
    print("RESULT " + json.dumps(rec), flush=True)
    conn.close()
    return 0 if ok else 1


def unshape(tb) -> None:
    """Remove the testbed's rate shapers: veth then runs without a qdisc (its default),
    so only the CPUs limit the rate."""
    for node in tb.plan.nodes:
        subprocess.run(["tc", "-n", node.netns, "qdisc", "del", "dev", tb.ifname, "root"],
                       capture_output=True)
        subprocess.run(["tc", "qdisc", "del", "dev", node.peer, "root"], capture_output=True)


def parse_variants(specs: List[str]) -> List[tuple]:
    """'name:K=V,K2=V2' -> (name, {K: V, ...}); none given -> one default variant."""
    out = []
    for spec in specs or ["default:"]:
        name, _, rest = spec.partition(":")
        env = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
        out.append((name, env))
    return out


def _gb(v: Optional[float]) -> str:
    # None: the aggregator used less than one clock tick (/proc counts in 10 ms), as a
    # tiny --size does; the record keeps None rather than a made-up rate.
    return "n/a (under a tick)" if v is None else f"{v:.3f}"


def cost_point(tb, args, mtu: int, variant: str, env_extra: Dict[str, str]) -> dict:
    # PYTHONSAFEPATH: `python -m netreduce.switch` must not import the checkout it is
    # started from ahead of PYTHONPATH (which may name an older build to compare with).
    env = dict(os.environ, PYTHONSAFEPATH="1", **env_extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), REPO) if p)
    switch_args = ["--threads", str(args.threads), "--payload-bytes", "65464"] + args.switch_args.split()
    switch_env = dict(env, **dict(kv.split("=", 1) for kv in args.switch_env.split(",") if kv))
    sw = tb.spawn_switch(args=switch_args, env=switch_env)
    tmp = tempfile.mkdtemp(prefix="lr-cost-")
    try:
        cfg = {"np": args.np, "size": common.parse_size(args.size), "iters": args.iters,
               "switch": list(sw.address), "switch_pid": sw.pid, "timeout": 120.0,
               "job": f"lr-{uuid.uuid4().hex[:8]}"}
        procs = []
        for r in range(args.np):
            path = os.path.join(tmp, f"cfg{r}.json")
            with open(path, "w") as f:
                json.dump(dict(cfg, rank=r), f)
            drop = common.NO_NET_ADMIN if args.ranks_without_net_admin else []
            procs.append(tb.popen(r, drop + [sys.executable, os.path.abspath(__file__), "--rank",
                                             path], env=env, stdout=subprocess.PIPE, text=True))
        recs = []
        for r, p in enumerate(procs):
            out, _ = p.communicate(timeout=args.timeout)
            line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
            if p.returncode != 0 or line is None:
                raise RuntimeError(f"rank {r} failed (exit {p.returncode}): {out[-2000:]}")
            recs.append(json.loads(line[len("RESULT "):]))
    finally:
        sw.stop()
        subprocess.run(["rm", "-rf", tmp])
    r0 = next(r for r in recs if r["rank"] == 0)
    size = cfg["size"]
    input_gb = args.np * size * args.iters / 1e9
    wall = max(r["wall_s"] for r in recs)
    engine_cpu = sum(r["cpu_s"] for r in recs) / len(recs)
    rec = {
        "variant": variant, "env": env_extra, "mtu": mtu, "np": args.np, "size": size,
        "iters": args.iters, "threads": args.threads, "payload_bytes": r0["payload_bytes"],
        "wall_s": wall, "time_per_allreduce_s": wall / args.iters,
        "switch_cpu_s": r0["switch_cpu_s"],
        "switch_threads_cpu_s": r0["switch_threads_cpu_s"],
        "engine_threads_cpu_s": [r["threads_cpu_s"] for r in recs],
        "aggregator_GB_per_cpu_s": input_gb / r0["switch_cpu_s"] if r0["switch_cpu_s"] else None,
        "aggregator_cpu_s_per_GB": r0["switch_cpu_s"] / input_gb,
        "engine_cpu_s_mean": engine_cpu,
        "engine_cpu_s_per_GB": engine_cpu / (size * args.iters / 1e9),
        "machine_cpu_s": r0["machine_cpu_s"],
        "machine_cpu_s_per_GB": r0["machine_cpu_s"] / input_gb,
        "correct": all(r["ok"] for r in recs),
        "retransmits": sum(r["stats"].get("retransmits", 0) + r["stats"].get("fast_retransmits", 0)
                           + r["stats"].get("timeout_probes", 0) for r in recs),
        "packets_sent": sum(r["stats"].get("packets_sent", 0) for r in recs),
        "rank_stats": [r["stats"] for r in recs],  # each rank's engine counters over the run
        "rank_stats_end": [r.get("stats_end", {}) for r in recs],
        "loadavg": os.getloadavg(),
    }
    print(f"  [{variant} MTU {mtu} N={args.np} T={args.threads}] payload {rec['payload_bytes']} B  "
          f"{rec['time_per_allreduce_s'] * 1e3:8.1f} ms/allreduce  aggregator "
          f"{_gb(rec['aggregator_GB_per_cpu_s'])} GB/cpu-s  engine {rec['engine_cpu_s_per_GB']:.3f} "
          f"cpu-s/GB  machine {rec['machine_cpu_s_per_GB']:.3f} cpu-s/GB  resends {rec['retransmits']}  "
          f"load {rec['loadavg'][0]:.2f}{'' if rec['correct'] else '  WRONG RESULT'}\n"
          f"      aggregator threads {rec['switch_threads_cpu_s']}  rank 0 {rec['engine_threads_cpu_s'][0]}",
          file=sys.stderr, flush=True)
    return rec


def cost_main(args) -> int:
    from netreduce.testbed import Testbed
    records = []
    variants = parse_variants(args.variant)
    for mtu in [int(m) for m in args.mtu.split(",")]:
        with Testbed(hosts=args.np, rate="10gbit", mtu=mtu, name=args.testbed_name,
                     subnet=args.subnet, replace=True) as tb:
            unshape(tb)
            for rep in range(args.repeats):
                # The order turns each round, so that neither variant always runs first.
                for name, env in (variants if rep % 2 == 0 else variants[::-1]):
                    try:
                        rec = cost_point(tb, args, mtu, name, env)
                        rec["repeat"] = rep
                        records.append(rec)
                    except Exception as exc:  # keep the others
                        print(f"# FAILED {name} MTU {mtu}: {exc}", file=sys.stderr, flush=True)
                        records.append({"variant": name, "mtu": mtu, "repeat": rep, "error": str(exc)})
    return records


# =============================================================================
# Kernel floor: iperf3 and a UDP GSO/GRO probe between h0 and the aggregator.
# =============================================================================
UDP_SEGMENT = 103
UDP_GRO = 104


def probe_main(argv: List[str]) -> int:
    """`--probe send HOST PORT DGRAM SECONDS GSO` / `--probe recv PORT DGRAM GRO`:
    one UDP flow, plain or with UDP_SEGMENT/UDP_GRO (64 KiB per call)."""
    mode = argv[0]
    if mode == "recv":
        port, dgram, gro = int(argv[1]), int(argv[2]), argv[3] == "1"
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
        if gro:
            s.setsockopt(socket.IPPROTO_UDP, UDP_GRO, 1)
        s.bind(("0.0.0.0", port))
        s.settimeout(3.0)
        buf = bytearray(65536)
        total = 0
        first = None
        last = time.perf_counter()
        c0 = common.self_cpu_seconds()
        print("READY", flush=True)
        try:
            while True:
                n = s.recv_into(buf)
                if first is None:
                    first = time.perf_counter()
                    c0 = common.self_cpu_seconds()
                total += n
                last = time.perf_counter()
        except socket.timeout:
            pass
        cpu = common.self_cpu_seconds() - c0
        print("RESULT " + json.dumps({"bytes": total, "wall_s": last - (first or last), "cpu_s": cpu}),
              flush=True)
        return 0
    host, port, dgram, seconds, gso = argv[1], int(argv[2]), int(argv[3]), float(argv[4]), argv[5] == "1"
    # pieces 3: each datagram handed over as header, payload and trailer (32, dgram - 36
    # and 4 bytes), the iovec the data plane gives sendmmsg; 2: one iovec per datagram
    # (the aggregator's results built in place); 1: one buffer per send
    pieces = int(argv[6]) if len(argv) > 6 else 1
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO: DF, as netreduce
    per = max(1, 65000 // dgram) if gso else 1
    data = bytes(dgram * per)
    if pieces == 3:
        view = memoryview(data)
        bufs = []
        for k in range(per):
            d = view[k * dgram:(k + 1) * dgram]
            bufs += [d[:32], d[32:dgram - 4], d[dgram - 4:]]
    elif pieces == 2:
        view = memoryview(data)
        bufs = [view[k * dgram:(k + 1) * dgram] for k in range(per)]
    else:
        bufs = [data]
    cmsg = [(socket.SOL_UDP, UDP_SEGMENT, struct.pack("H", dgram))] if gso else []
    total = 0
    c0 = common.self_cpu_seconds()
    k0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    t0 = time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        for _ in range(64):
            try:
                total += s.sendmsg(bufs, cmsg, 0, (host, port))
            except (BlockingIOError, ConnectionRefusedError):
                pass
    wall = time.perf_counter() - t0
    print("RESULT " + json.dumps({"bytes": total, "wall_s": wall,
                                  "cpu_s": common.self_cpu_seconds() - c0,
                                  "sys_s": resource.getrusage(resource.RUSAGE_SELF).ru_stime - k0}),
          flush=True)
    return 0


def _result(text: str) -> dict:
    line = next(ln for ln in text.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def floor_point(tb, args, mtu: int, kind: str) -> dict:
    agg, h0 = tb.aggregator, tb.hosts[0]
    dgram = datagram_bytes(mtu)
    seconds = args.seconds
    if kind.startswith("probe"):
        gso = kind.startswith("probe-gso")
        pieces = {"probe-gso-iov": 3, "probe-gso-dgram": 2}.get(kind, 1)
        port = 5301
        recv = tb.popen(agg, [sys.executable, os.path.abspath(__file__), "--probe", "recv",
                              str(port), str(dgram), "1" if gso else "0"],
                        stdout=subprocess.PIPE, text=True)
        recv.stdout.readline()  # READY
        send = tb.run(h0, [sys.executable, os.path.abspath(__file__), "--probe", "send",
                           agg.address, str(port), str(dgram), str(seconds), "1" if gso else "0",
                           str(pieces)],
                      capture_output=True, text=True, timeout=seconds + 30)
        out, _ = recv.communicate(timeout=30)
        s, r = _result(send.stdout), _result(out)
        rec = {"tool": "python udp" + (" gso/gro" if gso else "")
                       + {3: " 3-piece iovec", 2: " iovec per datagram"}.get(pieces, ""),
               "dgram": dgram, "sent_bytes": s["bytes"], "received_bytes": r["bytes"],
               "client_cpu_s": s["cpu_s"], "client_sys_s": s["sys_s"], "server_cpu_s": r["cpu_s"],
               "wall_s": s["wall_s"]}
    else:
        port = 5201
        srv = tb.popen(agg, ["iperf3", "-s", "-1", "-p", str(port), "-B", agg.address],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        argv = ["iperf3", "-c", agg.address, "-p", str(port), "-t", str(seconds), "-J"]
        if kind == "udp":
            argv += ["-u", "-b", "0", "-l", str(dgram)]
        cli = tb.popen(h0, argv, stdout=subprocess.PIPE, text=True)
        # CPU of both ends from /proc (iperf3's own figures are percentages of wall time)
        time.sleep(0.2)
        s0, c0 = common.pid_cpu_seconds(srv.pid), common.pid_cpu_seconds(cli.pid)
        out, _ = cli.communicate(timeout=seconds + 30)
        try:
            s1 = common.pid_cpu_seconds(srv.pid)
        except OSError:
            s1 = s0
        srv.wait(timeout=10)
        data = json.loads(out)
        end = data["end"]
        if kind == "udp":
            summ = end["sum"]
            received = summ["bytes"] * (1 - summ.get("lost_percent", 0) / 100.0)
            sent = summ["bytes"]
        else:
            received, sent = end["sum_received"]["bytes"], end["sum_sent"]["bytes"]
        cpu = end.get("cpu_utilization_percent", {})
        wall = end["sum_sent" if kind == "tcp" else "sum"]["seconds"]
        rec = {"tool": f"iperf3 {kind}", "dgram": dgram if kind == "udp" else None,
               "sent_bytes": sent, "received_bytes": received,
               # iperf3's percentages x wall: its own accounting of both ends
               "client_cpu_s": cpu.get("host_total", 0) / 100.0 * wall,
               "server_cpu_s": cpu.get("remote_total", 0) / 100.0 * wall,
               "client_cpu_s_proc": None, "wall_s": wall}
        del s0, s1, c0
    rec.update(mtu=mtu, loadavg=os.getloadavg())
    gb = rec["received_bytes"] / 1e9
    rec["GB_per_s"] = gb / rec["wall_s"] if rec["wall_s"] else None
    rec["server_GB_per_cpu_s"] = gb / rec["server_cpu_s"] if rec["server_cpu_s"] else None
    rec["client_GB_per_cpu_s"] = (rec["sent_bytes"] / 1e9 / rec["client_cpu_s"]
                                  if rec["client_cpu_s"] else None)
    if rec.get("client_sys_s"):
        rec["client_GB_per_sys_s"] = rec["sent_bytes"] / 1e9 / rec["client_sys_s"]
    print(f"  [{rec['tool']} MTU {mtu}] {rec['GB_per_s'] or 0:.3f} GB/s received, server "
          f"{rec['server_GB_per_cpu_s'] or 0:.3f} GB/cpu-s, client {rec['client_GB_per_cpu_s'] or 0:.3f} "
          f"GB/cpu-s ({rec.get('client_GB_per_sys_s') or 0:.3f} per system CPU-s), "
          f"load {rec['loadavg'][0]:.2f}", file=sys.stderr, flush=True)
    return rec


def floor_main(args) -> List[dict]:
    from netreduce.testbed import Testbed
    records = []
    for mtu in [int(m) for m in args.mtu.split(",")]:
        with Testbed(hosts=1, rate="10gbit", mtu=mtu, name=args.testbed_name,
                     subnet=args.subnet, replace=True) as tb:
            unshape(tb)
            for rep in range(args.repeats):
                for kind in args.tools.split(","):
                    try:
                        rec = floor_point(tb, args, mtu, kind)
                        rec["repeat"] = rep
                        records.append(rec)
                    except Exception as exc:
                        print(f"# FAILED {kind} MTU {mtu}: {exc}", file=sys.stderr, flush=True)
                        records.append({"tool": kind, "mtu": mtu, "repeat": rep, "error": str(exc)})
    return records


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--rank"]:
        with open(argv[1]) as f:
            return rank_main(json.load(f))
    if argv[:1] == ["--probe"]:
        return probe_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("cost", "floor"))
    ap.add_argument("--mtu", default="1500,9000", help="link MTUs, comma-separated")
    ap.add_argument("--np", type=int, default=2, help="cost: ranks (one namespace each)")
    ap.add_argument("--size", default="64M", help="cost: bytes per all-reduce (float32)")
    ap.add_argument("--iters", type=int, default=6, help="cost: timed all-reduces per point")
    ap.add_argument("--threads", type=int, default=1, help="cost: netreduce-switch --threads")
    ap.add_argument("--switch-args", default="", help="cost: more netreduce-switch options")
    ap.add_argument("--switch-env", default="",
                    help="cost: K=V,... for netreduce-switch only, over the variant's (e.g. keep "
                         "its offloads fixed while the ranks' vary)")
    ap.add_argument("--variant", action="append", default=[],
                    help="cost: NAME:ENV=VALUE,... run every point once per variant, alternating "
                         "(e.g. gso:NETREDUCE_UDP_OFFLOAD=auto plain:NETREDUCE_UDP_OFFLOAD=off)")
    ap.add_argument("--repeats", type=int, default=1, help="rounds over the variants / tools")
    ap.add_argument("--tools", default="udp,tcp,probe,probe-gso",
                    help="floor: udp (iperf3), tcp (iperf3), probe, probe-gso, probe-gso-iov, "
                         "probe-gso-dgram (Python UDP; -iov: each datagram as the data plane's "
                         "3-piece iovec; -dgram: one iovec per datagram)")
    ap.add_argument("--seconds", type=float, default=4.0, help="floor: seconds per tool")
    ap.add_argument("--testbed-name", default="lrc", help="testbed name (namespaces NAME-h0, ...)")
    ap.add_argument("--subnet", default="10.81.0.0/24", help="testbed subnet")
    ap.add_argument("--ranks-without-net-admin", action="store_true",
                    help="cost: run the ranks without CAP_NET_ADMIN (util-linux setpriv), so "
                         "that net.core.rmem_max caps their receive buffers, as for a "
                         "training job of an ordinary user (see --rmem-max)")
    ap.add_argument("--rmem-max", type=int, default=0,
                    help="cost: net.core.rmem_max for the run (put back after); 0 = as is")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", default=None, help="write the records (and run metadata) here")
    args = ap.parse_args(argv)
    meta = {"date": common.utc_now(), "command": common.command_line(),
            "machine": common.machine_description(), "mode": args.mode,
            "loadavg_at_start": os.getloadavg()}
    print(f"# linerate {args.mode}, {meta['date']}, load {meta['loadavg_at_start']}", file=sys.stderr)
    with common.rmem_max_set(args.rmem_max):
        records = cost_main(args) if args.mode == "cost" else floor_main(args)
    meta["loadavg_at_end"] = os.getloadavg()
    if args.json:
        common.write_json(args.json, meta, records)
        print(f"# wrote {args.json}", file=sys.stderr)
    bad = [r for r in records if "error" in r or r.get("correct") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
