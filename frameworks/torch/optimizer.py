"""DistributedOptimizer: all-reduce each gradient as soon as backward produces it.

Same contract as horovod.torch.DistributedOptimizer 0.28: a hook per parameter starts
an asynchronous in-place all-reduce when the parameter's gradient has been accumulated
``backward_passes_per_step`` times, so communication overlaps the rest of backward;
``step()`` (or ``synchronize()``) waits for all of them. Gradients are summed locally
across the passes (not divided), then averaged across ranks.

With ``process_set=`` the gradients are averaged over that set; a rank outside it
registers no hooks and steps on its own gradients (Horovod's behaviour: the set's
ranks train one replica, the others are left alone). A sparse gradient stays sparse
for the wrapped optimizer (torch.optim.SparseAdam takes nothing else): all-gathered
as indices and values by default, or — ``sparse_as_dense=True`` — all-reduced as a
dense copy and turned back into a sparse tensor before the step, as Horovod does.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Dict, Optional, Tuple

import torch

from netreduce import config
from netreduce.ops import as_op
from netreduce.errors import InvalidArgumentError, UnsupportedError

from .compression import Compression
from .mpi_ops import (Average, global_process_set, size, synchronize, _check_process_set,
                      _grad_allreduce_async_)


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=Average, gradient_predivide_factor=1.0, sparse_as_dense=False,
                 process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self.sparse_as_dense = bool(sparse_as_dense)
        self.process_set = process_set

        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [(f"allreduce.noname.{gi}.{i}", v)
                                for gi, group in enumerate(self.param_groups)
                                for i, v in enumerate(group["params"])]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise InvalidArgumentError("named_parameters should be a sequence of tuples (name, parameter), "
                             "usually produced by model.named_parameters().")
        names = [k for k, _ in named_parameters]
        dups = sorted({k for k in names if names.count(k) > 1})
        if dups:
            raise InvalidArgumentError("Parameter names in named_parameters must be unique. "
                             f"Found duplicates: {', '.join(dups)}")
        all_ids = {id(v) for group in self.param_groups for v in group["params"]}
        unnamed = all_ids - {id(v) for _, v in named_parameters}
        if unnamed:
            raise InvalidArgumentError("named_parameters was specified, but one or more model parameters "
                             f"were not named. Python object ids: {', '.join(map(str, unnamed))}")

        self._parameter_names = {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in named_parameters}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self._handles: Dict[torch.Tensor, Tuple[Optional[int], Any]] = {}
        self._hook_handles = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        # An elastic job may grow from one rank: its hooks must be there (Horovod's rule).
        if process_set.included() and (size() > 1 or config.get("NETREDUCE_ELASTIC")):
            self._register_hooks()

    def load_state_dict(self, *args, **kwargs):
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _register_hooks(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    self._hook_handles.append(
                        p.register_post_accumulate_grad_hook(self._make_hook(p)))

    def _allreduce_grad_async(self, p: torch.Tensor) -> Tuple[int, Any]:
        if p.grad is None:
            # This rank's forward did not use p, another rank's may have: every rank
            # must still submit the tensor, so contribute zeros.
            p.grad = torch.zeros_like(p)
        tensor = p.grad
        if tensor.is_sparse:
            if self.sparse_as_dense:
                tensor = tensor.to_dense()  # a copy: p.grad stays sparse for the optimizer
            else:  # Horovod's: all-gather indices and values; the handle is a function
                from .scatter_gather import sparse_allreduce_async
                return sparse_allreduce_async(p.grad, self._parameter_names.get(p), self.op,
                                              process_set=self.process_set), None
        compressed, ctx = self._compression.compress(tensor)
        if self.op == Average:
            # Split the average: divide by the factor before the sum, multiply after;
            # the core divides by size() on top of postscale for Average.
            factor = self.gradient_predivide_factor
            prescale, postscale = 1.0 / factor, factor
        else:
            prescale, postscale = 1.0, 1.0
        handle = _grad_allreduce_async_(compressed, self._parameter_names.get(p), self.op,
                                        prescale, postscale, self.process_set)
        return handle, ctx

    def _make_hook(self, p: torch.Tensor):
        def hook(*ignore):
            # (each dict lookup keyed by p hashes it in Python: read each once)
            handles, delay = self._handles, self._allreduce_delay
            entry, left = handles.get(p), delay[p]
            if entry is not None and entry[0] is not None and left <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times "
                    "before call to step(). Increase backward_passes_per_step to "
                    "accumulate gradients locally.")
            assert not p.grad.requires_grad
            assert left > 0
            handle, ctx = None, None
            delay[p] = left = left - 1
            if left == 0:
                handle, ctx = self._allreduce_grad_async(p)
            handles[p] = (handle, ctx)
        return hook

    def synchronize(self) -> None:
        """Wait for every gradient's all-reduce (starting those whose hook has not fired)."""
        if not self.process_set.included():
            self._synchronized = True
            return
        for p in self._requires_update - set(self._handles):
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in self._handles.items():
            if callable(handle):  # a sparse gradient's all-gathers
                p.grad = handle()
                self._allreduce_delay[p] = self.backward_passes_per_step
                continue
            output = synchronize(handle)
            self._allreduce_delay[p] = self.backward_passes_per_step
            decompressed = self._compression.decompress(output, ctx)
            if p.grad.is_sparse:  # sparse_as_dense: the averaged dense copy, sparse again
                p.grad = decompressed.to_sparse()
            elif decompressed.data_ptr() != p.grad.data_ptr():
                p.grad.copy_(decompressed)
        self._handles.clear()
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """Use after an explicit synchronize() (e.g. gradient clipping) around step()."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def _netreduce_base_step(self, closure=None):
        """The wrapped optimizer's step without any all-reduce (state initialisation)."""
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None,
                         compression=Compression.none, backward_passes_per_step: int = 1,
                         op=Average, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups=None, sparse_as_dense: bool = False,
                         process_set=global_process_set):
    """Wrap ``optimizer`` so that step() applies gradients averaged over all ranks.

    Returns an instance of a subclass of ``optimizer``'s own class (as Horovod does),
    so isinstance checks and learning-rate schedulers keep working."""
    _check_process_set(process_set)
    try:
        # Horovod's integer values and names are accepted; Adasum is
        # refused here, not by the first gradient hook in the middle of backward.
        op = as_op(op)
    except NotImplementedError as exc:
        raise UnsupportedError(f"DistributedOptimizer(op={op!r}): {exc}; use op=Average "
                               "(the default) or Sum") from None
    if gradient_predivide_factor != 1.0 and op != Average:
        raise InvalidArgumentError("gradient_predivide_factor not supported with op != Average")
    if num_groups or groups is not None:
        # Grouping only changes how Horovod batches negotiation; netreduce's
        # communicator fuses whatever is ready in a cycle, so it is accepted and ignored.
        pass
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, sparse_as_dense, process_set)
