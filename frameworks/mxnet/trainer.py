"""horovod.mxnet's DistributedTrainer, DistributedOptimizer and broadcast_parameters.

DistributedTrainer is a gluon.Trainer without a kvstore whose gradient reduction is a
netreduce **average** (Horovod's semantics: ``step(batch_size)`` takes the local
batch). All of a step's gradients are submitted before the first wait, so the core
negotiates them in one round and fuses them; they are submitted in Horovod's priority
order (parameter index, -i).

With ``process_set=`` both reduce over that set only (averaging by its size); on a
rank outside the set they leave the gradients as they are, as Horovod does (the
rank's optimizer still steps, on its own gradients).
"""
from __future__ import annotations

import types
import warnings
from collections import OrderedDict
from typing import Any, List, Optional

import mxnet as mx

from netreduce.worker import process_sets as _ps
from netreduce.errors import InvalidArgumentError

from .compression import Compression
from .mpi_ops import (Average, Sum, broadcast_, broadcast_many, global_process_set,
                      reduce_in_place, size)


def _reduce_grads(grads: List[Any], names: List[str], compression: Any, average: bool,
                  predivide: float, process_set: Any) -> None:
    pairs = [compression.compress(g) for g in grads]
    with _ps.using(process_set):
        reduce_in_place([p[0] for p in pairs], names, Average if average else Sum,
                        prescale_factor=1.0 / predivide,
                        postscale_factor=predivide if average else 1.0,
                        what="DistributedTrainer")
    for grad, (reduced, ctx) in zip(grads, pairs):
        if reduced is not grad:
            grad[:] = compression.decompress(reduced, ctx)


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps an optimizer so that ``update`` first averages the gradient over ranks
    (for Module-style training; gluon users want DistributedTrainer)."""

    def __init__(self, optimizer, gradient_predivide_factor=1.0, num_groups=0,
                 process_set=global_process_set):
        self._optimizer = optimizer
        self._gradient_predivide_factor = gradient_predivide_factor
        self._num_groups = num_groups
        self._process_set = _ps.check(process_set)

    def __getattr__(self, item):
        return getattr(self._optimizer, item)

    def create_state(self, index, weight):
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def _do_allreduce(self, index, grad):
        # A rank outside the set keeps its own gradient (Horovod's update() skips it).
        if not self._process_set.included() or self._process_set.size() == 1:
            return
        indices = list(index) if isinstance(index, (tuple, list)) else [index]
        grads = list(grad) if isinstance(grad, (tuple, list)) else [grad]
        _reduce_grads(grads, [f"optimizer.{i}" for i in indices], Compression.none, True,
                      self._gradient_predivide_factor, self._process_set)

    def update(self, index, weight, grad, state):
        self._do_allreduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        self._do_allreduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr):
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult):
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        self._optimizer.set_wd_mult(args_wd_mult)


class DistributedTrainer(mx.gluon.Trainer):
    """gluon.Trainer whose gradients are averaged over all ranks by netreduce.

    Arguments as horovod.mxnet.DistributedTrainer: ``compression`` (Compression.none
    or .fp16), ``gradient_predivide_factor`` (scale by 1/f before the sum and f/size
    after it), ``prefix`` (distinct per trainer when a program has several),
    ``num_groups`` (accepted; every gradient of a step is fused anyway)."""

    def __init__(self, params, optimizer, optimizer_params=None,
                 compression=Compression.none, gradient_predivide_factor=1.0, prefix=None,
                 num_groups=0, process_set=global_process_set):
        _ps.check(process_set)
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer does not take DistributedOptimizer "
                          "as its optimizer. We have unwrapped it for you.")
        # Every rank must list the parameters in the same order (gluon sorts dicts).
        if isinstance(params, dict):
            params = OrderedDict(params)
        elif isinstance(params, (list, tuple)):
            params = sorted(params, key=lambda p: p.name)
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        if prefix is not None and not isinstance(prefix, str):
            raise InvalidArgumentError(f"prefix must be a str, got {type(prefix).__name__}")
        self._compression = compression
        self._gradient_predivide_factor = gradient_predivide_factor
        self._prefix = prefix or ""
        self._num_groups = num_groups
        self._process_set = process_set

    def _allreduce_grads(self):
        if self._process_set.size() == 1 or not self._process_set.included():
            return
        grads, names = [], []
        for i, param in enumerate(self._params):
            if param.grad_req != "null":
                grads.append(param.list_grad()[0])
                names.append(f"{self._prefix}{i}")
        _reduce_grads(grads, names, self._compression, True, self._gradient_predivide_factor,
                      self._process_set)


def _append_broadcast_init(param, root_rank: int, name: str):
    init_impl = getattr(param, "_init_impl")

    def wrapped_init_impl(self, *args, **kwargs):
        init_impl(*args, **kwargs)
        broadcast_(self.data(), root_rank=root_rank, name=name)
    return wrapped_init_impl


def broadcast_parameters(params, root_rank: int = 0, prefix: Optional[str] = None) -> None:
    """Overwrite every rank's parameters with root_rank's: ``block.collect_params()``
    (a ParameterDict) or a dict of NDArrays / Parameters (``Module.get_params()``).
    Parameters whose initialisation is deferred are broadcast when they get it."""
    if size() == 1:
        return
    if prefix is not None and not isinstance(prefix, str):
        raise InvalidArgumentError(f"prefix must be a str, got {type(prefix).__name__}")
    prefix = prefix or ""
    valid = (dict, mx.gluon.ParameterDict)
    if not isinstance(params, valid):
        raise InvalidArgumentError(f"invalid params of type: {type(params)}")
    tensors, names = [], []
    for name, p in sorted(params.items()):
        try:
            tensors.append(p.data() if isinstance(p, mx.gluon.Parameter) else p)
            names.append(prefix + str(name))
        except mx.gluon.parameter.DeferredInitializationError:
            p._init_impl = types.MethodType(_append_broadcast_init(p, root_rank,
                                                                   prefix + str(name)), p)
    broadcast_many(tensors, names, root_rank, what="broadcast_parameters")
