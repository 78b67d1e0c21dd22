#!/usr/bin/env python3
"""The aggregator's cost per byte on each data-port transport (issue 19): worker input
GB per CPU-second of netreduce-switch with plain kernel UDP sockets, with UDP GSO/GRO
sockets (the default) and with AF_XDP (--transport xdp), side by side in one run, on
the emulated testbed (root).

    PYTHONPATH=. python benchmarks/xdp_aggregator.py --mtu 1500,9000 --np 2 --rounds 3 \\
        --json benchmarks/results/xdp_aggregator.json

N hosts (network namespaces) each run one rank; the aggregator runs in its own, one
data thread; links are not the limit (--rate 100gbit: the testbed's shapers pass
everything). Per round and transport a fresh daemon; each rank does a warm-up, then
--iters all-reduces of --size float32, the daemon's CPU read around them. Rounds
alternate the variants (udp, udp-gso, xdp, udp, ...) so that all see the same machine.

CPU accounting. This kernel counts CPU by tick (no IRQ_TIME_ACCOUNTING): a softirq is
charged to the task it interrupted, as system time, and to /proc/stat's softirq
column. On veth the receive side of a datagram (bridge, the receiving veth, then the
XDP program or the IP/UDP stack) runs in softirq on the sender's CPU, inside its
send: the aggregator's receive work lands in the ranks' system time, the ranks'
receive work in the aggregator's. So each record has
  - aggregator: utime+stime of the netreduce-switch process (all threads) — the
    figure issue 19 quotes (0.15 GB/CPU-s at MTU 1500, 0.8-0.9 at 9000, sockets);
  - total: utime+stime of the daemon, every rank process and the ksoftirqd threads —
    every CPU-second the all-reduce cost the machine, kernel work included wherever
    it was charged (only other tenants' processes are left out; /proc/stat's
    machine-wide columns, recorded too, are not, on a shared machine);
and GB/CPU-s = worker input (N x size x iters) / CPU-seconds for each. The ranks run
the same code on both transports, so the difference between the two totals is the
aggregator side's, kernel included.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
if REPO not in sys.path:
    sys.path.insert(1, REPO)

import common  # noqa: E402


def worker(host: str, port: int, job: str, rank: int, size: int, count: int, iters: int) -> None:
    """One rank: register, warm up (verified), say 'warm', wait for 'go' on stdin, run
    the iterations, say how long they took."""
    import numpy as np

    from netreduce.worker import dataplane
    src = np.full(count, rank + 1, np.float32)
    dst = np.empty_like(src)
    with dataplane.connect((host, port), job, rank, size, timeout=120) as conn:
        conn.allreduce(src, dst)
        ok = bool(np.all(dst == size * (size + 1) / 2))
        print(json.dumps({"warm": True, "ok": ok}), flush=True)
        sys.stdin.readline()
        t0 = time.perf_counter()
        for _ in range(iters):
            conn.allreduce(src, dst)
        seconds = time.perf_counter() - t0
        ok = ok and bool(np.all(dst == size * (size + 1) / 2))
        print(json.dumps({"seconds": seconds, "ok": ok, "stats": conn.stats()}), flush=True)


def ksoftirqd_pids() -> List[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().startswith("ksoftirqd/"):
                        out.append(int(pid))
            except OSError:
                pass
    return out


def proc_stat() -> Dict[str, int]:
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    return dict(zip(names, vals))


# The daemon variants: (--transport, NETREDUCE_UDP_OFFLOAD of the daemon). The ranks
# keep the default offload in every variant, so only the aggregator's path changes.
VARIANTS = {"udp": ("udp", "off"), "udp-gso": ("udp", "auto"), "xdp": ("xdp", "auto")}


def one_run(tb, variant: str, mtu: int, n: int, size: int, iters: int, payload: int) -> dict:
    from netreduce.protocol.client import ControlClient
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    transport, offload = VARIANTS[variant]
    switch = tb.spawn_switch(env=dict(env, NETREDUCE_UDP_OFFLOAD=offload),
                             args=["--transport", transport, "--payload-bytes", str(payload),
                                   "--threads", "1"])
    host, port = switch.address
    job = f"xa-{uuid.uuid4().hex[:6]}"
    procs = [tb.popen(r, [sys.executable, __file__, "--worker", host, str(port), job, str(r),
                          str(n), str(size // 4), str(iters)],
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      text=True, env=env) for r in range(n)]
    try:
        for p in procs:
            line = p.stdout.readline()
            if not line.startswith("{"):
                raise RuntimeError(f"rank did not warm up: {line!r} {p.stderr.read()[-2000:]}")
        ksoft = ksoftirqd_pids()
        pids = [switch.pid] + [p.pid for p in procs] + ksoft

        def cpu() -> Dict[int, float]:
            out = {}
            for pid in pids:
                try:
                    out[pid] = common.pid_cpu_seconds(pid)
                except OSError:
                    out[pid] = 0.0
            return out
        c0, s0, t0, load0 = cpu(), proc_stat(), time.monotonic(), os.getloadavg()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [json.loads(p.stdout.readline()) for p in procs]
        c1, s1, wall = cpu(), proc_stat(), time.monotonic() - t0
        with ControlClient(switch.address) as c:
            snap = c.call("counters")
        for p in procs:
            p.stdin.close()
            p.wait(60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        switch.stop()
    delta = {pid: c1[pid] - c0[pid] for pid in pids}
    agg = delta[switch.pid]
    ranks = sum(delta[p.pid] for p in procs)
    soft = sum(delta[p] for p in ksoft)
    total = agg + ranks + soft
    gb = n * size * iters / 1e9
    tr = snap.get("transport", {})
    port_stats = (tr.get("port_stats") or [{}])[0]
    return {"transport": variant, "carried_by": tr.get("transport"), "mtu": mtu, "np": n,
            "size": size, "iters": iters, "payload_bytes": payload,
            "worker_input_gb": gb, "wall_s": wall,
            "slowest_rank_s": max(o["seconds"] for o in outs),
            "correct": all(o["ok"] for o in outs),
            "cpu_s": {"aggregator": agg, "ranks": ranks, "ksoftirqd": soft, "total": total},
            "gb_per_cpu_s": {"aggregator": gb / agg if agg else None,
                             "total": gb / total if total else None},
            "proc_stat_jiffies": {k: s1[k] - s0[k] for k in s0},
            "loadavg": [load0, os.getloadavg()],
            "packets_in": snap["global"]["packets_in"], "packets_out": snap["global"]["packets_out"],
            "rx_xsk": port_stats.get("rx_xsk", 0), "tx_xsk": port_stats.get("tx_xsk", 0),
            "port_stats": port_stats, "program": tr.get("program", {}),
            "retransmits": sum(o["stats"].get("retransmits", 0) for o in outs),
            "describe": tr.get("ports"), "daemon_offload": offload}


def _rate(v) -> str:
    # None: less CPU than one clock tick (/proc counts in 10 ms), as a tiny --size gives
    return "n/a" if v is None else f"{v:.2f}"


def summarize(records: List[dict]) -> List[dict]:
    rows = []
    for mtu in sorted({r["mtu"] for r in records}):
        for transport in VARIANTS:
            rs = [r for r in records if r["mtu"] == mtu and r["transport"] == transport]
            if not rs:
                continue
            row = {"mtu": mtu, "transport": transport, "runs": len(rs)}
            for key in ("aggregator", "total"):
                vals = [r["gb_per_cpu_s"][key] for r in rs if r["gb_per_cpu_s"][key]]
                row[key] = ({"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
                            if vals else {"median": None, "min": None, "max": None})
            row["wall_s"] = statistics.median(r["wall_s"] for r in rs)
            rows.append(row)
    for row in rows:  # each against plain sockets, same MTU, same run
        base = next((b for b in rows if b["mtu"] == row["mtu"] and b["transport"] == "udp"), None)
        if base and row["transport"] != "udp" and all(
                row[k]["median"] and base[k]["median"] for k in ("aggregator", "total")):
            row["vs_udp"] = {k: row[k]["median"] / base[k]["median"] for k in ("aggregator", "total")}
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mtu", default="1500,9000")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--size", default="64M", help="all-reduce size per rank")
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3, help="runs of each transport, alternating")
    ap.add_argument("--rate", default="100gbit")
    ap.add_argument("--transports", default="udp,udp-gso,xdp",
                    help="daemon variants: udp (plain sockets, NETREDUCE_UDP_OFFLOAD=off), "
                         "udp-gso (sockets with GSO/GRO, the default), xdp (--transport xdp)")
    ap.add_argument("--name", default="xdagg", help="testbed name")
    ap.add_argument("--json", default="")
    ap.add_argument("--worker", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        h, p, job, r, n, count, iters = args.worker
        worker(h, int(p), job, int(r), int(n), int(count), int(iters))
        return 0
    from netreduce.testbed import Testbed
    size = common.parse_size(args.size)
    records: List[dict] = []
    meta = {"command": common.command_line(), "date": common.utc_now(),
            "machine": common.machine_description(), "loadavg_at_start": os.getloadavg()}
    for mtu in [int(m) for m in args.mtu.split(",")]:
        payload = (mtu - 64) // 8 * 8  # the largest RoCEv2 payload one IPv4 frame holds
        with Testbed(hosts=args.np, rate=args.rate, mtu=mtu, name=args.name,
                     subnet="10.78.240.0/24", replace=True) as tb:
            for rnd in range(args.rounds):
                for transport in args.transports.split(","):
                    rec = one_run(tb, transport, mtu, args.np, size, args.iters, payload)
                    rec["round"] = rnd
                    records.append(rec)
                    print(f"# MTU {mtu} {transport:>7} round {rnd}: aggregator "
                          f"{_rate(rec['gb_per_cpu_s']['aggregator'])} GB/CPU-s, total "
                          f"{_rate(rec['gb_per_cpu_s']['total'])} GB/CPU-s, wall {rec['wall_s']:.2f} s, "
                          f"load {rec['loadavg'][1][0]:.1f}, rx_xsk {rec['rx_xsk']} of "
                          f"{rec['packets_in']}", file=sys.stderr, flush=True)
    meta["loadavg_at_end"] = os.getloadavg()
    summary = summarize(records)
    for row in summary:
        print(f"MTU {row['mtu']:>5} {row['transport']:>7}: aggregator "
              f"{_rate(row['aggregator']['median'])} GB/CPU-s ({_rate(row['aggregator']['min'])}-"
              f"{_rate(row['aggregator']['max'])}), total {_rate(row['total']['median'])} "
              f"({_rate(row['total']['min'])}-{_rate(row['total']['max'])}), wall {row['wall_s']:.2f} s"
              + (f"; /udp aggregator {row['vs_udp']['aggregator']:.2f}x, total "
                 f"{row['vs_udp']['total']:.2f}x" if "vs_udp" in row else ""))
    if args.json:
        meta["summary"] = summary
        common.write_json(args.json, meta, records)
        print(f"# wrote {args.json}", file=sys.stderr)
    return 0 if all(r["correct"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
