"""Ray Train's TorchTrainer on netreduce: ``torch_config=NetReduceConfig()``.

    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from netreduce.torch.ray_train import NetReduceConfig

    trainer = TorchTrainer(train_loop, scaling_config=ScalingConfig(num_workers=4),
                           torch_config=NetReduceConfig())   # or NetReduceConfig(switch="aggr:4791")
    trainer.fit()

Inside ``train_loop`` the default process group is netreduce's, so
``ray.train.torch.prepare_model`` (DDP), FSDP and plain ``torch.distributed`` calls
reduce through the aggregator; ``import netreduce.torch as hvd; hvd.init()`` gives the
Horovod API over the same job. Nothing is started by hand: without ``switch`` the
rank-0 worker starts an aggregator (the path ``torchrun`` users get: its address and
the job's secret travel through torch's store; on one node it listens on 127.0.0.1
only), and the workers leave the job and that aggregator stops when Ray shuts the
worker group down. With ``switch`` every worker joins that standing aggregator
(beside the top-of-rack switch, as docs/operations.md runs it).

Ray's own torch backend does the rest (MASTER_ADDR/PORT, the timeout, the torch
environment variables); this one first gives every worker netreduce's view of the job
— its rank, the job's size, its rank and the rank count on its node (from Ray's node
ids, so the hierarchical algorithm sees the layout), one job name and secret per run
— and registers the "netreduce" backend in the worker before Ray's
``init_process_group`` runs there.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Dict, Optional

import ray
from ray.train.torch import TorchConfig

from netreduce import config
from netreduce.protocol import auth, tls
from netreduce.protocol.address import parse_addresses
from netreduce.errors import InvalidArgumentError, NetReduceError
from netreduce.launcher.ray_executor import local_layout

_RayTorchBackend = TorchConfig().backend_cls  # Ray's torch backend, through its public property


def _node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def _join(rank: int, size: int, local_rank: int, local_size: int, job: str, secret: str,
          switch: Optional[str], tls_knobs: Optional[Dict[str, str]] = None) -> None:
    """On a worker, before Ray's init_process_group: netreduce's view of the job."""
    from netreduce.torch import process_group  # registers the "netreduce" backend
    process_group.register()
    for name, value in (("NETREDUCE_RANK", rank), ("NETREDUCE_SIZE", size),
                        ("NETREDUCE_LOCAL_RANK", local_rank),
                        ("NETREDUCE_LOCAL_SIZE", local_size), ("NETREDUCE_JOB", job),
                        ("NETREDUCE_JOB_SECRET", secret), *(tls_knobs or {}).items()):
        config.set_for_process(name, value)  # the driver's TLS knobs too (protocol/tls.py)
    if switch:
        config.set_for_process("NETREDUCE_SWITCH", switch)


def _leave() -> None:
    import netreduce as nr
    try:
        nr.shutdown()
    except NetReduceError:
        pass  # another worker left first or the job already failed: nothing to undo


def _stop_aggregator() -> None:
    from netreduce.torch import process_group
    process_group.stop_embedded_aggregator()


class _NetReduceBackend(_RayTorchBackend):
    def on_start(self, worker_group, backend_config: "NetReduceConfig") -> None:
        size = len(worker_group)
        layout = local_layout(worker_group.execute(_node_id))
        job = config.get("NETREDUCE_JOB") or f"ray-{uuid.uuid4().hex[:12]}"
        secret = auth.job_secret_or_new()  # the driver's, else fresh
        ray.get([worker_group.execute_single_async(r, _join, r, size, layout[r][0],
                                                   layout[r][1], job, secret,
                                                   backend_config.switch, tls.knobs())
                 for r in range(size)])
        super().on_start(worker_group, backend_config)

    def on_shutdown(self, worker_group, backend_config) -> None:
        try:
            super().on_shutdown(worker_group, backend_config)
        finally:
            # every worker says goodbye while the aggregator still runs, then rank 0's
            # embedded aggregator (if it started one) stops
            worker_group.execute(_leave)
            worker_group.execute_single(0, _stop_aggregator)


@dataclass
class NetReduceConfig(TorchConfig):
    """TorchConfig whose process group is netreduce's.

    Args:
        switch: a standing aggregator (``host:port``, or several comma-separated) for
            every worker; None (default): the rank-0 worker starts one for the run.
        backend, init_method, timeout_s: as TorchConfig's (``backend`` stays
            "netreduce"; ``init_method`` "env" or "tcp").
    """

    backend: Optional[str] = "netreduce"
    switch: Optional[str] = None

    def __post_init__(self) -> None:
        if self.backend != "netreduce":
            raise InvalidArgumentError(f"NetReduceConfig(backend={self.backend!r}): the backend is "
                             "'netreduce'; use ray.train.torch.TorchConfig for others")
        if self.switch:
            parse_addresses(self.switch, what="NetReduceConfig(switch=)")

    @property
    def backend_cls(self):
        return _NetReduceBackend
