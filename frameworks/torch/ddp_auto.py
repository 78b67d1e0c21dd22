"""ddp_overlap by default: DistributedDataParallel on a netreduce process group
all-reduces each gradient as backward produces it without the user's call.

DDP alone starts a bucket's all-reduce when the bucket's last gradient is in (25 MiB
buckets: resnet18's link idles for the first quarter of backward and its last 15.9 MB
leave only when backward ends). ``ddp_overlap(model)`` fixes that, but only for users
who know to call it; a torch user writes ``DDP(model)`` after
``init_process_group("netreduce")`` and should get the same step.

How: the first netreduce process group installs a module registration hook (torch's
global one, which runs when a module is assigned as another's child, i.e. at model
construction only, never per forward). DDP's constructor assigns ``self.module``;
that DDP gets a forward pre-hook, which at its first forward with gradients recorded
(comm hooks must be registered before the first backward, and no backward comes
without such a forward) decides once and removes itself. It applies ``ddp_overlap``
when DDP's process group is netreduce's and DDP would otherwise all-reduce its
buckets itself, and with it DDP's buffer sync becomes one message after forward
instead of two before it (ddp_buffers.py); it steps aside (plain DDP) when:

- NETREDUCE_DDP_OVERLAP=0 (the opt-out);
- a comm hook is registered already (the user's own, a builtin one, or
  ``ddp_overlap``'s: a user who called it keeps their label);
- DDP runs a path without the C++ reducer's buckets (compiled autograd's python
  reducer, ``_delay_all_reduce_all_params``), mixed precision, or a module that
  makes sparse gradients (ddp_overlap supports dense ones only).

A comm hook the user registers later (after the first forward, before backward, as
torch allows) takes over from the overlap: the instance's ``register_comm_hook``
is replaced by one that hands the bucket hook to the user's (a reducer takes only one
comm hook, so torch's own call would fail once ours is in).
"""
import logging
import weakref
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from netreduce import config

from .ddp_buffers import sync_after_forward
from .ddp_hook import ddp_overlap

log = logging.getLogger("netreduce")
_registration: Optional[Any] = None   # the global hook's handle, once installed
_seen: "weakref.WeakSet[Any]" = weakref.WeakSet()  # DDP modules given the first-forward hook


def install() -> None:
    """Watch for DDP modules from now on (idempotent; the netreduce process group's
    creation calls it, so jobs without one pay nothing)."""
    global _registration
    if _registration is None:
        _registration = torch.nn.modules.module.register_module_module_registration_hook(
            _on_registration)


def _on_registration(parent: Any, name: str, child: Any) -> None:
    # DDP's constructor: ``self.module = module``, before its reducer exists.
    if name != "module" or not isinstance(parent, DistributedDataParallel) or parent in _seen:
        return None
    _seen.add(parent)
    handle = None

    def first_forward(ddp: Any, inputs: Any) -> None:
        if not torch.is_grad_enabled():
            return  # no backward follows: decide at a forward that records gradients
        handle.remove()
        reason = why_not(ddp)
        if reason:
            log.debug("netreduce: DDP keeps its own bucket all-reduces: %s", reason)
            return
        state = ddp_overlap(ddp, ddp.process_group.ddp_label())
        _hand_over_later_hooks(ddp, state)
        sync_after_forward(ddp)  # its buffers: one message after forward (ddp_buffers.py)

    handle = parent.register_forward_pre_hook(first_forward)
    return None


def why_not(ddp: Any) -> str:
    """Why this DDP module keeps plain DDP ('' = it gets ddp_overlap)."""
    if not config.get("NETREDUCE_DDP_OVERLAP"):
        return "NETREDUCE_DDP_OVERLAP=0"
    # (ProcessGroupNetReduce by what it offers: process_group.py imports this module)
    if not callable(getattr(getattr(ddp, "process_group", None), "ddp_label", None)):
        return "its process group is not netreduce's"
    if getattr(ddp, "reducer", None) is None or getattr(ddp, "_use_python_reducer", False) \
            or getattr(ddp, "_delay_all_reduce_all_params", False):
        return "no C++ reducer buckets (compiled autograd or delayed all-reduce)"
    if getattr(ddp, "_comm_hooks", None) or ddp._get_ddp_logging_data().get("comm_hook"):
        return "a comm hook is registered"
    if getattr(ddp, "mixed_precision", None) is not None:
        return "DDP's mixed precision"
    for module in ddp.module.modules():
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse:
            return f"sparse gradients ({type(module).__name__}(sparse=True))"
    return ""


def _hand_over_later_hooks(ddp: Any, state: Any) -> None:
    """A comm hook registered after the overlap took the reducer's one slot replaces it."""
    def register_comm_hook(hook_state: object, hook: Any) -> None:
        ddp._check_comm_hook(hook)
        ddp.logger._set_comm_hook_name(hook.__qualname__)
        ddp._comm_hooks[:] = [(hook, hook_state)]
        state.hand_over(hook_state, hook)

    def register_builtin_comm_hook(comm_hook_type: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        hooks = {dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
                 dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook}
        register_comm_hook(ddp.process_group, hooks[comm_hook_type])

    # Instance attributes shadow DDP's methods for this module only.
    ddp.register_comm_hook = register_comm_hook
    ddp._register_builtin_comm_hook = register_builtin_comm_hook
