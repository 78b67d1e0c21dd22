"""DDP communication hooks that all-reduce DDP's gradients through netreduce.

``allreduce_hook``: each of DDP's gradient buckets, once DDP has it whole, whatever
backend DDP's own process group uses (e.g. gloo for the parameter broadcast at
construction, netreduce for the gradients every step):

    model = DistributedDataParallel(model)          # on a gloo process group
    model.register_comm_hook(None, netreduce.torch.allreduce_hook)

``state`` may be None (or anything else, e.g. the process group) or a string that
tells two DDP models in one process apart.
The netreduce job must span the same ranks as DDP's process group.

``ddp_overlap(model)``: each parameter's gradient as soon as backward has produced
it, as Horovod's DistributedOptimizer does; DDP's buckets only collect the results.
DDP itself starts a bucket's all-reduce when its last gradient is there: with the
default 25 MiB buckets that holds the link idle while backward fills a bucket
(resnet18's second bucket, 28.9 MB, is whole about a quarter into backward), and
the last bucket (15.9 MB, 0.13 s at 1 Gbit/s) starts only when backward ends
(BENCHMARKS.md, issue 33, "DDP's buckets"):

    model = DistributedDataParallel(model)          # on the netreduce (or gloo) group
    netreduce.torch.ddp_overlap(model)

On a netreduce process group DDP gets it without the call (ddp_auto.py;
NETREDUCE_DDP_OVERLAP=0 opts out).
"""
# No ``from __future__ import annotations`` here: DDP checks the hook's annotations
# and needs real types, not strings.
from typing import Any, Dict, List, Optional, Set, Tuple

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


class _Overlap:
    """ddp_overlap()'s state: which parameters' all-reduces started in this backward
    pass, for the comm hook to collect bucket by bucket, and where each parameter
    sits in DDP's buckets (learnt from the comm hook's buckets)."""

    def __init__(self, model: Any, label: str) -> None:
        ignored = set(getattr(model, "parameters_to_ignore", ()) or ())
        # DDP's own parameters, in the module's order: the same on every rank, so an
        # index names a parameter across ranks.
        params = [p for n, p in model.module.named_parameters()
                  if p.requires_grad and n not in ignored]
        self.model = model
        self.label = label
        self.params = params
        self.index: Dict[int, int] = {id(p): i for i, p in enumerate(params)}
        # index -> (handle, the tensor reduced in place)
        self.started: Dict[int, Tuple[int, torch.Tensor]] = {}
        # indices the comm hook collected in this backward pass: DDP's reducer calls
        # it from its own hook on the bucket's last gradient, before ours on that node
        self.collected: Set[int] = set()
        # index -> the parameter's view in DDP's bucket, from a comm hook that ran
        # after DDP's one rebuild of its buckets (before it, buckets move)
        self.views: Dict[int, torch.Tensor] = {}
        self.armed = False       # this forward's backward reduces (DDP's own decision)
        # (state, hook) of a comm hook registered after this one (ddp_auto): it gets the
        # buckets, and this state only undoes the .grad aliasing it left
        self.delegate: Optional[Tuple[Any, Any]] = None
        self.process_set = _process_set(model)
        # After DDP's reducer: each parameter's AccumulateGrad node runs its post hooks
        # in the order they were added, and DDP added its own (which copies the
        # gradient into the bucket) when it was built, so ours sees the copy done.
        self.accumulators = []
        with torch.enable_grad():
            for i, p in enumerate(params):
                node = p.view_as(p).grad_fn.next_functions[0][0]
                node.register_hook(self._gradient_hook(i, p))
                self.accumulators.append(node)  # (the tensor holds it weakly; DDP too)
        model.register_forward_hook(self._forward_hook)

    def name(self, i: int, tensor: torch.Tensor) -> str:
        # The same on every rank and every step (the response cache serves it); numel
        # in it as in allreduce_hook's names.
        return f"ddp.{self.label}.param{i}.{tensor.numel()}"

    def _forward_hook(self, module: Any, inputs: Any, output: Any) -> None:
        # DDP decides in forward whether the coming backward all-reduces
        # (prepare_for_backward): not under no_sync(), nor without autograd. What a
        # backward that never reached every bucket left started is dropped (DDP
        # raises on that iteration itself), never collected by the next one's buckets.
        self.started.clear()
        self.collected.clear()
        self.armed = torch.is_grad_enabled() and bool(module.require_backward_grad_sync) \
            and self.delegate is None
        if not getattr(module, "_has_rebuilt_buckets", False):
            self.views.clear()          # (DDP's _update_process_group rebuilds again)
        for i, view in self.views.items():
            # A .grad left as the bucket's view (below) must not be accumulated into
            # by this backward: DDP's reducer refuses a gradient that aliases its
            # bucket unless gradient_as_bucket_view. zero_grad()'s default (None)
            # leaves nothing to do here.
            grad = self.params[i].grad
            if grad is not None and grad.data_ptr() == view.data_ptr():
                self.params[i].grad = grad.clone()
        if self.delegate is not None:
            self.views.clear()

    def hand_over(self, state: Any, hook: Any) -> None:
        """From the next bucket on, ``hook(state, bucket)`` reduces DDP's buckets and
        no gradient starts an all-reduce of its own (a comm hook registered after
        this one: a reducer takes only one)."""
        self.delegate = (state, hook)
        self.armed = False

    def _gradient_hook(self, i: int, p: torch.Tensor):
        def hook(grad_inputs: Any, grad_outputs: Any) -> None:
            # p.grad is accumulated (summed over no_sync's passes too) and DDP's
            # reducer has copied it into its bucket.
            grad = p.grad
            if not self.armed or i in self.started or i in self.collected or grad is None \
                    or grad.is_sparse:
                return  # (a second pass in one backward is DDP's error to raise)
            view = self.views.get(i)
            if view is not None:
                self._alias(p, view)
                grad = view
            self.started[i] = (mpi_ops.allreduce_async_(
                grad, name=self.name(i, grad), op=mpi_ops.Average,
                process_set=self.process_set), grad)
        return hook

    @staticmethod
    def _alias(p: torch.Tensor, view: torch.Tensor) -> None:
        """p.grad, copied into DDP's bucket, becomes the bucket's view (reduced there
        in place), so that DDP's copy of the result back to p.grad is a copy of a
        tensor onto itself, which torch skips."""
        grad = p.grad
        if grad is not None and p.is_contiguous() and view.shape == grad.shape and \
                view.dtype == grad.dtype:
            p.grad = view

    def comm_hook(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """The bucket's gradients, averaged: the results of the all-reduces the
        gradient hooks started, in the bucket (copied there where they ran on
        p.grad); a parameter whose hook did not start one is all-reduced from its view
        now, under the name the others use: the bucket's last gradient (DDP calls this
        from its own hook on it, before ours), or one this rank did not use in this
        pass (DDP's find_unused_parameters gives it zeros)."""
        if self.delegate is not None:
            return self.delegate[1](self.delegate[0], bucket)
        buffer = bucket.buffer()
        final = bool(getattr(self.model, "_has_rebuilt_buckets", False))
        handles: List[int] = []
        copies: List[Tuple[torch.Tensor, torch.Tensor]] = []
        for p, view in zip(bucket.parameters(), bucket.gradients()):
            i = self.index[id(p)]
            if final:
                self.views[i] = view
            got = self.started.pop(i, None)
            self.collected.add(i)
            if got is None:
                if final:
                    self._alias(p, view)
                got = (mpi_ops.allreduce_async_(view, name=self.name(i, view),
                                                op=mpi_ops.Average,
                                                process_set=self.process_set), view)
            handles.append(got[0])
            if got[1].data_ptr() != view.data_ptr():
                copies.append((got[1], view))

        def finish(_: Any) -> torch.Tensor:
            with torch.no_grad():
                for result, view in copies:
                    view.copy_(result.view_as(view))
            return buffer
        return completer.submit(handles, finish, cuda_devices([buffer]))


def _process_set(model: Any) -> Any:
    """The process set of DDP's process group if it is netreduce's, else the job's."""
    group = getattr(model, "process_group", None)
    return getattr(group, "_process_set", None) or mpi_ops.global_process_set


def ddp_overlap(model: Any, label: Optional[str] = None) -> _Overlap:
    """Make DistributedDataParallel ``model`` all-reduce each parameter's gradient
    through netreduce as soon as backward produces it (DDP's buckets then only
    gather the results); results equal DDP's own averaging. Call once, after
    wrapping and before training; ``label`` tells two models in one process apart
    (default "model"). DDP's process group may be netreduce's or another (gloo) whose
    ranks are the netreduce job's. As with DDP's gradient_as_bucket_view=True, a
    contiguous parameter's .grad is a view of DDP's bucket after backward, from the
    third step on (so DDP copies no gradient back). Sparse gradients are not supported (as
    for register_comm_hook's own hooks). Returns the hooks' state (its ``started``: the
    parameters whose all-reduce is under way and not yet collected by a bucket), also
    as ``model._netreduce_overlap``; a second call returns it (DDP on a netreduce group
    may have it by default already, see ddp_auto.py)."""
    already = getattr(model, "_netreduce_overlap", None)
    if already is not None:
        return already  # (applied by default at the first forward: ddp_auto.py)
    if not mpi_ops.is_initialized():
        mpi_ops.init()
    state = _Overlap(model, label or "model")
    model._netreduce_overlap = state

    def overlap_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return state.comm_hook(bucket)

    model.register_comm_hook(state, overlap_hook)
    return state
