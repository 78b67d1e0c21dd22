#!/usr/bin/env python3
"""All-reduce benchmark: netreduce's data plane side by side with the all-reduces
people use today, measured in the same run, printed like nccl-tests.

Loopback (issue 2): all processes on this machine, no emulated network.

    PYTHONPATH=. python benchmarks/allreduce.py                      # 4 KiB..256 MiB, N=2,4
    PYTHONPATH=. python benchmarks/allreduce.py --quick --json /tmp/a.json

Testbed (issue 5, root): one network namespace per rank, links shaped to --rate,
the aggregator's link N x rate (see docs/testbed.md). Adds Open MPI and Horovod.

    PYTHONPATH=. python benchmarks/allreduce.py --testbed --rate 1gbit --np 4,8 \\
        --json benchmarks/results/testbed.json --plot benchmarks/results/testbed.png

Implementations (--impls): netreduce (the raw data plane: netreduce.worker.dataplane over a
netreduce-switch), gloo (torch.distributed, gloo backend, ring all-reduce), mpi
(mpi4py MPI_Allreduce, Open MPI forced onto TCP over the emulated links), horovod
(Horovod 0.28.1 with Gloo; benchmarks/setup_peers.sh installs it).

Every rank times the same iterations after one verified warm-up; time is the
slowest rank's mean per iteration. Columns follow nccl-tests: algbw = S/t,
busbw = algbw x 2(N-1)/N (GB/s = 10^9 B/s). In testbed mode each rank also reads
its own link's byte counters (wire bytes per host each way) and its CPU time; rank 0
records the aggregator's CPU and the whole machine's busy fraction."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
if REPO not in sys.path:
    sys.path.insert(1, REPO)

import common  # noqa: E402

IMPLS = ("netreduce", "gloo", "mpi", "horovod")
QUEUE_DROPS: Dict[str, int] = {}  # "impl N=n" -> packets the testbed's shapers dropped
LOOPBACK_IMPLS = ("netreduce", "gloo")
TESTBED_IMPLS = IMPLS


# =============================================================================
# Worker side: one process per rank, runs the whole size sweep for one impl.
# =============================================================================
class _Netreduce:
    def __init__(self, cfg: dict, rank: int, size: int):
        from netreduce.worker import dataplane
        host, port = cfg["switch"]
        kw = {k: v for k, v in cfg.get("netreduce_connect", {}).items() if v is not None}
        self.conn = dataplane.connect((host, int(port)), job=cfg["job"], rank=rank, size=size,
                                      timeout=cfg["timeout"], **kw)
        self.in_place = False

    def run(self, src, dst):
        self.conn.allreduce(src, dst)

    def counters(self) -> dict:
        """Engine counters that explain extra wire bytes (retransmissions)."""
        st = self.conn.stats()
        return {"packets_sent": st.get("packets_sent", 0),
                "retransmits": st.get("retransmits", 0) + st.get("fast_retransmits", 0)}

    def close(self):
        try:
            self.stats = self.conn.stats()
        except Exception:
            self.stats = None
        self.conn.close()


class _Gloo:
    def __init__(self, cfg: dict, rank: int, size: int):
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo", init_method=f"tcp://{cfg['master']}", rank=rank,
                                world_size=size)
        self.in_place = True

    def run(self, src, dst):
        self.dist.all_reduce(dst)

    def close(self):
        self.dist.destroy_process_group()


class _Mpi:
    def __init__(self, cfg: dict, rank: int, size: int):
        from mpi4py import MPI
        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.in_place = False

    def run(self, src, dst):
        self.comm.Allreduce(src, dst, op=self.MPI.SUM)

    def close(self):
        pass


class _Horovod:
    def __init__(self, cfg: dict, rank: int, size: int):
        import torch
        import horovod.torch as hvd
        torch.set_num_threads(1)
        self.torch, self.hvd = torch, hvd
        hvd.init()
        assert hvd.size() == size, (hvd.size(), size)
        self.in_place = True
        self.name = None

    def run(self, src, dst):
        self.hvd.allreduce_(dst, op=self.hvd.Sum, name=self.name)

    def close(self):
        self.hvd.shutdown()


def _hierarchical(cfg: dict, rank: int, size: int):
    """netreduce's hierarchical algorithm (benchmarks/hierarchical.py runs it)."""
    from hierarchical import ApiImpl, HierarchicalImpl
    return (ApiImpl if cfg["impl"].endswith("-api") else HierarchicalImpl)(cfg, rank, size)


def _as_tensor(impl, arr):
    return impl.torch.from_numpy(arr) if hasattr(impl, "torch") else arr


def worker_main(cfg: dict) -> int:
    import numpy as np

    impl_name = cfg["impl"]
    if impl_name == "mpi":
        from mpi4py import MPI
        rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    else:
        rank, size = int(cfg["rank"]), int(cfg["np"])
    impl = {"netreduce": _Netreduce, "gloo": _Gloo, "mpi": _Mpi, "horovod": _Horovod,
            "hierarchical": _hierarchical, "hierarchical-api": _hierarchical}[impl_name](
        cfg, rank, size)
    out = open(cfg["out"].format(rank=rank), "w")
    switch_pid = cfg.get("switch_pid") if rank == 0 else None
    for nbytes in cfg["sizes"]:
        count = nbytes // 4
        # Rank r contributes pattern + r + 1; the pattern (period 251, prime to any
        # power-of-two chunk) makes a result written to the wrong offset visible, which
        # constant data would hide. Small integers: exact in float32.
        pattern = (np.arange(count, dtype=np.int32) % 251).astype(np.float32)
        src = pattern + np.float32(rank + 1)
        expected = pattern * np.float32(size) + np.float32(size * (size + 1) // 2)
        del pattern
        dst = np.empty_like(src)
        if impl.in_place:
            dst[:] = src
        a, b = _as_tensor(impl, src), _as_tensor(impl, dst)
        if hasattr(impl, "name"):
            impl.name = f"t{nbytes}"
        # Warm-up (also synchronises the ranks) and correctness check.
        impl.run(a, b)
        ok = bool(np.array_equal(dst, expected))
        del expected
        iters = common.iterations(nbytes, cfg["target_bytes"], cfg["min_iters"], cfg["max_iters"])
        wire0 = common.wire_counters(cfg.get("ifname"))
        mach0 = common.machine_cpu()
        sw0 = common.pid_cpu_seconds(switch_pid) if switch_pid else None
        ctr0 = impl.counters() if hasattr(impl, "counters") else None
        cpu0 = common.self_cpu_seconds()
        t0 = time.perf_counter()
        for _ in range(iters):
            impl.run(a, b)
        wall = time.perf_counter() - t0
        cpu = common.self_cpu_seconds() - cpu0
        rec = {"rank": rank, "size": nbytes, "iters": iters, "wall_s": wall,
               "time_s": wall / iters, "cpu_s": cpu, "ok": ok}
        if ctr0 is not None:
            ctr1 = impl.counters()
            for k in ctr0:
                rec[k] = (ctr1[k] - ctr0[k]) / iters
        wire1 = common.wire_counters(cfg.get("ifname"))
        if wire0 and wire1:
            rec["wire_tx"] = (wire1["tx"] - wire0["tx"]) / iters
            rec["wire_rx"] = (wire1["rx"] - wire0["rx"]) / iters
        if rank == 0:
            rec["machine_busy"] = common.machine_busy_fraction(mach0, common.machine_cpu())
            if switch_pid:
                try:
                    rec["switch_cpu_s"] = common.pid_cpu_seconds(switch_pid) - sw0
                except OSError:
                    pass
            t = rec["time_s"]
            print(f"  [{impl_name} N={size}] {common.fmt_size(nbytes):>9}  {t * 1e3:10.2f} ms  "
                  f"busbw {common.busbw(nbytes, t, size):6.3f} GB/s  cpu {cpu / wall:4.0%}  "
                  f"machine {rec['machine_busy']:4.0%}{'' if ok else '  WRONG RESULT'}",
                  file=sys.stderr, flush=True)
        out.write(json.dumps(rec) + "\n")
        out.flush()
        del a, b, src, dst
    impl.close()
    out.close()
    return 0


# =============================================================================
# Orchestrator side: starts switches, rendezvous servers and ranks; merges records.
# =============================================================================
class Runner:
    """Where ranks run: on this host (loopback) or one per testbed namespace."""

    def __init__(self, testbed=None):
        self.tb = testbed

    @property
    def ifname(self) -> Optional[str]:
        return self.tb.ifname if self.tb else None

    def host_addr(self, rank: int) -> str:
        return self.tb.hosts[rank].address if self.tb else "127.0.0.1"

    def driver_addr(self) -> str:
        """Address at which processes in the namespaces reach this process."""
        return self.tb.plan.bridge_address if self.tb else "127.0.0.1"

    def wrap(self, rank: int, argv: List[str]) -> List[str]:
        return self.tb.exec_argv(rank, argv) if self.tb else argv

    def spawn_switch(self, args: List[str]):
        """(address, pid, stop) of a netreduce-switch for this run."""
        if self.tb:
            sw = self.tb.spawn_switch(args=args)
            return sw.address, sw.pid, sw.stop
        from netreduce.switch import spawn
        sw = spawn(host="127.0.0.1", port=0, extra_args=args)
        return sw.address, sw.proc.pid, sw.stop


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _worker_env(extra: Dict[str, str]) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    # One core per rank is all there is; keep BLAS/OpenMP pools from competing.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def _wait_all(procs: List[subprocess.Popen], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    try:
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
                raise RuntimeError(f"{what}: rank(s) {bad} exited with {[codes[i] for i in bad]}")
            if all(c == 0 for c in codes):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not finished within {timeout:.0f} s")
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def run_impl(impl: str, n: int, runner: Runner, base_cfg: dict, args) -> List[dict]:
    """Run one implementation at world size n across all sizes; return per-rank records."""
    tmp = tempfile.mkdtemp(prefix=f"nrbench-{impl}-")
    cfg = dict(base_cfg, impl=impl, np=n, out=os.path.join(tmp, "rank{rank}.jsonl"),
               ifname=runner.ifname)
    me = os.path.abspath(__file__)
    env_extra: Dict[str, str] = {}
    cleanup = []
    try:
        if impl in ("netreduce", "hierarchical", "hierarchical-api"):
            address, pid, stop = runner.spawn_switch(shlex.split(args.switch_args))
            cleanup.append(stop)
            cfg.update(switch=list(address), switch_pid=pid, job=f"bench-{uuid.uuid4().hex[:8]}")
        elif impl == "gloo":
            cfg["master"] = f"{runner.host_addr(0)}:{_free_port()}"
            env_extra["GLOO_SOCKET_IFNAME"] = runner.ifname or "lo"
        elif impl == "horovod":
            from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
            from horovod.runner.http.http_server import RendezvousServer
            rdv = RendezvousServer(verbose=0)
            port = rdv.start()
            cleanup.append(rdv.stop)
            # One slot per namespace: every rank is its own host, as on a real cluster.
            hosts = getattr(runner, "horovod_hosts", None) or (
                ",".join(f"h{i}:1" for i in range(n)) if runner.tb else f"localhost:{n}")
            plan = get_host_assignments(parse_hosts(hosts), n)
            rdv.init(plan)
            env_extra.update(HOROVOD_GLOO_RENDEZVOUS_ADDR=runner.driver_addr(),
                             HOROVOD_GLOO_RENDEZVOUS_PORT=str(port), HOROVOD_CONTROLLER="gloo",
                             HOROVOD_CPU_OPERATIONS="gloo", HOROVOD_GLOO_IFACE=runner.ifname or "lo")
            cfg["horovod_plan"] = [(s.hostname, s.rank, s.local_rank, s.local_size, s.cross_rank,
                                    s.cross_size) for s in plan]
        cfg_path = os.path.join(tmp, "cfg.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)

        drops0 = sum(runner.tb.qdisc_drops().values()) if runner.tb else 0
        procs = []
        if impl == "mpi":
            mpi = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                   "--mca", "btl", getattr(args, "mpi_btl", None) or "tcp,self", "--mca", "btl_tcp_if_include", runner.ifname or "lo",
                   "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", *shlex.split(args.mpi_args)]
            if runner.tb:
                br = runner.tb.plan.bridge
                env_extra.update(PMIX_MCA_ptl_tcp_remote_connections="1", PMIX_MCA_ptl_tcp_if_include=br)
                mpi += ["--mca", "oob_tcp_if_include", br, "-x", "PMIX_MCA_ptl_tcp_remote_connections",
                        "-x", "PMIX_MCA_ptl_tcp_if_include"]
                apps = []
                for r in range(n):
                    apps += (["-np", "1"] + runner.wrap(r, [sys.executable, me, "--worker", cfg_path])
                             + ([":"] if r < n - 1 else []))
                argv = mpi + apps
            else:
                argv = mpi + ["-np", str(n), sys.executable, me, "--worker", cfg_path]
            procs.append(subprocess.Popen(argv, env=_worker_env(env_extra)))
        else:
            for r in range(n):
                env = _worker_env(env_extra)
                env["NRBENCH_RANK"] = str(r)
                if impl == "horovod":
                    s = plan[r]
                    env.update(HOROVOD_HOSTNAME=s.hostname, HOROVOD_RANK=str(s.rank),
                               HOROVOD_SIZE=str(s.size), HOROVOD_LOCAL_RANK=str(s.local_rank),
                               HOROVOD_LOCAL_SIZE=str(s.local_size), HOROVOD_CROSS_RANK=str(s.cross_rank),
                               HOROVOD_CROSS_SIZE=str(s.cross_size))
                procs.append(subprocess.Popen(runner.wrap(r, [sys.executable, me, "--worker", cfg_path]),
                                              env=env))
        _wait_all(procs, args.timeout, f"{impl} N={n}")
        if runner.tb:  # congestion losses at the shapers during this sweep
            QUEUE_DROPS[f"{impl} N={n}"] = sum(runner.tb.qdisc_drops().values()) - drops0
        recs = []
        for r in range(n):
            path = cfg["out"].format(rank=r)
            with open(path) as f:
                recs += [json.loads(line) for line in f if line.strip()]
        return recs
    finally:
        common.run_cleanups(cleanup)
        subprocess.run(["rm", "-rf", tmp])


def merge(impl: str, n: int, per_rank: List[dict]) -> List[dict]:
    """One record per size: time = slowest rank's mean; wire bytes = mean over hosts."""
    out = []
    for size in sorted({r["size"] for r in per_rank}):
        rs = [r for r in per_rank if r["size"] == size]
        t = max(r["time_s"] for r in rs)
        rec = {"impl": impl, "np": n, "size": size, "count": size // 4, "dtype": "float32",
               "iters": rs[0]["iters"], "time_s": t, "algbw_GBps": common.algbw(size, t),
               "busbw_GBps": common.busbw(size, t, n), "correct": all(r["ok"] for r in rs),
               "ranks": len(rs),
               "cpu_worker_mean": sum(r["cpu_s"] / r["wall_s"] for r in rs) / len(rs),
               "cpu_worker_max": max(r["cpu_s"] / r["wall_s"] for r in rs)}
        r0 = next((r for r in rs if r["rank"] == 0), rs[0])
        if "machine_busy" in r0:
            rec["machine_busy"] = r0["machine_busy"]
        if "switch_cpu_s" in r0:
            rec["cpu_switch"] = r0["switch_cpu_s"] / r0["wall_s"]
        if all("retransmits" in r for r in rs):
            rec["packets_per_rank"] = sum(r["packets_sent"] for r in rs) / len(rs)
            rec["retransmits_per_rank"] = sum(r["retransmits"] for r in rs) / len(rs)
        if all("wire_tx" in r for r in rs):
            rec["wire_tx_per_host"] = sum(r["wire_tx"] for r in rs) / len(rs)
            rec["wire_rx_per_host"] = sum(r["wire_rx"] for r in rs) / len(rs)
            rec["wire_tx_max"] = max(r["wire_tx"] for r in rs)
            rec["wire_rx_max"] = max(r["wire_rx"] for r in rs)
        out.append(rec)
    return out


def add_ratios(records: List[dict]) -> None:
    """time(netreduce) / time(other) for every other impl at the same N and size."""
    index = {(r["impl"], r["np"], r["size"]): r for r in records}
    for r in records:
        if r["impl"] != "netreduce":
            continue
        for other in IMPLS[1:]:
            o = index.get((other, r["np"], r["size"]))
            if o and o["time_s"] > 0:
                r[f"ratio_vs_{other}"] = r["time_s"] / o["time_s"]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", default=None, help="world sizes, comma-separated (default 2,4; testbed 4,8)")
    ap.add_argument("--impls", default=None,
                    help=f"comma-separated subset of {','.join(IMPLS)} "
                         f"(default loopback: {','.join(LOOPBACK_IMPLS)}; testbed: all)")
    ap.add_argument("--min-size", default=None, help="smallest message (default 4K; testbed 256K)")
    ap.add_argument("--max-size", default="256M", help="largest message (default 256M)")
    ap.add_argument("--factor", type=int, default=4, help="size step factor (default 4)")
    ap.add_argument("--target-bytes", default=None,
                    help="bytes to move per size, setting the iteration count (default 512M; testbed 64M)")
    ap.add_argument("--min-iters", type=int, default=None, help="timed iterations at least (default 3; testbed 2)")
    ap.add_argument("--max-iters", type=int, default=200, help="timed iterations at most (default 200)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: sizes up to 4M (testbed 16M), few iterations, N=2 (testbed 4)")
    ap.add_argument("--testbed", action="store_true", help="run each rank in its own emulated host (root)")
    ap.add_argument("--rate", default="1gbit", help="testbed: per-host link rate (default 1gbit)")
    ap.add_argument("--loss", type=float, default=0.0, help="testbed: random loss fraction (default 0)")
    ap.add_argument("--testbed-name", default="nrtbb", help="testbed name prefix (default nrtbb)")
    ap.add_argument("--switch-args", default="",
                    help="extra netreduce-switch options, e.g. '--slots 64 --payload-bytes 61440'")
    ap.add_argument("--mpi-args", default="",
                    help="extra mpirun options, e.g. '--mca coll_tuned_use_dynamic_rules 1 "
                         "--mca coll_tuned_allreduce_algorithm 4' (ring)")
    ap.add_argument("--nr-window", type=int, default=None,
                    help="netreduce: slots each worker keeps in flight (default: the engine's)")
    ap.add_argument("--nr-retransmit-ms", type=float, default=None,
                    help="netreduce: first retransmission timeout, ms (default: the engine's)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per (impl, N) sweep")
    ap.add_argument("--json", default=None, help="write all records (and run metadata) here")
    ap.add_argument("--md", default=None, help="write the tables as a Markdown section here")
    ap.add_argument("--plot", default=None, help="write a PNG (busbw vs size, speed-up) here")
    ap.add_argument("--from-json", default=None,
                    help="only render FILE (from --json) as Markdown (to --md, else stdout)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.from_json:
        with open(args.from_json) as f:
            data = json.load(f)
        text = common.markdown(data["meta"], data["records"], data["meta"]["impls"])
        if args.md:
            with open(args.md, "w") as f:
                f.write(text)
        else:
            print(text)
        return 0
    if args.worker:
        with open(args.worker) as f:
            cfg = json.load(f)
        if cfg["impl"] != "mpi":
            cfg["rank"] = int(os.environ["NRBENCH_RANK"])
        return worker_main(cfg)

    nps = [int(x) for x in (args.np or ("4,8" if args.testbed else "2,4")).split(",")]
    impls = (args.impls or ",".join(TESTBED_IMPLS if args.testbed else LOOPBACK_IMPLS)).split(",")
    for i in impls:
        if i not in IMPLS:
            ap.error(f"unknown impl {i!r}; choose from {', '.join(IMPLS)}")
    lo = common.parse_size(args.min_size or ("256K" if args.testbed else "4K"))
    hi = common.parse_size(args.max_size)
    target = common.parse_size(args.target_bytes or ("64M" if args.testbed else "512M"))
    min_iters = args.min_iters if args.min_iters is not None else (2 if args.testbed else 3)
    max_iters = args.max_iters
    if args.quick:
        hi = min(hi, common.parse_size("16M" if args.testbed else "4M"))
        target, min_iters, max_iters = min(target, 32 << 20), 2, 20
        if args.np is None:
            nps = [4] if args.testbed else [2]
    sizes = common.size_range(lo, hi, args.factor)
    base_cfg = {"sizes": sizes, "target_bytes": target, "min_iters": min_iters, "max_iters": max_iters,
                "timeout": 120.0,
                "netreduce_connect": {"window": args.nr_window, "retransmit_ms": args.nr_retransmit_ms}}

    meta = {"date": common.utc_now(), "command": common.command_line(),
            "machine": common.machine_description(),
            "mode": "testbed" if args.testbed else "loopback", "np": nps, "impls": impls,
            "sizes": sizes, "dtype": "float32", "target_bytes": target,
            "switch_args": args.switch_args, "mpi_args": args.mpi_args,
            "netreduce_connect": base_cfg["netreduce_connect"]}
    meta["loadavg_at_start"] = os.getloadavg()
    if args.testbed:
        meta.update(rate=args.rate, loss=args.loss)
    print(f"# allreduce benchmark, {meta['mode']}, {meta['date']}", file=sys.stderr)
    print(f"# {meta['machine']['cpu']} x{meta['machine']['cores']}, kernel {meta['machine']['kernel']}, "
          f"torch {meta['machine']['torch']}, horovod {meta['machine']['horovod']}, {meta['machine']['mpi']}",
          file=sys.stderr)
    print(f"# N={nps}  impls={impls}  sizes {common.fmt_size(sizes[0])}..{common.fmt_size(sizes[-1])}",
          file=sys.stderr)

    records: List[dict] = []
    errors: List[str] = []

    def sweep(runner: Runner, n: int) -> None:
        for impl in impls:
            print(f"# running {impl} N={n} ...", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            try:
                records.extend(merge(impl, n, run_impl(impl, n, runner, base_cfg, args)))
            except Exception as exc:  # keep going: one missing peer must not void the run
                msg = f"{impl} N={n}: {exc}"
                errors.append(msg)
                print(f"# FAILED {msg}", file=sys.stderr, flush=True)
            print(f"# {impl} N={n} took {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)

    if args.testbed:
        from netreduce.testbed import Testbed
        for n in nps:
            with Testbed(hosts=n, rate=args.rate, loss=args.loss, name=args.testbed_name,
                         subnet="10.79.0.0/24", replace=True) as tb:
                print("# " + tb.describe().replace("\n", "\n# "), file=sys.stderr)
                sweep(Runner(tb), n)
    else:
        for n in nps:
            sweep(Runner(None), n)

    add_ratios(records)
    meta["errors"] = errors
    if args.testbed:
        meta["queue_drops"] = QUEUE_DROPS
        print(f"# packets dropped by the shapers' queues per sweep: {QUEUE_DROPS}", file=sys.stderr)
    meta["loadavg_at_end"] = os.getloadavg()
    common.print_tables(records, impls)
    if errors:
        print("\n# errors:\n# " + "\n# ".join(errors))
    if args.json:
        common.write_json(args.json, meta, records)
        print(f"# wrote {args.json}", file=sys.stderr)
    if args.md:
        with open(args.md, "w") as f:
            f.write(common.markdown(meta, records, impls))
        print(f"# wrote {args.md}", file=sys.stderr)
    if args.plot:
        import plot
        plot.plot(meta, records, args.plot)
        print(f"# wrote {args.plot}", file=sys.stderr)
    return 1 if errors or not all(r["correct"] for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
