"""Horovod's names over torch DDP, so that Horovod's own benchmark loop runs
unmodified on ``DistributedDataParallel`` (benchmarks/overlap_step.py: "the same
loop on DDP"). ``hvd.init()`` starts the process group (env://) and makes every
torchvision model constructor return its model wrapped in DDP with DDP's defaults;
``DistributedOptimizer`` is the optimizer itself (DDP averages in backward) and the
broadcasts are DDP's own at construction. ``configure("ddp:netreduce:overlap")``: the
same, and ``netreduce.torch.ddp_overlap(model)`` on each wrapped model (each gradient's
all-reduce starts as backward produces it). ``configure("none")``: no process group,
no wrapping — the loop's compute alone, for the overlap bound."""
from __future__ import annotations

import functools
import os

import torch.distributed as dist

Average, Sum, Adasum = "Average", "Sum", "Adasum"
_backend = "gloo"
_overlap = False


class Compression:
    none = None
    fp16 = None


def configure(who: str) -> None:
    global _backend, _overlap
    parts = who.split(":")
    _backend = parts[1] if parts[0] == "ddp" else who
    _overlap = parts[2:] == ["overlap"]


def _wrap(constructor):
    @functools.wraps(constructor)
    def build(*args, **kwargs):
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(constructor(*args, **kwargs))
        if _overlap:
            import netreduce.torch
            netreduce.torch.ddp_overlap(model)
        return model
    return build


def init() -> None:
    if _backend == "none":
        return
    if _backend == "netreduce":
        import netreduce.torch  # noqa: F401  (registers the backend)
    dist.init_process_group(_backend)
    from torchvision import models
    for name in models.list_models(module=models):
        setattr(models, name, _wrap(getattr(models, name)))


def _env(name: str, default: int) -> int:
    for key in (name, "NETREDUCE_" + name):
        if key in os.environ:
            return int(os.environ[key])
    return default


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else _env("RANK", 0)


def size() -> int:
    return dist.get_world_size() if dist.is_initialized() else _env("WORLD_SIZE", 1)


def local_rank() -> int:
    return _env("LOCAL_RANK", 0)


def nccl_built() -> bool:
    return False


def DistributedOptimizer(optimizer, named_parameters=None, compression=None, op=None, **_):
    return optimizer


def broadcast_parameters(params, root_rank: int) -> None:
    """DDP broadcast rank 0's parameters and buffers when it wrapped the model."""


def broadcast_optimizer_state(optimizer, root_rank: int) -> None:
    """A fresh SGD has no state to broadcast."""


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
