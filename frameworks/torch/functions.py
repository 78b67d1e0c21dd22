"""Model and optimizer state synchronisation (horovod.torch.functions)."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch

import netreduce as _nr
from netreduce.errors import InvalidArgumentError, InvalidTypeError

from .mpi_ops import (broadcast_async_, global_process_set, synchronize, _check_process_set,
                      _on_process_set, _set_root)


def broadcast_parameters(params: Union[Dict[str, torch.Tensor], Iterable[Any]], root_rank: int,
                         prefix: Optional[str] = None, process_set=global_process_set) -> None:
    """Overwrite every rank's parameters with root_rank's, in place.

    ``params`` is ``model.state_dict()``, ``model.named_parameters()`` or a list of
    tensors or ``(name, tensor)`` pairs. Broadcasts are issued together and waited for
    at the end, so the core can fuse them."""
    _check_process_set(process_set)
    if isinstance(params, dict):
        items: List[Tuple[Optional[str], Any]] = sorted(params.items())
    elif isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise InvalidArgumentError(f"invalid params of type: {type(params)}")
    handles = []
    for index, (name, tensor) in enumerate(items):
        if not torch.is_tensor(tensor):
            continue  # e.g. a model's extra state that is not a tensor
        label = f"{prefix or ''}{name}" if name is not None else f"{prefix or ''}param.{index}"
        handles.append(broadcast_async_(tensor.data, root_rank, name=f"broadcast.{label}",
                                        process_set=process_set))
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: Optional[torch.nn.Module] = None,
                              process_set=global_process_set) -> None:
    """Make every rank's optimizer state (tensors and options) equal root_rank's.

    A fresh optimizer has no state yet (momentum buffers appear at the first step), so
    it first takes one step on zero gradients, as Horovod does, so that every rank has
    the same tensors to receive into; the parameters are put back afterwards (weight
    decay would have moved them). Parameters that require a gradient and had none
    keep that zero gradient, as under Horovod (code written for Horovod reads it);
    a gradient a parameter already had is put back. Those zero gradients are sparse
    where the optimizer takes only sparse ones: every parameter for
    torch.optim.SparseAdam, and with ``model`` the weights of its
    ``nn.Embedding(sparse=True)`` modules (Horovod's use of ``model``)."""
    _check_process_set(process_set)
    if model is not None and not isinstance(model, torch.nn.Module):
        raise InvalidTypeError(f"broadcast_optimizer_state(): model must be a torch.nn.Module, "
                        f"got {type(model).__name__}")
    if isinstance(optimizer, torch.optim.LBFGS):
        raise InvalidArgumentError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        sparse = {id(p) for m in (model.modules() if model is not None else ())
                  if isinstance(m, torch.nn.Embedding) and m.sparse for p in m.parameters()}
        all_sparse = isinstance(optimizer, torch.optim.SparseAdam)
        params = [p for group in optimizer.param_groups for p in group["params"]
                  if p.requires_grad]
        saved = [(p, p.detach().clone(), p.grad) for p in params]
        for p in params:
            zero = torch.zeros_like(p)
            p.grad = zero.to_sparse() if all_sparse or id(p) in sparse else zero
        base_step = getattr(optimizer, "_netreduce_base_step", None)
        (base_step or optimizer.step)()  # a DistributedOptimizer must not all-reduce here
        with torch.no_grad():
            for p, data, grad in saved:
                p.copy_(data)
                if grad is not None:
                    p.grad = grad
        state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        return  # a stateless optimizer (plain SGD): nothing to send

    # Options (lr, betas, ...) and non-tensor per-parameter state travel as one object;
    # tensors are broadcast in place into the optimizer's own state (optimizer.state).
    options = [{k: v for k, v in group.items() if k != "params"}
               for group in optimizer.param_groups]
    scalars: Dict[Tuple[int, int, str], Any] = {}
    handles = []
    for gi, group in enumerate(optimizer.param_groups):
        for pi, param in enumerate(group["params"]):
            for key, value in sorted(optimizer.state.get(param, {}).items()):
                if torch.is_tensor(value):
                    handles.append(broadcast_async_(value, root_rank,
                                                    name=f"optimizer_state.{gi}.{pi}.{key}",
                                                    process_set=process_set))
                else:
                    scalars[(gi, pi, key)] = value
    options, scalars = _nr.broadcast_object((options, scalars), _set_root(root_rank, process_set))
    for handle in handles:
        synchronize(handle)
    for group, opts in zip(optimizer.param_groups, options):
        group.update(opts)
    for (gi, pi, key), value in scalars.items():
        optimizer.state[optimizer.param_groups[gi]["params"][pi]][key] = value


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set=global_process_set) -> Any:
    """Return root_rank's ``obj`` (any picklable object) on every rank."""
    _check_process_set(process_set)
    return _nr.broadcast_object(obj, _set_root(root_rank, process_set))


def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set=global_process_set) -> List[Any]:
    """Return the list of every rank's ``obj``, indexed by rank."""
    _check_process_set(process_set)
    return _nr.allgather_object(obj)


for _name in ("broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
              "allgather_object"):
    globals()[_name] = _on_process_set(globals()[_name])
