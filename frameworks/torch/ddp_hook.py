"""A DDP communication hook that all-reduces DDP's gradient buckets through netreduce,
whatever backend DDP's own process group uses (e.g. gloo for the parameter broadcast
at construction, netreduce for the gradients every step):

    model = DistributedDataParallel(model)          # on a gloo process group
    model.register_comm_hook(None, netreduce.torch.allreduce_hook)

``state`` may be None (or anything else, e.g. the process group) or a string that
tells two DDP models in one process apart.
The netreduce job must span the same ranks as DDP's process group.
"""
# No ``from __future__ import annotations`` here: DDP checks the hook's annotations
# and needs real types, not strings.
from typing import Any

import torch
import torch.distributed as dist

from . import mpi_ops
from .futures import completer, cuda_devices


def allreduce_hook(state: Any,
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket``'s flattened gradients over all ranks, in place."""
    if not mpi_ops.is_initialized():
        mpi_ops.init()
    buffer = bucket.buffer()
    # Bucket indices repeat every step, so the names hit the communicator's response
    # cache; numel is part of the name because DDP rebuilds its buckets after step 1.
    # Only a string state names the model: anything else (often the process group)
    # may print differently on each rank, and names must agree across ranks.
    label = state if isinstance(state, str) else "model"
    name = f"ddp.{label}.bucket{bucket.index()}.{buffer.numel()}"
    handle = mpi_ops.allreduce_async_(buffer, name=name, op=mpi_ops.Average)
    return completer.submit([handle], lambda _: buffer, cuda_devices([buffer]))
