#!/usr/bin/env python3
"""Reduce-scatter and all-gather on the emulated testbed (root): netreduce against
gloo and Horovod in one run, each host's wire bytes read off its link; and an FSDP
training step on the netreduce backend against FSDP on gloo.

    PYTHONPATH=. python benchmarks/collectives_testbed.py --np 4 --size 64M --iters 3 \\
        --rate 1gbit --json benchmarks/results/collectives_testbed_n4.json

One network namespace per rank ("host"), the aggregator in its own, links shaped to
--rate each way (the aggregator's N x rate; docs/testbed.md). The collectives are
benchmarks/collectives.py's workers (same sizes, same timing: the slowest rank per
iteration, median after a verified warm-up); netreduce runs the flat algorithm, so
its reduce-scatter is the aggregator's owner delivery. Each impl's wire bytes per
host (both directions, all iterations including the warm-up) are divided by the
iterations and set against the ideal: INA sends S and receives S/N per host, a ring
reduce-scatter sends and receives (N-1)/N x S.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
if REPO not in sys.path:
    sys.path.insert(1, REPO)

import allreduce_launch as launch  # noqa: E402  (wait_all, worker_env, free_port)
import common  # noqa: E402

COLLECTIVES = os.path.join(HERE, "collectives.py")
FSDP = os.path.join(REPO, "examples", "pytorch_fsdp.py")


def _launch_env(tb, impl: str, n: int, cleanup: list) -> tuple:
    """(environment common to all ranks, one per rank) for impl on the testbed."""
    common_env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    per_rank: List[Dict[str, str]] = [{} for _ in range(n)]
    if impl in ("netreduce", "netreduce-seq", "fsdp-netreduce"):
        sw = tb.spawn_switch()
        cleanup.append(sw.stop)
        common_env.update(NETREDUCE_SWITCH=f"{sw.address[0]}:{sw.address[1]}",
                          NETREDUCE_JOB=f"coll-{uuid.uuid4().hex[:8]}", NETREDUCE_SIZE=str(n),
                          NETREDUCE_LOCAL_SIZE="1", NETREDUCE_ALGORITHM="flat")
        for r in range(n):
            per_rank[r].update(NETREDUCE_RANK=str(r), NETREDUCE_LOCAL_RANK="0")
    if impl in ("gloo", "fsdp-gloo", "fsdp-netreduce"):
        # TCPStore in host 0's namespace, reached over the emulated links.
        common_env.update(MASTER_ADDR=tb.hosts[0].address, MASTER_PORT=str(launch.free_port()),
                          WORLD_SIZE=str(n), LOCAL_WORLD_SIZE="1",
                          GLOO_SOCKET_IFNAME=tb.ifname)
        for r in range(n):
            per_rank[r].update(RANK=str(r), LOCAL_RANK="0")
    if impl == "horovod":
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousServer
        rdv = RendezvousServer(verbose=0)
        port = rdv.start()
        cleanup.append(rdv.stop)
        plan = get_host_assignments(parse_hosts(",".join(f"h{i}:1" for i in range(n))), n)
        rdv.init(plan)
        common_env.update(HOROVOD_GLOO_RENDEZVOUS_ADDR=tb.plan.bridge_address,
                          HOROVOD_GLOO_RENDEZVOUS_PORT=str(port), HOROVOD_CONTROLLER="gloo",
                          HOROVOD_CPU_OPERATIONS="gloo", HOROVOD_GLOO_IFACE=tb.ifname)
        for r, slot in enumerate(plan):
            per_rank[r].update(
                HOROVOD_HOSTNAME=slot.hostname, HOROVOD_RANK=str(slot.rank),
                HOROVOD_SIZE=str(slot.size), HOROVOD_LOCAL_RANK=str(slot.local_rank),
                HOROVOD_LOCAL_SIZE=str(slot.local_size), HOROVOD_CROSS_RANK=str(slot.cross_rank),
                HOROVOD_CROSS_SIZE=str(slot.cross_size))
    return common_env, per_rank


def _run(tb, impl: str, n: int, argv: List[str], timeout: float) -> Dict:
    """Rank r of argv in host r; returns the logs and each host's wire bytes."""
    cleanup: list = []
    tmp = tempfile.mkdtemp(prefix=f"nrcoll-{impl}-")
    logs = [os.path.join(tmp, f"rank{r}.log") for r in range(n)]
    try:
        common_env, per_rank = _launch_env(tb, impl, n, cleanup)
        before = tb.counters()
        procs = []
        for r in range(n):
            env = launch.worker_env(dict(common_env, **per_rank[r]))
            with open(logs[r], "w") as log:
                procs.append(tb.popen(r, argv, env=env, cwd=REPO, stdout=log,
                                      stderr=subprocess.STDOUT))
        t0 = time.monotonic()
        launch.wait_all(procs, timeout, f"{impl} N={n}")
        wall = time.monotonic() - t0
        after = tb.counters()
        wire = {h.name: {k: after[h.name][k] - before[h.name][k] for k in ("tx_bytes", "rx_bytes")}
                for h in tb.hosts}
        texts = []
        for path in logs:
            with open(path, errors="replace") as f:
                texts.append(f.read())
        return {"logs": texts, "wire": wire, "wall_s": wall}
    except RuntimeError as exc:
        tail = open(logs[0], errors="replace").read()[-2000:] if os.path.exists(logs[0]) else ""
        raise SystemExit(f"{impl}: {exc}\n{tail}") from None
    finally:
        common.run_cleanups(cleanup)
        shutil.rmtree(tmp, ignore_errors=True)


def collectives(tb, impl: str, n: int, size_bytes: int, iters: int, timeout: float) -> Dict:
    argv = [sys.executable, COLLECTIVES, "--worker", impl, "--size", str(size_bytes),
            "--iters", str(iters)]
    got = _run(tb, impl, n, argv, timeout)
    per_rank = [json.loads(line.split("RESULT ", 1)[1]) for text in got["logs"]
                for line in text.splitlines() if "RESULT " in line]
    if len(per_rank) != n:
        raise SystemExit(f"{impl}: {len(per_rank)} of {n} ranks reported:\n{got['logs'][0][-2000:]}")
    out = {"wire_per_iter": {}, "engine": [r.get("engine") for r in per_rank]}
    for kind in ("reducescatter", "allgather"):
        slowest = [max(r["times"][kind][i] for r in per_rank) for i in range(iters)]
        out[kind] = statistics.median(slowest)
    # both collectives ran iters + 1 times: per (reduce-scatter + all-gather) pair
    out["wire_per_iter"] = {h: {k: v / (iters + 1) for k, v in w.items()}
                            for h, w in got["wire"].items()}
    return out


def reducescatter_wire(tb, impl: str, n: int, size_bytes: int, iters: int,
                       timeout: float) -> Dict[str, float]:
    """Mean bytes per host per reduce-scatter alone (a run without all-gathers)."""
    argv = [sys.executable, COLLECTIVES, "--worker", impl, "--size", str(size_bytes),
            "--iters", str(iters), "--only", "reducescatter"]
    got = _run(tb, impl, n, argv, timeout)
    tx = statistics.mean(w["tx_bytes"] for w in got["wire"].values()) / (iters + 1)
    rx = statistics.mean(w["rx_bytes"] for w in got["wire"].values()) / (iters + 1)
    return {"tx_bytes": tx, "rx_bytes": rx}


def fsdp_step(tb, backend: str, n: int, steps: int, fsdp2: bool, timeout: float) -> Dict:
    argv = [sys.executable, FSDP, "--backend", backend, "--steps", str(steps)]
    if fsdp2:
        argv.append("--fsdp2")
    got = _run(tb, f"fsdp-{backend}", n, argv, timeout)
    m = re.search(r"loss ([\d.]+) -> ([\d.]+) \((fell|DID NOT FALL)\); parameters (\w+); "
                  r"median step ([\d.]+) ms", got["logs"][0])
    if not m:
        raise SystemExit(f"FSDP on {backend}: no summary line:\n{got['logs'][0][-2000:]}")
    return {"loss": [float(m.group(1)), float(m.group(2))], "digest": m.group(4),
            "step_ms": float(m.group(5))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--size", default="64M", help="reduce-scatter input per rank")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--impls", default="netreduce,gloo,horovod")
    ap.add_argument("--fsdp-steps", type=int, default=20, help="0 = no FSDP runs")
    ap.add_argument("--name", default="nrcoll", help="testbed name (1-9 characters)")
    ap.add_argument("--subnet", default="10.78.12.0/24")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    from netreduce.testbed import Testbed, why_unusable
    reason = why_unusable()
    if reason:
        print(f"collectives_testbed.py: {reason}", file=sys.stderr)
        return 2
    text = str(args.size).upper().rstrip("B").rstrip("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    size_bytes = int(float(text.rstrip("KMG")) * scale)
    impls = args.impls.split(",")
    n = args.np
    meta = {"date": common.utc_now(), "command": common.command_line(), "np": n,
            "size": size_bytes, "iters": args.iters, "rate": args.rate,
            "loadavg_at_start": os.getloadavg()}
    results: Dict[str, Dict] = {}
    wire: Dict[str, Dict] = {}
    fsdp: Dict[str, Dict] = {}
    with Testbed(hosts=n, rate=args.rate, name=args.name, subnet=args.subnet) as tb:
        for impl in impls:
            results[impl] = collectives(tb, impl, n, size_bytes, args.iters, args.timeout)
            wire[impl] = reducescatter_wire(tb, impl, n, size_bytes, 1, args.timeout)
        if args.fsdp_steps:
            for fsdp2 in (False, True):
                for backend in ("netreduce", "gloo"):
                    key = f"{'fsdp2' if fsdp2 else 'fsdp'}-{backend}"
                    fsdp[key] = fsdp_step(tb, backend, n, args.fsdp_steps, fsdp2, args.timeout)
    meta["loadavg_at_end"] = os.getloadavg()
    print(f"testbed N={n}, {args.rate} per host link, S={size_bytes / 2**20:.0f} MiB float32; "
          f"median of {args.iters} (slowest rank); load {meta['loadavg_at_start'][0]:.1f} -> "
          f"{meta['loadavg_at_end'][0]:.1f}")
    print(f"{'collective':<14}" + "".join(f"{i:>12}" for i in impls) +
          ("   netreduce/gloo" if "gloo" in impls and "netreduce" in impls else ""))
    for kind in ("reducescatter", "allgather"):
        row = f"{kind:<14}" + "".join(f"{results[i][kind] * 1e3:>10.1f}ms" for i in impls)
        if "gloo" in impls and "netreduce" in impls:
            row += f"   {results['netreduce'][kind] / results['gloo'][kind]:>8.2f}x"
        print(row)
    print(f"reduce-scatter wire bytes per host (MiB; ideal: INA tx S={size_bytes / 2**20:.0f}, "
          f"rx S/N={size_bytes / n / 2**20:.0f}; ring tx = rx = (N-1)/N S="
          f"{size_bytes * (n - 1) / n / 2**20:.0f})")
    for impl in impls:
        print(f"  {impl:<12} tx {wire[impl]['tx_bytes'] / 2**20:8.1f}  "
              f"rx {wire[impl]['rx_bytes'] / 2**20:8.1f}")
    for key, f in fsdp.items():
        print(f"{key:<16} median step {f['step_ms']:.1f} ms, loss {f['loss'][0]:.4f} -> "
              f"{f['loss'][1]:.4f}, parameters {f['digest']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "results": results, "reducescatter_wire": wire,
                       "fsdp": fsdp}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
