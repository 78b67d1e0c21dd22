#!/usr/bin/env python3
"""Issue 33's CPU targets beside the kernel's floor on this testbed: what a rank and
the aggregator would cost if they did nothing but move the bytes, measured in the
same run as netreduce and gloo, so that a target above the bound shows it.

    # as root; 5 runs, every point once per run (~30 min at load 10-20)
    python3 benchmarks/cpu_bounds.py --runs 5 --paced
    # record: benchmarks/results/issue33/cpu_bounds_<UTC>.json (--out to choose)

(a) A rank's floor. N ranks, each in its testbed namespace (`tc tbf` links at
--rates, MTU --mtus, as the testbed shapes them), and one reflector in the
aggregator's namespace. Each floor rank sends S bytes from a user buffer with
UDP_SEGMENT (64 KiB per call, netreduce's datagram size for the MTU) and receives S
bytes with UDP_GRO straight into a buffer of S bytes: no ICRC, no headers, no
per-chunk bookkeeping, one thread that sleeps in recv only when its window
(--window, the engine's 2 MiB in flight) is full and then takes every result that is
in (a send never sleeps: 8 MiB of send buffer). Its sleeps per round are in the
record beside the engine's waits. Where the link binds, that floor wakes once per
arriving super-packet; --paced adds a second floor in the same testbed whose ranks,
once woken, sleep an eighth of a window's time at the link rate before they drain
(the link stays busy; the wake-ups drop ~3x): the bound for a rank that waits well.
Whole-process CPU (utime+stime) per round of S, beside a netreduce rank's and a
gloo rank's per S-byte all-reduce from benchmarks/allreduce.py on the same rate and
MTU in the same run (--impls netreduce,gloo: the slowest rank's time, the mean
rank's CPU). The floor is a Python process: its user time (in the record) holds the
interpreter's per call and per wake-up cost, so its system time is closer to what
the kernel alone needs.

(b) The aggregator's floor. The reflector receives the N x S contributions (GRO,
into one hot buffer) and sends back S of results without summing anything: one
GSO send to a multicast group per result (--fanout group, what the daemon's default
`--fanout segment` does on this testbed, every rank on its segment) or one per rank
(unicast). GB of worker input per CPU-second of the whole process, unshaped testbed
(benchmarks/linerate.py's `unshape`), beside the real daemon measured exactly as
`benchmarks/issue33.py aggregator` does (linerate.py's `cost_point`, its defaults),
alternated in each run. The floor's reflector at the shaped points is in the record
too (it is (c)'s aggregator floor).

(c) The 40 Gbit/s time on 2 shared cores. When the CPUs bind, a run can be no shorter
than its CPU-seconds over the cores: predicted time ratio to gloo =
(N x rank CPU + aggregator CPU) / (N x gloo rank CPU) per all-reduce, for netreduce
(daemon CPU from allreduce.py's record: its busy fraction x the time) and for the
floor (ranks + reflector), beside the measured time ratio. What no process is charged
(softirq work the kernel does outside a process's context, other people's load) is
outside the prediction; the machine's busy fraction is in the record.

Timings depend on the load: every run records the load average before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
if REPO not in sys.path:
    sys.path.append(REPO)

import common  # noqa: E402
import linerate  # noqa: E402  (datagram size, GSO/GRO options, the daemon's cost point)

OUT = os.path.join(HERE, "results", "issue33")
GROUP = "239.86.33.1"      # the floor's result group (TTL 1, the testbed's bridge only)
AGG_PORT, RANK_PORT = 5411, 5412
SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33  # root: past net.core.*mem_max, as the engine's
IP_MTU_DISCOVER, IP_PMTUDISC_DO = 10, 2


def _gso_bytes(dgram: int) -> int:
    """Bytes per UDP_SEGMENT send: whole datagrams up to ~64 KiB (linerate's probe)."""
    return dgram * max(1, 65000 // dgram)


def _socket(rcvbuf: int) -> socket.socket:
    """GRO on, DF, and buffers that neither drop a window's results nor make a send
    sleep (8 MiB of send buffer: a send never waits for a shaper to drain)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for force, plain, size in ((SO_RCVBUFFORCE, socket.SO_RCVBUF, rcvbuf),
                               (SO_SNDBUFFORCE, socket.SO_SNDBUF, 8 << 20)):
        try:
            s.setsockopt(socket.SOL_SOCKET, force, size)
        except OSError:
            s.setsockopt(socket.SOL_SOCKET, plain, size)
    s.setsockopt(socket.IPPROTO_UDP, linerate.UDP_GRO, 1)
    s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)  # DF, as netreduce
    return s


def _udp_errors() -> Dict[str, int]:
    """This namespace's UDP drop counters (/proc/net/snmp): a floor that lost
    datagrams would stall, and these say where."""
    with open("/proc/net/snmp") as f:
        rows = [ln.split() for ln in f if ln.startswith("Udp:")]
    c = dict(zip(rows[0][1:], (int(v) for v in rows[1][1:])))
    return {k: c.get(k, 0) for k in ("InDatagrams", "InErrors", "RcvbufErrors", "SndbufErrors")}


def _cpu() -> Dict[str, float]:
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"user": ru.ru_utime, "sys": ru.ru_stime, "sleeps": ru.ru_nvcsw}


# =============================================================================
# The floor's processes: one per rank namespace, one reflector in the aggregator's.
# =============================================================================
def floor_rank(cfg: dict) -> int:
    """Rounds of S bytes out (GSO from src) and S bytes back (GRO into dst), a window
    of bytes in flight. The byte stream runs across rounds: a GRO receive may hold
    the end of one round and the start of the next, so dst has 64 KiB of slack."""
    size, dgram, window = cfg["size"], cfg["dgram"], cfg["window"]
    rounds = 1 + cfg["rounds"]  # the first one warms up (and lines the ranks up)
    src = bytearray(b"\x5a") * size  # touched pages, as a tensor's are
    dst = bytearray(b"\xa5") * (size + 65536)
    vsrc, vdst = memoryview(src), memoryview(dst)
    s = _socket(32 << 20)
    s.bind(("0.0.0.0", RANK_PORT))
    if cfg["fanout"] == "group":
        s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                     socket.inet_aton(GROUP) + socket.inet_aton(cfg["address"]))
    # The floor has no resends, so before anything is timed it waits for what would
    # lose its first datagrams: the aggregator's MAC (while ARP is unresolved the kernel
    # keeps ~200 KB of sends and drops the rest of a window silently; this one datagram
    # goes to a port nobody holds), and the bridge's IGMP snooping (until this rank's
    # report, sent within ~1 s of the join, is in, the group skips this rank).
    s.sendto(b"arp", (cfg["aggregator"], AGG_PORT + 2))
    time.sleep(2.0)
    # A blocking socket (no Python timeout: that would turn MSG_DONTWAIT into a wait)
    # and poll for the one sleep per empty socket.
    poll = select.poll()
    poll.register(s, select.POLLIN)
    cmsg = [(socket.SOL_UDP, linerate.UDP_SEGMENT, struct.pack("H", dgram))]
    agg = (cfg["aggregator"], AGG_PORT)
    gso = _gso_bytes(dgram)
    nap = cfg.get("nap", 0.0)
    sent = got = 0
    marks = []  # (wall, cpu) when round k's results are all in
    try:
        for k in range(1, rounds + 1):
            end = k * size
            while got < end:
                while sent < end and sent - got < window:
                    off = sent % size
                    n = min(gso, size - off)
                    sent += s.sendmsg([vsrc[off:off + n]], cmsg, 0, agg)
                # Sleep until results come, then take all there are before sending on:
                # one wake-up per empty socket, not one per datagram.
                if not poll.poll(cfg["timeout"] * 1000):
                    raise TimeoutError
                if nap:  # paced: let more results come back before taking them
                    time.sleep(nap)
                while got < end:
                    off = got % size
                    try:
                        got += s.recv_into(vdst[off:off + 65536], 0, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        break
            marks.append((time.perf_counter(), _cpu()))
    except TimeoutError:
        print(f"ERROR rank {cfg['rank']}: no result for {cfg['timeout']} s: sent {sent}, got {got} "
              f"of {rounds * size}; UDP {_udp_errors()}", flush=True)
        return 1
    (t0, c0), (t1, c1) = marks[0], marks[-1]
    timed = rounds - 1
    rec = {"rank": cfg["rank"], "rounds": timed, "wall_s_per_round": (t1 - t0) / timed,
           "cpu_s_per_round": (c1["user"] + c1["sys"] - c0["user"] - c0["sys"]) / timed,
           "sys_s_per_round": (c1["sys"] - c0["sys"]) / timed,
           "sleeps_per_round": (c1["sleeps"] - c0["sleeps"]) / timed}
    print("RESULT " + json.dumps(rec), flush=True)
    return 0


def floor_aggregator(cfg: dict) -> int:
    """Receive N x S per round (GRO, one hot buffer) and release the results as far as
    every rank's contributions have come (a slot completes when its last contribution
    arrives): a full GSO send as soon as one is due, the rest whenever the socket is
    empty. The only bookkeeping is a byte count per rank."""
    n, size, dgram = cfg["np"], cfg["size"], cfg["dgram"]
    rounds = 1 + cfg["rounds"]
    gso = _gso_bytes(dgram)
    s = _socket(64 << 20)
    s.bind((cfg["address"], AGG_PORT))
    if cfg["fanout"] == "group":
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(cfg["address"]))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
        dests = [(GROUP, RANK_PORT)]
    else:
        dests = [(a, RANK_PORT) for a in cfg["ranks"]]
    cmsg = [(socket.SOL_UDP, linerate.UDP_SEGMENT, struct.pack("H", dgram))]
    buf = bytearray(65536)
    out = bytearray(b"\x3c") * gso
    vout = memoryview(out)
    per_rank = {a: 0 for a in cfg["ranks"]}
    total = released = 0
    goal = rounds * size
    mark0: Optional[tuple] = None
    poll = select.poll()
    poll.register(s, select.POLLIN)
    print("READY", flush=True)

    def release(upto: int) -> int:
        done = released
        while done < upto:
            m = min(gso, upto - done)
            for d in dests:
                s.sendmsg([vout[:m]], cmsg, 0, d)
            done += m
        return done

    while released < goal:
        try:
            got, (addr, _) = s.recvfrom_into(buf, 0, socket.MSG_DONTWAIT)
        except BlockingIOError:
            released = release(min(per_rank.values()))  # nothing waiting: flush what is due
            if released >= goal:
                break
            if not poll.poll(cfg["timeout"] * 1000):
                print(f"ERROR aggregator: no contribution for {cfg['timeout']} s: received "
                      f"{total} of {n * goal}; UDP {_udp_errors()}", flush=True)
                return 1
            continue
        total += got
        per_rank[addr] += got
        due = min(per_rank.values())
        if due - released >= gso:
            released = release(due - (due - released) % gso)
        if mark0 is None and total >= n * size:
            mark0 = (time.perf_counter(), _cpu(), total)
    t1, c1 = time.perf_counter(), _cpu()
    t0, c0, in0 = mark0
    cpu = c1["user"] + c1["sys"] - c0["user"] - c0["sys"]
    rec = {"input_bytes": total - in0, "wall_s": t1 - t0, "cpu_s": cpu,
           "sys_s": c1["sys"] - c0["sys"], "fanout": cfg["fanout"],
           "GB_per_cpu_s": (total - in0) / 1e9 / cpu if cpu > 0 else None}
    print("RESULT " + json.dumps(rec), flush=True)
    return 0


def floor_point(tb, args, mtu: int, nap: float = 0.0) -> Dict[str, Any]:
    """One floor run on testbed `tb`: the reflector, then the N ranks; their records.
    nap > 0: each floor rank sleeps that long after each wake-up before it drains."""
    n = len(tb.hosts)
    base = {"np": n, "size": common.parse_size(args.size), "dgram": linerate.datagram_bytes(mtu),
            "rounds": args.iters, "window": common.parse_size(args.window),
            "fanout": args.fanout, "timeout": 20.0, "nap": nap, "aggregator": tb.aggregator.address,
            "ranks": [h.address for h in tb.hosts]}
    me = [sys.executable, os.path.abspath(__file__)]
    agg = tb.popen(tb.aggregator, me + ["--role", "aggregator",
                                        json.dumps(dict(base, address=tb.aggregator.address))],
                   stdout=subprocess.PIPE, text=True)
    ranks: List[subprocess.Popen] = []
    try:
        if agg.stdout.readline().strip() != "READY":
            raise RuntimeError("the floor's reflector did not start")
        ranks = [tb.popen(r, me + ["--role", "rank", json.dumps(dict(base, rank=r, address=h.address))],
                          stdout=subprocess.PIPE, text=True) for r, h in enumerate(tb.hosts)]
        outs = [p.communicate(timeout=args.timeout)[0] for p in ranks]
        aout = agg.communicate(timeout=60)[0]
    finally:
        for p in [agg] + ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = [o for o in outs + [aout] if "RESULT " not in o]
    if bad:
        raise RuntimeError("floor run failed: " + " | ".join(o.strip()[-300:] for o in bad))
    recs = [linerate._result(o) for o in outs]
    a = linerate._result(aout)
    return {"rank_cpu_s": statistics.mean(r["cpu_s_per_round"] for r in recs),
            "rank_sys_s": statistics.mean(r["sys_s_per_round"] for r in recs),
            "rank_sleeps": statistics.mean(r["sleeps_per_round"] for r in recs),
            "time_s": max(r["wall_s_per_round"] for r in recs),
            "aggregator_cpu_s": a["cpu_s"] / args.iters, "aggregator_GB_per_cpu_s": a["GB_per_cpu_s"],
            "aggregator": a, "ranks": recs}


# =============================================================================
# The product beside it: allreduce.py (ranks) and linerate.py's cost (the daemon).
# =============================================================================
def allreduce_point(args, rate: str, mtu: int) -> Dict[str, Any]:
    """netreduce and gloo on the testbed at `rate` and `mtu` (benchmarks/allreduce.py,
    as issue33.py testbed runs it, on this benchmark's own testbed name and subnet)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
        cmd = [sys.executable, os.path.join(HERE, "allreduce.py"), "--testbed", "--rate", rate,
               "--np", str(args.np), "--impls", "netreduce,gloo", "--min-size", args.size,
               "--max-size", args.size, "--min-iters", str(args.iters), "--mtu", str(mtu),
               "--testbed-name", args.testbed_name + "a", "--subnet", args.subnet_allreduce,
               "--json", tmp.name]
        subprocess.run(cmd, cwd=REPO, env=env, timeout=1800, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL if not args.verbose else None)
        with open(tmp.name) as f:
            recs = {r["impl"]: r for r in json.load(f)["records"]}
    out = {}
    for impl, r in recs.items():
        out[impl] = {"time_s": r["time_s"], "rank_cpu_s": r["cpu_s_per_allreduce"],
                     "correct": r["correct"], "machine_busy": r.get("machine_busy"),
                     "rank_waits": r.get("waits_per_rank")}  # the engine's sleeps
        if "cpu_switch" in r:  # the daemon's busy fraction over rank 0's timed loop
            out[impl]["aggregator_cpu_s"] = r["cpu_switch"] * r["time_s"]
    return out


def daemon_point(tb, args, mtu: int) -> Dict[str, Any]:
    """The real daemon, as `issue33.py aggregator` measures it (linerate.py cost)."""
    ns = argparse.Namespace(np=args.np, size=args.size, iters=args.iters, threads=1,
                            switch_args="", switch_env="", ranks_without_net_admin=False,
                            timeout=args.timeout)
    rec = linerate.cost_point(tb, ns, mtu, "daemon", {})
    return {"aggregator_GB_per_cpu_s": rec["aggregator_GB_per_cpu_s"],
            "aggregator_cpu_s": rec["switch_cpu_s"] / args.iters,
            "rank_cpu_s": rec["engine_cpu_s_mean"] / args.iters,
            "time_s": rec["time_per_allreduce_s"], "correct": rec["correct"]}


# =============================================================================
# The run and its summary.
# =============================================================================
def shaped_run(args, rate: str, mtu: int, first: str) -> Dict[str, Any]:
    from netreduce.testbed import Testbed
    load0 = os.getloadavg()
    rec: Dict[str, Any] = {"rate": rate, "mtu": mtu, "order": first}

    def floor() -> None:
        with Testbed(hosts=args.np, rate=rate, mtu=mtu, name=args.testbed_name + "f",
                     subnet=args.subnet, replace=True) as tb:
            rec["floor"] = floor_point(tb, args, mtu)
            if args.paced:  # an eighth of a window's time at the link rate (keeps it busy)
                from netreduce.testbed.plan import parse_rate
                nap = common.parse_size(args.window) / 8 / (parse_rate(rate) / 8)
                rec["floor_paced"] = floor_point(tb, args, mtu, nap)
                rec["floor_paced"]["nap_s"] = nap

    def product() -> None:
        rec.update(allreduce_point(args, rate, mtu))

    for step in ((floor, product) if first == "floor" else (product, floor)):
        step()
    rec["load"] = list(load0) + list(os.getloadavg())
    nr, gl, fl = rec["netreduce"], rec["gloo"], rec["floor"]
    n = args.np
    rec["ratios"] = {
        "netreduce_rank_cpu / gloo": nr["rank_cpu_s"] / gl["rank_cpu_s"],
        "floor_rank_cpu / gloo": fl["rank_cpu_s"] / gl["rank_cpu_s"],
        "netreduce_rank_cpu / floor": nr["rank_cpu_s"] / fl["rank_cpu_s"],
        "time netreduce / gloo": nr["time_s"] / gl["time_s"],
        "time floor / gloo": fl["time_s"] / gl["time_s"],
        # (c): CPU-seconds of the whole all-reduce over the same cores, against gloo's
        "predicted netreduce / gloo": (n * nr["rank_cpu_s"] + nr.get("aggregator_cpu_s", 0.0))
                                      / (n * gl["rank_cpu_s"]),
        "predicted floor / gloo": (n * fl["rank_cpu_s"] + fl["aggregator_cpu_s"])
                                  / (n * gl["rank_cpu_s"]),
    }
    if "floor_paced" in rec:
        fp = rec["floor_paced"]
        rec["ratios"].update({
            "floor_paced_rank_cpu / gloo": fp["rank_cpu_s"] / gl["rank_cpu_s"],
            "netreduce_rank_cpu / floor_paced": nr["rank_cpu_s"] / fp["rank_cpu_s"],
            "time floor_paced / gloo": fp["time_s"] / gl["time_s"]})
    # (c) in time: the CPU-seconds of one all-reduce, all its processes, over the cores
    cores = os.cpu_count() or 1
    rec["cpu_over_cores_s"] = {
        "netreduce": (n * nr["rank_cpu_s"] + nr.get("aggregator_cpu_s", 0.0)) / cores,
        "floor": (n * fl["rank_cpu_s"] + fl["aggregator_cpu_s"]) / cores,
        "gloo": n * gl["rank_cpu_s"] / cores}
    print(f"  {rate} MTU {mtu}: rank CPU ms netreduce {nr['rank_cpu_s'] * 1e3:.1f} floor "
          f"{fl['rank_cpu_s'] * 1e3:.1f} gloo {gl['rank_cpu_s'] * 1e3:.1f} (floor/gloo "
          f"{rec['ratios']['floor_rank_cpu / gloo']:.3f}); time ms netreduce {nr['time_s'] * 1e3:.0f} "
          f"floor {fl['time_s'] * 1e3:.0f} gloo {gl['time_s'] * 1e3:.0f}; aggregator ms daemon "
          f"{nr.get('aggregator_cpu_s', 0) * 1e3:.0f} floor {fl['aggregator_cpu_s'] * 1e3:.0f}; "
          f"load {rec['load'][3]:.1f}", flush=True)
    return rec


def aggregator_run(args, mtu: int, first: str) -> Dict[str, Any]:
    from netreduce.testbed import Testbed
    load0 = os.getloadavg()
    rec: Dict[str, Any] = {"mtu": mtu, "order": first}
    with Testbed(hosts=args.np, rate="10gbit", mtu=mtu, name=args.testbed_name + "g",
                 subnet=args.subnet, replace=True) as tb:
        linerate.unshape(tb)
        for which in (("floor", "daemon") if first == "floor" else ("daemon", "floor")):
            rec[which] = floor_point(tb, args, mtu) if which == "floor" else daemon_point(tb, args, mtu)
    rec["load"] = list(load0) + list(os.getloadavg())
    d, f = rec["daemon"], rec["floor"]
    rec["daemon / floor GB per cpu_s"] = (d["aggregator_GB_per_cpu_s"] / f["aggregator_GB_per_cpu_s"]
                                          if d["aggregator_GB_per_cpu_s"] and f["aggregator_GB_per_cpu_s"]
                                          else None)
    print(f"  aggregator unshaped MTU {mtu}: GB/CPU-s daemon {d['aggregator_GB_per_cpu_s'] or 0:.2f} "
          f"floor {f['aggregator_GB_per_cpu_s'] or 0:.2f} ({args.fanout}); load {rec['load'][3]:.1f}",
          flush=True)
    return rec


def summarize(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    shaped = [r for r in runs if "rate" in r and "error" not in r]
    for rate, mtu in sorted({(r["rate"], r["mtu"]) for r in shaped}):
        mine = [r for r in shaped if r["rate"] == rate and r["mtu"] == mtu]
        impls = ["netreduce", "floor", "gloo"] + (["floor_paced"] if "floor_paced" in mine[0] else [])
        cell = {f"{impl}_rank_cpu_ms": common.spread([r[impl]["rank_cpu_s"] * 1e3 for r in mine], 2)
                for impl in impls}
        cell.update({f"{impl}_ms": common.spread([r[impl]["time_s"] * 1e3 for r in mine], 1)
                     for impl in impls})
        for impl in ("netreduce", "floor", "gloo"):
            cell[f"{impl}_cpu_over_cores_ms"] = common.spread([r["cpu_over_cores_s"][impl] * 1e3
                                                         for r in mine], 1)
        cell["floor_rank_user_ms"] = common.spread([(r["floor"]["rank_cpu_s"] - r["floor"]["rank_sys_s"])
                                              * 1e3 for r in mine], 2)
        cell["floor_rank_sleeps"] = common.spread([r["floor"]["rank_sleeps"] for r in mine], 0)
        if "floor_paced" in impls:
            cell["floor_paced_rank_sleeps"] = common.spread([r["floor_paced"]["rank_sleeps"] for r in mine], 0)
        cell["netreduce_rank_waits"] = common.spread([r["netreduce"].get("rank_waits") for r in mine], 0)
        cell["daemon_cpu_ms"] = common.spread([r["netreduce"].get("aggregator_cpu_s", 0) * 1e3 for r in mine], 1)
        cell["reflector_cpu_ms"] = common.spread([r["floor"]["aggregator_cpu_s"] * 1e3 for r in mine], 1)
        for k in mine[0]["ratios"]:
            cell[k] = common.spread([r["ratios"][k] for r in mine], 3)
        cell["load"] = common.spread([r["load"][0] for r in mine] + [r["load"][3] for r in mine], 1)
        out[f"{rate} mtu{mtu}"] = cell
    agg = [r for r in runs if "rate" not in r and "error" not in r]
    for mtu in sorted({r["mtu"] for r in agg}):
        mine = [r for r in agg if r["mtu"] == mtu]
        out[f"aggregator mtu{mtu}"] = {
            "daemon_GB_per_cpu_s": common.spread([r["daemon"]["aggregator_GB_per_cpu_s"] for r in mine], 2),
            "floor_GB_per_cpu_s": common.spread([r["floor"]["aggregator_GB_per_cpu_s"] for r in mine], 2),
            "daemon / floor": common.spread([r["daemon / floor GB per cpu_s"] for r in mine], 3),
            "load": common.spread([r["load"][0] for r in mine] + [r["load"][3] for r in mine], 1)}
    return out


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--role"]:
        cfg = json.loads(argv[2])
        return floor_rank(cfg) if argv[1] == "rank" else floor_aggregator(cfg)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="repeats (every point once per run)")
    ap.add_argument("--rates", default="1gbit,40gbit", help="(a), (c): link rates")
    ap.add_argument("--mtus", default="1500,9000", help="link MTUs")
    ap.add_argument("--aggregator-mtus", default="1500,9000", help="(b): MTUs ('' to skip)")
    ap.add_argument("--np", type=int, default=4, help="ranks")
    ap.add_argument("--size", default="64M", help="bytes per all-reduce / floor round")
    ap.add_argument("--iters", type=int, default=5, help="timed all-reduces / floor rounds per point")
    ap.add_argument("--window", default="2M", help="floor: bytes a rank keeps in flight")
    ap.add_argument("--paced", action="store_true",
                    help="(a): also a paced floor at each rate: a rank sleeps an eighth of a "
                         "window's time at the link rate after each wake-up (fewer wake-ups)")
    ap.add_argument("--fanout", choices=("group", "unicast"), default="group",
                    help="floor: results to a multicast group (the daemon's default here) or per rank")
    ap.add_argument("--testbed-name", default="nrbd", help="testbed names (+ f, a, g)")
    ap.add_argument("--subnet", default="10.86.33.0/24", help="the floor's testbed subnet")
    ap.add_argument("--subnet-allreduce", default="10.86.34.0/24", help="allreduce.py's subnet")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--verbose", action="store_true", help="show allreduce.py's stderr")
    ap.add_argument("--out", default="", help="record path (default results/issue33/cpu_bounds_UTC.json)")
    args = ap.parse_args(argv)
    points = [(r, int(m)) for r in args.rates.split(",") if r for m in args.mtus.split(",")]
    agg_mtus = [int(m) for m in args.aggregator_mtus.split(",") if m]
    utc = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    runs: List[Dict[str, Any]] = []
    for i in range(args.runs):
        first = "floor" if i % 2 == 0 else "product"  # the order turns each run
        for rate, mtu in points:
            try:
                runs.append(dict(shaped_run(args, rate, mtu, first), run=i))
            except Exception as exc:  # keep the others
                print(f"# FAILED {rate} MTU {mtu}: {exc}", flush=True)
                runs.append({"run": i, "rate": rate, "mtu": mtu, "error": str(exc)})
        for mtu in agg_mtus:
            try:
                runs.append(dict(aggregator_run(args, mtu, first), run=i))
            except Exception as exc:
                print(f"# FAILED aggregator MTU {mtu}: {exc}", flush=True)
                runs.append({"run": i, "mtu": mtu, "error": str(exc)})
    summary = summarize(runs)
    commit = common.commit_of(REPO)
    os.makedirs(OUT, exist_ok=True)
    path = args.out or os.path.join(OUT, f"cpu_bounds_{utc}.json")
    with open(path, "w") as f:
        json.dump({"command": "python3 benchmarks/cpu_bounds.py " + " ".join(argv), "commit": commit,
                   "utc": utc, "machine": common.machine_description(), "summary": summary,
                   "runs": runs}, f, indent=1)
    print(json.dumps(summary, indent=1))
    print(f"# wrote {path}")
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
