#!/usr/bin/env python3
"""Control-plane benchmark (issue 15): how the coordinator scales, and what a steady
training step costs when cached tensors are agreed on through the data plane.

    PYTHONPATH=. python benchmarks/control_plane.py scale --ranks 1000 --procs 4
    PYTHONPATH=. python benchmarks/control_plane.py step --before /tmp/nr-before
    PYTHONPATH=. python benchmarks/control_plane.py join --ranks 1000 --procs 4

``scale``: one real netreduce-switch; ``--ranks`` lightweight simulated ranks (the
real rank-side NegotiationClient, one control connection each, no data plane) in
``--procs`` processes. Reports the job start time (first connection to the last
rank's hello returning: every rank knows every rank joined) and the negotiation
time per step through the coordinator: every rank submits one tensor (by its cache
id after the first step) and waits for its log entry — the path a cache miss takes.
``--rounds`` adds the agreement path at that scale: the same ranks open real data
planes and time the agreement round (the int32 MIN all-reduce of the cache vector).

``join``: one real netreduce-switch; ``--ranks`` rank threads in ``--procs``
processes, each running what ``nr.init()`` runs on a rank with the project's own
classes: data-plane admission (``dataplane.connect``: register, the payload, the
native engine) and then the hello (``NegotiationClient``: returns once every rank
joined). Then every rank's first all-reduce, 16 int32 (rank r gives r), checked
exact on every rank. Reports the full join (first connection to the last hello),
the first all-reduce (last hello to the last result), the engines' resends and
the CPU used, per run (``--repeat``) and as medians with the spread; ``--before``
runs an earlier checkout interleaved with this one (the same load for both).

``step``: N=4 ranks on this host through the public API (nr.allreduce of 4 KiB,
float32, one name), the median of ``--repeat`` runs of ``--iters`` each, for
every variant in the same run: ``before`` (the code at ``--before``, a worktree of
the previous commit with the same native module), ``coordinator``
(NETREDUCE_CACHE_AGREEMENT=0: every step asks the coordinator), ``agreement``
(the default); each at NETREDUCE_CYCLE_TIME 1 (default) and 0, and with the
algorithm the host gets by default (auto: one host = shared memory) and flat (every
rank through the aggregator). ``dataplane`` is the same 4 KiB all-reduce on the
algorithm alone, no negotiation, for the floor. ``failover-coordinator`` and
``failover-agreement`` (``--variants``) are the last two with failover on
(NETREDUCE_STANDBY_SWITCH = the job's own aggregator; negotiation at rank 0).
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
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path and not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, REPO)  # workers get PYTHONPATH: "before" runs the other checkout


# --- workers ------------------------------------------------------------------------
def worker_scale(args: argparse.Namespace) -> None:
    """``--count`` simulated ranks from ``--first`` on one asyncio loop, each one
    control connection speaking the rank side of the protocol (the requests
    NegotiationClient sends, netreduce/protocol/messages.py): hello, then ``--steps``
    steps of one tensor each."""
    import asyncio

    from netreduce.protocol import codec, messages
    from netreduce.protocol.signature import Signature
    try:
        from netreduce.worker.response_cache import ResponseCache
    except ImportError:  # a checkout from before ResponseCache had its own file
        from netreduce.worker.negotiation import ResponseCache  # type: ignore[no-redef]
    host, port = args.switch.rsplit(":", 1)
    sig = Signature("allreduce", "float32", (1024,), "sum")

    async def call(reader: Any, writer: Any, msg: Any) -> Any:
        writer.write(codec.encode_request(msg))
        line = await reader.readline()
        env = codec.decode_envelope(line)
        if not env.ok:
            raise RuntimeError(env.error)
        return codec.decode_reply(line, messages.REPLY_OF[type(msg)])

    async def rank(r: int, joined: List[float]) -> List[float]:
        reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 24)
        await call(reader, writer, messages.Hello(version=messages.PROTOCOL_VERSION))
        hello = await call(reader, writer, messages.NegotiateHello(
            role="all", job=args.job, rank=r, size=args.size, threshold=64 << 20,
            capacity=1024, timeout=120.0))
        joined.append(time.time())
        seq, cache, times = hello.seq, ResponseCache(), []
        for step in range(args.steps):
            t = time.perf_counter()
            reqs = [cache.encode("g", sig, True)]
            while True:
                reply = await call(reader, writer, messages.Negotiate(
                    id=step, reqs=reqs, ack=seq, wait_ms=1000.0, stall_s=60.0))
                reqs = []
                if reply.entries:
                    break
            for entry in reply.entries:
                seq = entry.seq + 1
                if entry.assign:
                    cache.learn(entry.assign, {"g": sig})
            times.append(time.perf_counter() - t)
        await call(reader, writer, messages.NegotiateBye(done=seq - 1))
        writer.close()
        return times

    async def main() -> Dict[str, Any]:
        joined: List[float] = []
        t0 = time.time()
        per_rank = await asyncio.gather(*(rank(r, joined) for r in
                                          range(args.first, args.first + args.count)))
        return {"t0": t0, "joined": max(joined), "steps": list(per_rank)}

    out = asyncio.run(main())
    out["rounds"] = _rounds(args, (host, int(port)),
                            range(args.first, args.first + args.count)) if args.rounds else []
    print(json.dumps(out), flush=True)


def worker_join(args: argparse.Namespace) -> None:
    """``--count`` rank threads from ``--first``: admission, hello, one all-reduce.
    Prints one JSON line: per-phase timestamps (time.time(), comparable across the
    processes of one host) and the engines' counters summed."""
    import resource
    import threading

    import numpy as np

    from netreduce.worker import dataplane
    from netreduce.worker.negotiation import NegotiationClient
    host, port = args.switch.rsplit(":", 1)
    address = (host, int(port))
    n = args.size
    go = threading.Event()
    t = {k: [0.0] * args.count for k in ("start", "admitted", "joined", "done")}
    stats: List[Dict[str, int]] = [{} for _ in range(args.count)]
    errors: List[str] = []

    def rank(i: int) -> None:
        r = args.first + i
        go.wait()
        try:
            t["start"][i] = time.time()
            dp = dataplane.connect(address, args.job, r, n, timeout=120.0)
            t["admitted"][i] = time.time()
            neg = None if args.no_hello else NegotiationClient(
                address, args.job, r, n, threshold=64 << 20, capacity=1024,
                start_timeout=120.0, timeout=120.0, agree=True)
            t["joined"][i] = time.time()
            x = np.full(16, r, np.int32)
            dp.allreduce(x)
            t["done"][i] = time.time()
            if not (x == n * (n - 1) // 2).all():
                errors.append(f"rank {r}: wrong sum {x[:4]}")
            stats[i] = dp.stats()
        except Exception as exc:  # reported to the driver, which fails the run
            errors.append(f"rank {r}: {exc!r}")
            return
        leave.wait()
        if neg is not None:
            neg.close()
        dp.close()

    leave = threading.Event()  # set once every process has reported: no rank leaves early
    threads = [threading.Thread(target=rank, args=(i,), daemon=True) for i in range(args.count)]
    for th in threads:
        th.start()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    go.set()
    while not errors and not all(t["done"]):
        time.sleep(0.005)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    keys = sorted({k for st in stats for k in st})
    print(json.dumps({
        "first": args.first, "count": args.count, "errors": errors[:10], "n_errors": len(errors),
        "times": t, "stats": {k: sum(st.get(k, 0) for st in stats) for k in keys},
        "max_retransmits": max((st.get("retransmits", 0) for st in stats), default=0),
        # per rank: the engine's first round-trip sample as measured (before its cap;
        # usually the held notice's), and its resends
        "first_rtt_us": [st.get("first_rtt_us", 0) for st in stats],
        "rank_retransmits": [st.get("retransmits", 0) for st in stats],
        "cpu_s": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)}),
        flush=True)
    sys.stdin.readline()  # the driver: every process has its results
    leave.set()
    for th in threads:
        th.join(30)

def _rounds(args: argparse.Namespace, address: Any, ranks: range) -> List[float]:
    """Real data planes for the same ranks; each times ``--steps`` agreement rounds."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from netreduce.worker import dataplane
    try:
        from netreduce.worker.agreement import HEADER
    except ImportError:  # a checkout from before Agreement had its own file
        from netreduce.worker.response_cache import HEADER  # type: ignore[no-redef]
    with ThreadPoolExecutor(max_workers=args.count) as pool:
        conns = list(pool.map(lambda r: dataplane.connect(address, args.job + "-dp", r,
                                                          args.size, timeout=120.0), ranks))

        def run(conn: Any) -> List[float]:
            vec = np.ones(HEADER + 1024, np.int32)
            out = []
            for _ in range(args.steps):
                t = time.perf_counter()
                conn.allreduce(vec, None, op="min")
                out.append(time.perf_counter() - t)
            return out
        times = list(pool.map(run, conns))
    for c in conns:
        c.close()
    return [max(t[i] for t in times) for i in range(args.steps)]


def worker_step(args: argparse.Namespace) -> None:
    import numpy as np

    import netreduce as nr
    nr.init()
    x = np.ones(1024, np.float32)
    if args.raw:  # the algorithm alone, as the executor calls it
        dp = nr.api._g.comm.dp
        run = lambda: dp.allreduce(x, None, op="sum")  # noqa: E731
        nr.allreduce(x, name="sync")                    # then nothing else negotiates
    else:
        run = lambda: nr.allreduce(x, name="g", op=nr.Sum)  # noqa: E731
    import resource
    for _ in range(args.warmup):
        run()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t = time.perf_counter()
    for _ in range(args.iters):
        run()
    per = (time.perf_counter() - t) / args.iters
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    # the whole process (every thread) per all-reduce: steadier than the time when the
    # machine is shared
    cpu_us = ((cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)) \
        / args.iters * 1e6
    ag = nr.api._g.comm.agreement
    spec = getattr(ag, "spec", None)  # absent in checkouts before speculation
    print(json.dumps({"rank": nr.rank(), "ms": per * 1e3, "cpu_us": cpu_us,
                      "rounds": getattr(ag, "rounds", 0),
                      "speculative": getattr(spec, "hits", 0)}), flush=True)
    nr.shutdown()


# --- drivers ------------------------------------------------------------------------
def _spawn_switch(pythonpath: str, *extra: str):
    env = dict(os.environ, PYTHONPATH=pythonpath)
    proc = subprocess.Popen([sys.executable, "-m", "netreduce.switch", "--host", "127.0.0.1",
                             "--port", "0", "--max-jobs", "64", *extra], stdout=subprocess.PIPE,
                            text=True, env=env, cwd=pythonpath)
    line = proc.stdout.readline()
    addr = line.split("listening on ")[1].split()[0]
    return proc, addr


def drive_scale(args: argparse.Namespace) -> Dict[str, Any]:
    proc, addr = _spawn_switch(REPO)
    job = "scale-" + uuid.uuid4().hex[:6]
    per = [args.ranks // args.procs + (1 if i < args.ranks % args.procs else 0)
           for i in range(args.procs)]
    firsts = [sum(per[:i]) for i in range(args.procs)]
    t_launch = time.time()
    workers = [subprocess.Popen(
        [sys.executable, __file__, "worker-scale", "--switch", addr, "--job", job,
         "--size", str(args.ranks), "--first", str(f), "--count", str(c),
         "--steps", str(args.steps)] + (["--rounds"] if args.rounds else []),
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=REPO))
        for f, c in zip(firsts, per)]
    outs = []
    try:
        for w in workers:
            out, _ = w.communicate(timeout=600)
            outs.append(json.loads(out.strip().splitlines()[-1]))
        threads = _threads(proc.pid)
    finally:
        proc.terminate()
        proc.wait()
    start = max(o["joined"] for o in outs) - min(o["t0"] for o in outs)
    steps = [max(r[i] for o in outs for r in o["steps"]) for i in range(args.steps)]
    rec: Dict[str, Any] = {
        "ranks": args.ranks, "procs": args.procs, "job_start_s": round(start, 3),
        "launch_to_joined_s": round(max(o["joined"] for o in outs) - t_launch, 3),
        "negotiation_ms_per_step_median": round(statistics.median(steps[1:]) * 1e3, 2),
        "first_step_ms": round(steps[0] * 1e3, 2), "daemon_threads": threads,
        "load": os.getloadavg()[0]}
    if args.rounds:
        rounds = [max(o["rounds"][i] for o in outs) for i in range(args.steps)]
        rec["agreement_round_ms_median"] = round(statistics.median(rounds[1:]) * 1e3, 2)
    rec.update(load_end=os.getloadavg()[0], commit=_commit(),
               utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    print(json.dumps(rec))
    return rec


def drive_scale_runs(args: argparse.Namespace) -> None:
    """--repeat runs of drive_scale; --json writes every run and the medians."""
    runs = [drive_scale(args) for _ in range(args.repeat)]
    keys = [k for k in ("job_start_s", "launch_to_joined_s", "negotiation_ms_per_step_median",
                        "agreement_round_ms_median") if k in runs[0]]
    summary = {k: {"median": statistics.median(r[k] for r in runs),
                   "min": min(r[k] for r in runs), "max": max(r[k] for r in runs)} for k in keys}
    print(json.dumps({"summary": summary}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python3 benchmarks/control_plane.py " + " ".join(sys.argv[1:]),
                       "summary": summary, "runs": runs}, f, indent=1)


def _commit(path: str = REPO) -> str:
    try:
        return subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _daemon_cpu_s(pid: int) -> float:
    from common import proc_stat  # this checkout's (benchmarks/ is sys.path[0])
    return proc_stat.cpu_seconds(pid)


def drive_join(args: argparse.Namespace) -> None:
    """--repeat runs of this checkout (``after``) and, with --before, interleaved
    runs of the earlier checkout too, so that both see the same load."""
    codes = {"after": args.code or REPO}
    if args.before:
        codes = {"before": args.before, **codes}
    runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name in codes}
    for _ in range(args.repeat):
        for name, code in codes.items():
            runs[name].append(_join_once(args, code))
            print(json.dumps(dict(runs[name][-1], variant=name)), flush=True)
    keys = ("join_s", "admission_s", "hello_after_admission_s", "hello_spread_s",
            "first_allreduce_s", "first_allreduce_slowest_rank_s", "resends_per_rank")
    summary = {name: {k: {"median": round(statistics.median(r[k] for r in rs), 4),
                          "min": min(r[k] for r in rs), "max": max(r[k] for r in rs)}
                      for k in keys} for name, rs in runs.items()}
    print(json.dumps({"summary": summary}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python3 benchmarks/control_plane.py " + " ".join(sys.argv[1:]),
                       "summary": summary, "runs": runs}, f, indent=1)


def _join_once(args: argparse.Namespace, code: str) -> Dict[str, Any]:
    load0 = os.getloadavg()
    proc, addr = _spawn_switch(code, *args.switch_args.split())
    job = "join-" + uuid.uuid4().hex[:6]
    per = [args.ranks // args.procs + (1 if i < args.ranks % args.procs else 0)
           for i in range(args.procs)]
    firsts = [sum(per[:i]) for i in range(args.procs)]
    cpu_d0 = _daemon_cpu_s(proc.pid)
    workers = [subprocess.Popen(
        [sys.executable, __file__, "worker-join", "--switch", addr, "--job", job,
         "--size", str(args.ranks), "--first", str(f), "--count", str(c)]
        + (["--no-hello"] if args.no_hello else []),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=code, **dict(e.split("=", 1) for e in args.env)))
        for f, c in zip(firsts, per)]
    outs = []
    try:
        for w in workers:
            line = w.stdout.readline()
            if not line:
                raise RuntimeError(f"a worker exited (rc {w.wait()}) without its report")
            outs.append(json.loads(line))
        cpu_daemon = _daemon_cpu_s(proc.pid) - cpu_d0
        for w in workers:
            w.stdin.write("leave\n")
            w.stdin.flush()
        for w in workers:
            w.wait(60)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        proc.terminate()
        proc.wait()
    errors = [e for o in outs for e in o["errors"]]
    if errors:
        raise RuntimeError(f"{sum(o['n_errors'] for o in outs)} ranks failed: {errors[:5]}")
    times = {k: [v for o in outs for v in o["times"][k]] for k in outs[0]["times"]}
    stats: Dict[str, int] = {}
    for o in outs:
        for k, v in o["stats"].items():
            stats[k] = stats.get(k, 0) + v
    t0 = min(times["start"])
    return {
        "ranks": args.ranks, "procs": args.procs,
        # the full join: first connection to the last hello returning
        "join_s": round(max(times["joined"]) - t0, 3),
        "admission_s": round(max(times["admitted"]) - t0, 3),
        "hello_after_admission_s": round(max(times["joined"]) - max(times["admitted"]), 3),
        # the first all-reduce: the last hello returning to the last result
        "first_allreduce_s": round(max(times["done"]) - max(times["joined"]), 3),
        # the first hello to return came this long before the last one
        "hello_spread_s": round(max(times["joined"]) - min(times["joined"]), 3),
        "hello_spread_per_process_s": [round(max(o["times"]["joined"]) - min(o["times"]["joined"]),
                                             3) for o in outs],
        "hello_first_per_process_s": [round(min(o["times"]["joined"]) - t0, 3) for o in outs],
        "first_allreduce_slowest_rank_s": round(max(d - j for d, j in zip(times["done"],
                                                                          times["joined"])), 3),
        "resends": stats.get("retransmits", 0),
        "resends_per_rank": round(stats.get("retransmits", 0) / args.ranks, 3),
        "max_resends_one_rank": max(o["max_retransmits"] for o in outs),
        "ranks_that_resent": sum(1 for o in outs for n in o.get("rank_retransmits", []) if n),
        # the first answer's round trip per rank (a held notice for all but the last
        # rank): what a timer before the first sample has to outwait (engines that
        # report first_rtt_us only)
        "first_rtt_ms": _percentiles([v / 1e3 for o in outs for v in o.get("first_rtt_us", [])
                                      if v]),
        "engine": {k: stats[k] for k in ("fast_retransmits", "timeout_probes", "tail_probes",
                                         "held_notices", "held_probes", "spurious_retransmits",
                                         "packets_sent", "packets_received", "ignored_results")
                   if k in stats},
        "cpu_s": {"ranks": round(sum(o["cpu_s"] for o in outs), 2),
                  "daemon": round(cpu_daemon, 2)},
        "load": [round(x, 2) for x in load0 + os.getloadavg()],
        "commit": _commit(code), "code": code, "env": args.env,
        "switch_args": args.switch_args,
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _percentiles(vals: List[float]) -> Dict[str, float]:
    if not vals:
        return {}
    vals = sorted(vals)
    at = lambda q: round(vals[min(len(vals) - 1, int(q * len(vals)))], 2)  # noqa: E731
    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(vals[-1], 2),
            "over_2.5ms": sum(v > 2.5 for v in vals), "over_25ms": sum(v > 25 for v in vals),
            "n": len(vals)}


def _threads(pid: int) -> int:
    from common import proc_stat  # this checkout's (benchmarks/ is sys.path[0])
    try:
        return proc_stat.status_int(pid, "Threads")
    except KeyError:
        return -1


VARIANTS = {  # name -> (code, env)
    "before": ("before", {}),
    "coordinator": ("after", {"NETREDUCE_CACHE_AGREEMENT": "0"}),
    "agreement": ("after", {"NETREDUCE_CACHE_AGREEMENT": "1"}),
    # no rounds either: the executor stays idle while the script calls the algorithm
    "dataplane": ("after", {"RAW": "1", "NETREDUCE_CACHE_AGREEMENT": "0"}),
    # failover on (the job's own aggregator as its standby, rendezvous at rank 0)
    "failover-coordinator": ("after", {"STANDBY": "1", "NETREDUCE_CACHE_AGREEMENT": "0"}),
    "failover-agreement": ("after", {"STANDBY": "1", "NETREDUCE_CACHE_AGREEMENT": "1"}),
}


def _one_step_run(code_path: str, addr: str, env_extra: Dict[str, str], args,
                  cpu: Any = None) -> float:
    """The slowest rank's ms per all-reduce; ``cpu`` (a list) gets the ranks' summed
    CPU µs per all-reduce."""
    job = uuid.uuid4().hex[:8]
    from netreduce.process import free_tcp_port
    rendezvous = f"127.0.0.1:{free_tcp_port()}"
    procs = []
    for r in range(args.np):
        env = dict(os.environ, PYTHONPATH=code_path, NETREDUCE_RANK=str(r),
                   NETREDUCE_SIZE=str(args.np), NETREDUCE_LOCAL_RANK=str(r),
                   NETREDUCE_LOCAL_SIZE=str(args.np), NETREDUCE_SWITCH=addr,
                   NETREDUCE_JOB=job, **env_extra)
        raw = env.pop("RAW", None)
        if env.pop("STANDBY", None):
            env.update(NETREDUCE_STANDBY_SWITCH=addr, NETREDUCE_RENDEZVOUS=rendezvous)
        cmd = [sys.executable, os.path.join(HERE, "control_plane.py"), "worker-step",
               "--iters", str(args.iters), "--warmup", str(args.warmup)]
        procs.append(subprocess.Popen(cmd + (["--raw"] if raw else []), env=env,
                                      stdout=subprocess.PIPE, text=True, cwd=code_path))
    ms, cpu_us = [], 0.0
    for p in procs:
        out, _ = p.communicate(timeout=600)
        lines = out.strip().splitlines()
        last = json.loads(lines[-1]) if p.returncode == 0 and lines else {}
        ms.append(last.get("ms", float("nan")))
        cpu_us += last.get("cpu_us", float("nan"))
    if cpu is not None:
        cpu.append(cpu_us)
    return max(ms)


def drive_step(args: argparse.Namespace) -> None:
    paths = {"after": REPO, "before": args.before}
    names = [v for v in args.variants.split(",") if v != "before" or args.before]
    switches = {k: _spawn_switch(p) for k, p in paths.items() if p}
    results: Dict[str, List[float]] = {}
    cpu: Dict[str, List[float]] = {}
    try:
        for _ in range(args.repeat):  # interleaved: every cell once per repeat
            for alg in args.algorithms.split(","):
                for cycle in args.cycles.split(","):
                    for name in names:
                        if name == "dataplane" and cycle != args.cycles.split(",")[0]:
                            continue
                        code, env = VARIANTS[name]
                        env = dict(env, NETREDUCE_ALGORITHM=alg, NETREDUCE_CYCLE_TIME=cycle)
                        key = f"{alg} cycle={cycle} {name}"
                        ms = _one_step_run(paths[code], switches[code][1], env, args,
                                           cpu.setdefault(key, []))
                        results.setdefault(key, []).append(ms)
    finally:
        for proc, _ in switches.values():
            proc.terminate()
            proc.wait()
    print(f"# N={args.np}, 4 KiB float32, {args.iters} iters x {args.repeat} runs, "
          f"load {os.getloadavg()[0]:.1f}; ms per all-reduce (slowest rank), median [runs]")
    for key, vals in results.items():
        print(f"{key:40s} {statistics.median(vals):7.3f}  "
              f"[{' '.join(f'{v:.3f}' for v in vals)}]")
    # What negotiation adds per step: the public-API step minus the algorithm alone
    # (the target: <= 0.1 ms); per repeat, as the cells of a repeat ran back to back.
    first = args.cycles.split(",")[0]
    for key, vals in results.items():
        alg, cycle, name = key.split()
        floor = results.get(f"{alg} cycle={first} dataplane")
        if name in ("agreement", "before") and floor:
            extra = [v - f for v, f in zip(vals, floor)]
            print(f"{f'{alg} {cycle} {name} - dataplane':40s} {statistics.median(extra):7.3f}  "
                  f"[{' '.join(f'{v:.3f}' for v in extra)}]")
    print("# CPU µs per all-reduce, all ranks' processes summed (every thread), median [runs]")
    for key, vals in cpu.items():
        print(f"{key:40s} {statistics.median(vals):7.1f}  [{' '.join(f'{v:.1f}' for v in vals)}]")
    for key, vals in cpu.items():  # the control cost of a step in CPU, per repeat
        alg, cycle, name = key.split()
        floor = cpu.get(f"{alg} cycle={first} dataplane")
        if name in ("agreement", "before") and floor:
            extra = [v - f for v, f in zip(vals, floor)]
            print(f"{f'{alg} {cycle} {name} - dataplane':40s} {statistics.median(extra):7.1f}  "
                  f"[{' '.join(f'{v:.1f}' for v in extra)}]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "load": os.getloadavg(),
                       "results": results, "cpu_us": cpu}, f, indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("scale")
    s.add_argument("--ranks", type=int, default=1000)
    s.add_argument("--procs", type=int, default=4)
    s.add_argument("--steps", type=int, default=20)
    s.add_argument("--rounds", action="store_true")
    s.add_argument("--repeat", type=int, default=1)
    s.add_argument("--json", default="")
    st = sub.add_parser("step")
    st.add_argument("--np", type=int, default=4)
    st.add_argument("--iters", type=int, default=1000)
    st.add_argument("--warmup", type=int, default=100)
    st.add_argument("--repeat", type=int, default=3)
    st.add_argument("--before", default="")
    st.add_argument("--variants", default="before,coordinator,agreement,dataplane")
    st.add_argument("--cycles", default="1,0")
    st.add_argument("--algorithms", default="auto,flat")
    st.add_argument("--json", default="")
    j = sub.add_parser("join")
    j.add_argument("--ranks", type=int, default=1000)
    j.add_argument("--procs", type=int, default=4)
    j.add_argument("--repeat", type=int, default=3)
    j.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment of the rank processes (e.g. NETREDUCE_RETRANSMIT_MS=1)")
    j.add_argument("--switch-args", default="", help="extra netreduce-switch options")
    j.add_argument("--code", default="",
                   help="run the daemon and the ranks from this checkout (e.g. a worktree of "
                        "an earlier commit with the same native module); default: this one")
    j.add_argument("--before", default="",
                   help="also run this checkout (an earlier commit, same native module or "
                        "its own), interleaved with this one in every repeat")
    j.add_argument("--no-hello", action="store_true",
                   help="each rank's first all-reduce right after its admission (no "
                        "negotiation hello): the first sum then waits for the last rank's "
                        "engine to start, not for the last hello")
    j.add_argument("--json", default="")
    wj = sub.add_parser("worker-join")
    for a in ("--switch", "--job"):
        wj.add_argument(a, required=True)
    for a in ("--size", "--first", "--count"):
        wj.add_argument(a, type=int, required=True)
    wj.add_argument("--no-hello", action="store_true")
    w = sub.add_parser("worker-scale")
    for a in ("--switch", "--job"):
        w.add_argument(a, required=True)
    for a in ("--size", "--first", "--count", "--steps"):
        w.add_argument(a, type=int, required=True)
    w.add_argument("--rounds", action="store_true")
    ws = sub.add_parser("worker-step")
    ws.add_argument("--iters", type=int, default=1000)
    ws.add_argument("--warmup", type=int, default=100)
    ws.add_argument("--raw", action="store_true")
    args = p.parse_args()
    {"scale": drive_scale_runs, "step": drive_step, "join": drive_join, "worker-scale": worker_scale,
     "worker-step": worker_step, "worker-join": worker_join}[args.mode](args)


if __name__ == "__main__":
    main()
