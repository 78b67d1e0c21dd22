#!/usr/bin/env python3
"""Reduce-scatter and all-gather: netreduce against gloo and Horovod, same run.

    PYTHONPATH=. python benchmarks/collectives.py --np 4 --size 64M --iters 5

Loopback: every rank and the aggregator on this machine. netreduce runs the flat
algorithm, so its reduce-scatter is the aggregator's owner delivery (each rank
receives S/N; docs/protocol.md) and its all-gather a sum of zero-padded buffers (each
rank sends and receives the whole output). gloo is torch.distributed's
reduce_scatter_tensor / all_gather_into_tensor; Horovod is 0.28.1 over Gloo
(hvd.reducescatter / hvd.allgather) under horovodrun.

Sizes: reduce-scatter of an S-byte float32 buffer per rank (S/N out); all-gather of
S/N per rank (S out). Time: per iteration the slowest rank's, median over --iters
after one warm-up (ranks start each iteration together after a barrier).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


# --- worker (one rank) ------------------------------------------------------------------
def _worker(impl: str, size_bytes: int, iters: int,
            only: tuple = ("reducescatter", "allgather")) -> None:
    import torch
    torch.set_num_threads(1)
    if impl == "horovod":
        import horovod.torch as hvd
    elif impl in ("netreduce", "netreduce-seq"):
        import netreduce.torch as hvd
        if impl == "netreduce-seq":  # reduce-scatter as one message per owner, in order
            from netreduce.algorithms.flat import Flat
            Flat.interleave = False
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="env://")
    if impl != "gloo":
        hvd.init()
        rank, n = hvd.rank(), hvd.size()
        barrier = hvd.barrier if impl.startswith("netreduce") else \
            (lambda: hvd.allreduce(torch.zeros(1), name="bench.barrier"))
        rs = lambda x: hvd.reducescatter(x, op=hvd.Sum)  # noqa: E731
        ag = lambda x: hvd.allgather(x)  # noqa: E731
    else:
        rank, n = dist.get_rank(), dist.get_world_size()
        barrier = dist.barrier

        def rs(x):
            out = torch.empty(x.numel() // n)
            dist.reduce_scatter_tensor(out, x)
            return out

        def ag(x):
            out = torch.empty(x.numel() * n)
            dist.all_gather_into_tensor(out, x)
            return out
    count = size_bytes // 4 // n * n
    full = torch.full((count,), float(rank + 1))
    part = torch.full((count // n,), float(rank + 1))
    times: Dict[str, List[float]] = {"reducescatter": [], "allgather": []}
    for i in range(iters + 1):
        for kind, fn, x in (("reducescatter", rs, full), ("allgather", ag, part)):
            if kind not in only:
                continue
            barrier()
            t0 = time.perf_counter()
            out = fn(x)
            dt = time.perf_counter() - t0
            if i == 0:  # verified warm-up
                want = n * (n + 1) / 2 if kind == "reducescatter" else None
                if want is not None:
                    assert out.numel() == count // n and float(out[0]) == want, (kind, out[:3])
                else:
                    assert out.numel() == count and float(out[-1]) == n, (kind, out[-3:])
            else:
                times[kind].append(dt)
    record = {"rank": rank, "n": n, "times": times}
    if impl.startswith("netreduce"):  # were there resends? (loss, or a descheduled rank)
        from netreduce import api
        stats = api._communicator().dp.stats()
        record["engine"] = {k: stats.get(k) for k in ("retransmits", "fast_retransmits",
                                                      "timeout_probes", "srtt_us")}
    print("RESULT " + json.dumps(record), flush=True)
    barrier()
    if impl == "gloo":
        dist.destroy_process_group()
    else:
        hvd.shutdown()


# --- launching ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(impl: str, n: int, size_bytes: int, iters: int) -> Dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1", NETREDUCE_ALGORITHM="flat",
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    worker = [sys.executable, os.path.abspath(__file__), "--worker", impl,
              "--size", str(size_bytes), "--iters", str(iters)]
    if impl.startswith("netreduce"):
        procs = [subprocess.Popen([sys.executable, "-m", "netreduce.launcher", "-np", str(n),
                                   "--", *worker], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)]
    elif impl == "horovod":
        procs = [subprocess.Popen(["horovodrun", "-np", str(n), "--gloo", "-H",
                                   f"localhost:{n}", *worker], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)]
    else:
        port = _free_port()
        procs = [subprocess.Popen(worker, env=dict(env, MASTER_ADDR="127.0.0.1",
                                                   MASTER_PORT=str(port), RANK=str(r),
                                                   WORLD_SIZE=str(n)),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(n)]
    out = ""
    for p in procs:
        text, _ = p.communicate(timeout=900)
        out += text
        if p.returncode != 0:
            raise SystemExit(f"{impl} N={n} failed:\n{out[-4000:]}")
    per_rank = [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines()
                if "RESULT " in line]
    result = {}
    for kind in ("reducescatter", "allgather"):
        slowest = [max(r["times"][kind][i] for r in per_rank) for i in range(iters)]
        result[kind] = statistics.median(slowest)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", default="")
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--size", default="64M", help="reduce-scatter input per rank")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--impls", default="netreduce,gloo,horovod")
    parser.add_argument("--json", default="")
    parser.add_argument("--only", default="reducescatter,allgather",
                        help="worker: the collectives to run")
    args = parser.parse_args()
    text = str(args.size).upper().rstrip("B").rstrip("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    size_bytes = int(float(text.rstrip("KMG")) * scale)
    if args.worker:
        _worker(args.worker, size_bytes, args.iters, tuple(args.only.split(",")))
        return 0
    impls = args.impls.split(",")
    results = {impl: _run(impl, args.np, size_bytes, args.iters) for impl in impls}
    print(f"N={args.np}, S={size_bytes / 2**20:.0f} MiB float32, median of {args.iters} "
          f"(slowest rank per iteration); load: {os.getloadavg()[0]:.1f}")
    print(f"{'collective':<14}" + "".join(f"{i:>12}" for i in impls) +
          ("   netreduce/gloo" if "gloo" in impls and "netreduce" in impls else ""))
    for kind in ("reducescatter", "allgather"):
        row = f"{kind:<14}" + "".join(f"{results[i][kind] * 1e3:>10.1f}ms" for i in impls)
        if "gloo" in impls and "netreduce" in impls:
            row += f"   {results['netreduce'][kind] / results['gloo'][kind]:>8.2f}x"
        print(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"np": args.np, "size": size_bytes, "iters": args.iters,
                       "results": results, "load": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
