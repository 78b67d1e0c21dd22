"""Where the all-reduce benchmarks' ranks run, and how their records come back
(benchmarks/allreduce.py, hierarchical.py; the training and collective benchmarks
use the launch helpers too): a Runner places rank r on this host or in testbed host
r's namespace, run_impl starts one netreduce-switch (or Gloo's rendezvous, or
mpirun) and one benchmarks/allreduce_rank.py per rank for one implementation at one
world size, and merge reduces the ranks' records to one per size (the slowest
rank's time)."""
from __future__ import annotations

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

RANK = os.path.join(HERE, "allreduce_rank.py")  # one rank's process
QUEUE_DROPS: Dict[str, int] = {}  # "impl N=n" -> packets the testbed's shapers dropped


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


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def worker_env(extra: Dict[str, str]) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    # One core per rank is all there is; keep BLAS/OpenMP pools from competing.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def wait_all(procs: List[subprocess.Popen], timeout: float, what: str) -> None:
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
        common.stop(procs, 5)


def run_impl(impl: str, n: int, runner: Runner, base_cfg: dict, args) -> List[dict]:
    """Run one implementation at world size n across all sizes; return per-rank records."""
    tmp = tempfile.mkdtemp(prefix=f"nrbench-{impl}-")
    cfg = dict(base_cfg, impl=impl, np=n, out=os.path.join(tmp, "rank{rank}.jsonl"),
               ifname=runner.ifname)
    env_extra: Dict[str, str] = {}
    cleanup = []
    try:
        if impl in ("netreduce", "hierarchical", "hierarchical-api"):
            address, pid, stop = runner.spawn_switch(shlex.split(args.switch_args))
            cleanup.append(stop)
            cfg.update(switch=list(address), switch_pid=pid, job=f"bench-{uuid.uuid4().hex[:8]}")
        elif impl == "gloo":
            cfg["master"] = f"{runner.host_addr(0)}:{free_port()}"
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
                    apps += (["-np", "1"] + runner.wrap(r, [sys.executable, RANK, cfg_path])
                             + ([":"] if r < n - 1 else []))
                argv = mpi + apps
            else:
                argv = mpi + ["-np", str(n), sys.executable, RANK, cfg_path]
            procs.append(subprocess.Popen(argv, env=worker_env(env_extra)))
        else:
            for r in range(n):
                env = worker_env(env_extra)
                env["NRBENCH_RANK"] = str(r)
                if impl == "horovod":
                    s = plan[r]
                    env.update(HOROVOD_HOSTNAME=s.hostname, HOROVOD_RANK=str(s.rank),
                               HOROVOD_SIZE=str(s.size), HOROVOD_LOCAL_RANK=str(s.local_rank),
                               HOROVOD_LOCAL_SIZE=str(s.local_size), HOROVOD_CROSS_RANK=str(s.cross_rank),
                               HOROVOD_CROSS_SIZE=str(s.cross_size))
                procs.append(subprocess.Popen(runner.wrap(r, [sys.executable, RANK, cfg_path]),
                                              env=env))
        wait_all(procs, args.timeout, f"{impl} N={n}")
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
        if all("waits" in r for r in rs):  # the engine's sleeps per all-reduce (mean rank)
            rec["waits_per_rank"] = sum(r["waits"] for r in rs) / len(rs)
            for k in ("fast_retransmits", "timeout_probes", "spurious_retransmits",
                      "group_datagrams", "naps", "nap_offs"):
                rec[k + "_per_rank"] = sum(r.get(k, 0) for r in rs) / len(rs)
        # CPU-seconds per all-reduce of a rank's whole process (mean over ranks)
        rec["cpu_s_per_allreduce"] = sum(r["cpu_s"] / r["iters"] for r in rs) / len(rs)
        if all("wire_tx" in r for r in rs):
            rec["wire_tx_per_host"] = sum(r["wire_tx"] for r in rs) / len(rs)
            rec["wire_rx_per_host"] = sum(r["wire_rx"] for r in rs) / len(rs)
            rec["wire_tx_max"] = max(r["wire_tx"] for r in rs)
            rec["wire_rx_max"] = max(r["wire_rx"] for r in rs)
        out.append(rec)
    return out
