#!/usr/bin/env python3
"""One rank of the all-reduce benchmarks (benchmarks/allreduce.py, hierarchical.py):
the implementations under test, each behind the same three calls (run, counters,
close), and the size sweep every rank runs — one verified warm-up per size, then
the timed iterations, one JSON record per size. benchmarks/allreduce_launch.py
starts one such process per rank:

    python benchmarks/allreduce_rank.py CFG.json     # NRBENCH_RANK=r, except under mpirun
"""
from __future__ import annotations

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
if REPO not in sys.path:
    sys.path.insert(1, REPO)

import common  # noqa: E402


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
                "retransmits": st.get("retransmits", 0) + st.get("fast_retransmits", 0),
                # the engine's sleeps (waits for results): wake-ups per all-reduce
                "waits": st.get("waits", 0),
                # naps when the link binds (engine/nap.h), and messages that stopped them
                "naps": st.get("naps", 0), "nap_offs": st.get("nap_offs", 0),
                # which rule resent (docs/protocol.md), and how many proved needless
                "fast_retransmits": st.get("fast_retransmits", 0),
                "timeout_probes": st.get("timeout_probes", 0),
                "spurious_retransmits": st.get("spurious_retransmits", 0),
                "group_datagrams": st.get("group_datagrams", 0)}

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


class HierarchicalImpl:
    """Worker side: the algorithm netreduce.init() would choose, built directly so
    that the benchmark times the data plane, not negotiation (as the flat
    ``netreduce`` above does). benchmarks/hierarchical.py runs it."""

    def __init__(self, cfg: dict, rank: int, size: int) -> None:
        from netreduce import config
        from netreduce.worker import dataplane
        from netreduce.algorithms import select
        from netreduce.environment import Topology
        L = int(cfg["per_host"])
        host, port = cfg["switch"]
        address = (host, int(port))
        knobs = dict(config.snapshot(), NETREDUCE_ALGORITHM="hierarchical",
                     NETREDUCE_TIMEOUT=cfg["timeout"])
        if cfg.get("shm_chunk"):
            knobs["NETREDUCE_SHM_CHUNK"] = common.parse_size(cfg["shm_chunk"])
        if cfg.get("shm_depth"):  # exploring the ring depth (not a knob: 2 is the default)
            from netreduce.algorithms import hierarchical
            hierarchical.DEPTH = int(cfg["shm_depth"])
        conn = dataplane.connect(address, job=cfg["job"], rank=rank, size=size,
                                 timeout=cfg["timeout"])
        topo = Topology(rank, size, rank % L, L, cfg["job"], "benchmark", True)
        self.algo = select.build(conn, topo, knobs, address, connect=dataplane.connect)
        assert self.algo.name == "hierarchical", self.algo.name
        self.in_place = False

    def run(self, src, dst):
        self.algo.allreduce(src, dst)

    def counters(self) -> dict:
        st = self.algo.stats()
        out = {k: st[k] for k in ("shm_busy_ns", "shm_wait_ns", "shm_net_wait_ns")}
        out["packets_sent"] = st.get("packets_sent", 0)
        out["retransmits"] = st.get("retransmits", 0) + st.get("fast_retransmits", 0)
        return out

    def close(self):
        self.algo.close()


class ApiImpl:
    """Worker side: the public API (nr.init(), nr.allreduce_ with op=Sum), so the
    figure includes negotiation (NETREDUCE_CYCLE_TIME), the communicator's threads
    and the fusion path; the algorithm init() chooses is hierarchical here."""

    def __init__(self, cfg: dict, rank: int, size: int) -> None:
        from netreduce import config
        L = int(cfg["per_host"])
        host, port = cfg["switch"]
        for knob, value in (("NETREDUCE_SWITCH", f"{host}:{port}"), ("NETREDUCE_JOB", cfg["job"]),
                            ("NETREDUCE_RANK", rank), ("NETREDUCE_SIZE", size),
                            ("NETREDUCE_LOCAL_RANK", rank % L), ("NETREDUCE_LOCAL_SIZE", L),
                            ("NETREDUCE_TIMEOUT", cfg["timeout"])):
            config.set_for_process(knob, value)
        if cfg.get("shm_chunk"):
            config.set_for_process("NETREDUCE_SHM_CHUNK", cfg["shm_chunk"])
        import netreduce as nr
        self.nr = nr
        nr.init()
        assert nr.api._comm().dp.name == "hierarchical"
        self.in_place = True
        self.name = None

    def run(self, src, dst):
        self.nr.allreduce_(dst, op=self.nr.Sum, name=self.name)

    def close(self):
        self.nr.shutdown()


# Implementation name (--impls) -> the class one rank runs.
IMPLS = {"netreduce": _Netreduce, "gloo": _Gloo, "mpi": _Mpi, "horovod": _Horovod,
         "hierarchical": HierarchicalImpl, "hierarchical-api": ApiImpl}


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
    impl = IMPLS[impl_name](cfg, rank, size)
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


def main(argv: list) -> int:
    with open(argv[0]) as f:
        cfg = json.load(f)
    if cfg["impl"] != "mpi":  # mpirun numbers its ranks itself
        cfg["rank"] = int(os.environ["NRBENCH_RANK"])
    return worker_main(cfg)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
