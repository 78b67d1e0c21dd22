"""benchmarks/control_plane.py ``scale``: ``--ranks`` simulated ranks (the real
NegotiationClient, no data plane) in ``--procs`` processes against one real
netreduce-switch: the job's start and the negotiation per step through the
coordinator; ``--rounds`` the agreement round at that scale too."""
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

from common import commit_of
from control_plane_daemon import spawn_switch, threads_of

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SCRIPT = os.path.join(HERE, "control_plane.py")  # the workers' command line


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


def drive_scale(args: argparse.Namespace) -> Dict[str, Any]:
    proc, addr = spawn_switch(REPO)
    job = "scale-" + uuid.uuid4().hex[:6]
    per = [args.ranks // args.procs + (1 if i < args.ranks % args.procs else 0)
           for i in range(args.procs)]
    firsts = [sum(per[:i]) for i in range(args.procs)]
    t_launch = time.time()
    workers = [subprocess.Popen(
        [sys.executable, SCRIPT, "worker-scale", "--switch", addr, "--job", job,
         "--size", str(args.ranks), "--first", str(f), "--count", str(c),
         "--steps", str(args.steps)] + (["--rounds"] if args.rounds else []),
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=REPO))
        for f, c in zip(firsts, per)]
    outs = []
    try:
        for w in workers:
            out, _ = w.communicate(timeout=600)
            outs.append(json.loads(out.strip().splitlines()[-1]))
        threads = threads_of(proc.pid)
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
    rec.update(load_end=os.getloadavg()[0], commit=commit_of(REPO),
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
