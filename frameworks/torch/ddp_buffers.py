"""DDP's buffer sync on a netreduce process group: one message after forward, off the
critical path, instead of two broadcasts before it.

With ``broadcast_buffers=True`` (the default) DDP broadcasts rank 0's buffers before
every forward that follows a training forward (``_sync_buffers`` in ``_pre_forward``):
``dist._broadcast_coalesced`` makes one broadcast per dtype (resnet18's BatchNorm
statistics: 40 KB float32, 160 B int64), each waited for before forward runs. That is
two rounds and a barrier of every rank in front of each forward (16-34 ms per step on a
loaded 2-core testbed; BENCHMARKS.md, issue 33, "ddpbuf").

What DDP broadcasts before forward k+1 is rank 0's buffers as forward k left them
(nothing else in a training step writes them: backward and the optimizer touch
parameters and gradients). So the sync starts right after forward k instead, as one
broadcast of every buffer's bytes (bit-exact for every dtype), in flight behind
backward's first gradients; each rank writes the result into its buffers when backward
ends (an autograd callback) or, if no backward came, before the next forward; DDP's own
sync before forward k+1 is then skipped. Which forward sees which values is unchanged:
forward k+1 runs on rank 0's buffers as of forward k's end. What changes: the other
ranks hold rank 0's values from backward's end (DDP: their own until the next forward),
and a buffer changed between steps on rank 0 alone is no longer sent before the next
forward (one changed on every rank, e.g. a checkpoint loaded, stays; docs/torch.md).

It decides per forward exactly where DDP would (``will_sync_module_buffers()`` after
DDP's ``_post_forward``, which is what DDP's ``_pre_forward`` tests next), and steps
aside for DDP's own sync when a buffer comm hook is registered (the user's), DDP's
join context is enabled (its authoritative rank need not be 0), or the buffers span
several devices or include sparse tensors.
"""
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.distributed as dist

ALIGN = 8  # bytes: each buffer's stretch starts where any dtype may view it


class BufferSync:
    """One DDP module's buffer sync after forward (see the module's docstring)."""

    def __init__(self, ddp: Any) -> None:
        self.ddp = ddp
        self.rank = ddp.process_group.rank()
        # the sync started after the last forward: (work, buffers, their byte offsets)
        self.pending: Optional[Tuple[Any, List[torch.Tensor], List[int]]] = None
        self.covered = False     # that sync stands for DDP's before the next forward
        self.flat: Optional[torch.Tensor] = None  # the bytes on the wire, reused
        self.messages = 0        # syncs started (tests count them)
        self._sync_buffers: Callable[[], None] = ddp._sync_buffers  # DDP's own
        ddp._sync_buffers = self._instead_of_ddps  # (an instance attribute: this DDP only)
        ddp.register_forward_pre_hook(self._before_forward)
        ddp.register_forward_hook(self._after_forward)

    def _instead_of_ddps(self) -> None:
        """DDP's ``_sync_buffers`` (called before forward, or after it with a
        POST_FORWARD buffer hook): skipped when the sync after the last forward covers
        this forward, else DDP's own."""
        covered, self.covered = self.covered, False
        if covered and self._applies():
            self.finish()
            return
        self._sync_buffers()

    def _applies(self) -> bool:
        ddp = self.ddp
        return not hasattr(ddp, "buffer_hook") and not ddp._join_config.enable

    def _before_forward(self, ddp: Any, inputs: Any) -> None:
        self.finish()  # (a forward with no backward after it left one in flight)

    def _after_forward(self, ddp: Any, inputs: Any, output: Any) -> None:
        # DDP's _post_forward has set require_forward_param_sync for the next forward:
        # will_sync_module_buffers() now is what DDP's next _pre_forward decides on.
        self.covered = False
        if not (ddp.will_sync_module_buffers() and self._applies()):
            return
        ddp._assign_modules_buffers()  # (buffers may be reassigned, as DDP does)
        buffers = list(ddp.modules_buffers)
        if len({b.device for b in buffers}) != 1 or any(b.is_sparse for b in buffers):
            return  # DDP's own sync before the next forward
        self.finish()
        self._start(buffers)
        self.covered = True
        if torch.is_grad_enabled():
            self._finish_at_backwards_end(output)

    def _start(self, buffers: List[torch.Tensor]) -> None:
        offsets, total = [], 0
        for b in buffers:
            offsets.append(total)
            total += -(-b.numel() * b.element_size() // ALIGN) * ALIGN
        flat = self.flat
        if flat is None or flat.numel() != total or flat.device != buffers[0].device:
            flat = self.flat = torch.zeros(total, dtype=torch.uint8, device=buffers[0].device)
        if self.rank == 0:
            with torch.no_grad():
                for b, start in zip(buffers, offsets):
                    data = b.detach().reshape(-1).view(torch.uint8)
                    flat[start:start + data.numel()].copy_(data)
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        work = self.ddp.process_group.broadcast([flat], opts)
        self.pending = (work, buffers, offsets)
        self.messages += 1

    def _finish_at_backwards_end(self, output: Any) -> None:
        """Write the result into the buffers when the backward through ``output`` ends
        (an autograd engine callback, queued by the first of output's gradients)."""
        queued = []

        def on_gradient(grad: torch.Tensor) -> None:
            if not queued:
                queued.append(True)
                torch.autograd.Variable._execution_engine.queue_callback(self.finish)

        for tensor in torch.utils._pytree.tree_leaves(output):
            if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                tensor.register_hook(on_gradient)

    def finish(self) -> None:
        """Wait for the sync in flight, if any, and give every rank rank 0's values."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        work, buffers, offsets = pending
        work.wait()
        if self.rank == 0:
            return  # (its buffers are what it sent)
        flat = self.flat
        with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(tuple(buffers)):
            for b, start in zip(buffers, offsets):
                nbytes = b.numel() * b.element_size()
                b.copy_(flat[start:start + nbytes].view(b.dtype).view(b.shape))


def sync_after_forward(ddp: Any) -> BufferSync:
    """Give DDP module ``ddp`` (on a netreduce process group) the buffer sync after
    forward; returns its state, also as ``ddp._netreduce_buffers``."""
    state = BufferSync(ddp)
    ddp._netreduce_buffers = state
    return state
