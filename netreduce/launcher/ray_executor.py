"""Run a netreduce job on Ray actors, as horovod.ray.RayExecutor runs a Horovod job.

    from netreduce.launcher.ray_executor import RayExecutor

    executor = RayExecutor(num_workers=4, cpus_per_worker=1)
    executor.start()                      # actors placed, aggregator started
    results = executor.run(train, args=[config])   # train() calls hvd.init() itself
    executor.shutdown()

Framework-free: ``train`` may use netreduce.torch, .tensorflow, .mxnet or the numpy
core; every worker sees the launcher variables netreduce-run would give it (rank,
size, its rank and the rank count on its node from Ray's node ids, one job name and
secret per executor), so ``init()`` needs no arguments. Without ``switch`` the
executor starts a ``netreduce-switch`` on the driver's node for the job (listening on
127.0.0.1 when every worker shares that node, on all addresses otherwise, and
admitting only ranks holding the job's secret) and stops it at ``shutdown()``; with
``switch`` the workers join that standing aggregator.

Each worker is one actor, so state set up by one ``run`` (an initialised netreduce,
a model) is there for the next.
"""
from __future__ import annotations

import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

import ray

from netreduce import config
from netreduce.protocol import auth, tls
from netreduce.protocol.address import format_address, parse_addresses
from netreduce.errors import InvalidArgumentError, NetReduceError
from netreduce.switch import spawn_for_job


def local_layout(node_ids: Sequence[str]) -> List[tuple]:
    """(local_rank, local_size) of each rank, from the node each one runs on: the
    ranks of a node are numbered in rank order."""
    counts: Dict[str, int] = {}
    local = []
    for node in node_ids:
        local.append(counts.get(node, 0))
        counts[node] = counts.get(node, 0) + 1
    return [(lr, counts[node]) for lr, node in zip(local, node_ids)]


class _Worker:
    """One rank: an actor that holds the job's knobs and runs what it is given."""

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def join(self, knobs: Dict[str, Any]) -> None:
        for name, value in knobs.items():
            config.set_for_process(name, value)

    def run(self, fn: Callable, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
        return fn(*args, **kwargs)

    def leave(self) -> None:
        import netreduce as nr
        try:
            nr.shutdown()
        except NetReduceError:
            pass  # the job already failed or another rank left first: nothing to undo


class RayExecutor:
    """``num_workers`` netreduce ranks on Ray actors (horovod.ray.RayExecutor's role).

    Args:
        num_workers: ranks in the job.
        cpus_per_worker, gpus_per_worker: each actor's Ray resources.
        switch: a standing aggregator (``host:port``, several comma-separated) for the
            workers; None: start one on the driver's node for this executor.
        env: extra environment (``NETREDUCE_*`` knobs, say) for every worker.
    """

    def __init__(self, num_workers: int, cpus_per_worker: float = 1, gpus_per_worker: float = 0,
                 switch: Optional[str] = None, env: Optional[Dict[str, str]] = None) -> None:
        if num_workers < 1:
            raise InvalidArgumentError(f"RayExecutor(num_workers={num_workers}): at least one")
        if switch:
            parse_addresses(switch, what="RayExecutor(switch=)")
        self.num_workers = num_workers
        self.cpus_per_worker, self.gpus_per_worker = cpus_per_worker, gpus_per_worker
        self.switch, self.env = switch, dict(env or {})
        self.workers: List[Any] = []
        self._aggregator: Any = None

    def start(self) -> None:
        """Place the actors, start the aggregator (unless ``switch``), and give every
        worker its rank and the job's knobs."""
        if self.workers:
            return
        actor = ray.remote(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker)(_Worker)
        self.workers = [actor.remote() for _ in range(self.num_workers)]
        try:
            nodes = ray.get([w.node_id.remote() for w in self.workers])
            layout = local_layout(nodes)
            switch = self.switch or self._start_aggregator(nodes)
            # The driver's secret and name when it has them (a pre-registered job on a
            # shared aggregator: netreduce-switch --job-secrets), else fresh ones per run.
            job = self.env.get("NETREDUCE_JOB") or config.get("NETREDUCE_JOB") or \
                f"ray-{uuid.uuid4().hex[:12]}"
            secret = self.env.get("NETREDUCE_JOB_SECRET") or auth.job_secret_or_new()
            ray.get([w.join.remote(dict({**tls.knobs(), **self.env}, NETREDUCE_SWITCH=switch,
                                        NETREDUCE_JOB=job,
                                        NETREDUCE_JOB_SECRET=secret, NETREDUCE_RANK=r,
                                        NETREDUCE_SIZE=self.num_workers,
                                        NETREDUCE_LOCAL_RANK=layout[r][0],
                                        NETREDUCE_LOCAL_SIZE=layout[r][1]))
                     for r, w in enumerate(self.workers)])
        except BaseException:
            self.shutdown()
            raise

    def _start_aggregator(self, nodes: List[str]) -> str:
        here = ray.get_runtime_context().get_node_id()
        one_node = all(n == here for n in nodes)
        host = "127.0.0.1" if one_node else ray.util.get_node_ip_address()
        listen = "127.0.0.1" if one_node else ("::" if ":" in host else "0.0.0.0")
        self._aggregator = spawn_for_job(listen, fanout="multicast" if one_node else "unicast")
        return format_address((host, self._aggregator.address[1]))

    def run_remote(self, fn: Callable, args: Sequence[Any] = (),
                   kwargs: Optional[Dict[str, Any]] = None) -> List[Any]:
        """``fn(*args, **kwargs)`` on every worker; the list of Ray object refs."""
        if not self.workers:
            raise NetReduceError("RayExecutor.run: call start() first")
        return [w.run.remote(fn, list(args), dict(kwargs or {})) for w in self.workers]

    def run(self, fn: Callable, args: Sequence[Any] = (),
            kwargs: Optional[Dict[str, Any]] = None) -> List[Any]:
        """``fn(*args, **kwargs)`` on every worker; the results in rank order."""
        return ray.get(self.run_remote(fn, args, kwargs))

    def shutdown(self) -> None:
        """Every worker leaves the job, the actors end, the aggregator stops."""
        workers, self.workers = self.workers, []
        try:
            if workers:
                try:
                    ray.get([w.leave.remote() for w in workers], timeout=60)
                except Exception:  # noqa: BLE001  a dead actor: it has left already
                    pass
                for w in workers:
                    ray.kill(w)
        finally:
            aggregator, self._aggregator = self._aggregator, None
            if aggregator is not None:
                aggregator.stop()
