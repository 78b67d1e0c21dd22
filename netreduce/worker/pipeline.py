"""Agreed groups on the wire while the executor goes on (issue 33's training step).

A group that the ranks' round agreed on (agreement.py) used to run on the executor
thread from start to end: the copy into the fusion buffer, the message, the copy
out; only then the next round. In a backward pass that puts three things in a row
that need not wait for each other: the next round (which completes when the
slowest rank has submitted its group: the ranks' skew in backward), the copy of a
large group into the fusion buffer, and the message on the wire. So the link idled
between messages (~98 ms of a 0.4 s transfer on the resnet18 benchmark, BENCHMARKS.md,
issue 33, "Where the hvd path's step goes"). Here, for a group of at least
MIN_BYTES of all-reduces:

* its large tensors (their own dtype on the wire, no prescale, >= DIRECT_BYTES) go
  as one message each, straight from and into the user's arrays: no fusion copy;
  the rest is fused as before, in a buffer of the pipeline's own (the
  communicator's stays the executor's);
* the messages are handed to the data plane (``allreduce_async``: every algorithm
  runs its calls in the order made -- the engine its requests, several aggregators
  each its range's, hierarchical and failover on a thread of their own,
  netreduce/algorithms/serial.py) and the executor goes back to its loop at once.
  Its next round is queued behind them: it completes
  as soon as the messages ahead are through and every rank has submitted it, so the
  skew is spent while the link is busy, and the next agreed group is queued before
  the link runs dry;
* the landing thread waits for each message in submission order, copies the result
  out (post-scale, Average), and completes its tensors.

Every rank submits the same messages in the same order: which tensors go alone is
decided from their signatures (the same on every rank), and every submission is
made by the executor, in the order of its rounds, before its next message.

A failure: a message that fails completes its tensors with the error and reports it
(Communicator.fail_group, as for a group on the executor); the messages behind it
fail with it (the data plane refuses work after a failure; failover instead moves
the call to the next path and completes it there). While anything is in flight the communicator treats
the data plane as running an agreed group (``flying``): a rank's death aborts it.
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Deque, List, Optional, Tuple

import numpy as np

from netreduce.ops import STORAGE, WIRE_DTYPE, ReduceOp
from netreduce.worker import group_message
from netreduce.worker import timeline as tl
from netreduce.worker.fusion_buffer import FusionBuffer


# A tensor at least this large goes as its own message, reduced in place: a message
# costs a round trip at its tail (~0.1-0.3 ms on the testbed), two copies of 256 KiB
# about as much on a busy core.
DIRECT_BYTES = 256 << 10
# Smaller groups run on the executor as before: their message is about as short as
# the round trip the pipeline would save.
MIN_BYTES = 256 << 10
DEPTH = 2  # fused buffers: one on the wire, the next group's being filled


class _Flight:
    """One data-plane message of a group: its tensors, the request, the buffer it
    was fused in (None: one tensor in place) and when it was submitted."""
    __slots__ = ("tensors", "req", "buf", "spans", "slot", "t_queued", "t_in", "t_sent",
                 "last", "nbytes", "group", "scaled")

    def __init__(self, tensors: List[Any], buf: Optional[np.ndarray],
                 spans: List[Tuple[int, int]], slot: int) -> None:
        self.tensors, self.buf, self.spans, self.slot = tensors, buf, spans, slot
        self.req: Any = None
        self.t_queued = self.t_in = self.t_sent = 0.0
        self.last = False       # the group's last message (its copy_out span ends it)
        self.nbytes = 0         # of this message
        self.group = 0          # tensors in its group
        self.scaled = False     # the data plane applied the tensor's factor (engine_scale)


class Pipeline:
    """One communicator's agreed groups in flight. ``start`` runs on the executor
    (under the agreement's run lock), the landing thread completes them."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.cond = threading.Condition()
        self.flights: Deque[Optional[_Flight]] = collections.deque()
        self.buffers = [FusionBuffer(0, grow=True) for _ in range(DEPTH)]
        self.users = [0] * DEPTH    # flights still reading or writing each buffer
        self.turn = 0
        self.thread: Optional[threading.Thread] = None
        self.closed = False
        self.last_end = 0.0         # when the previous message landed (timeline)
        self.groups = 0             # statistics (tests, benchmarks)
        self.messages = 0
        self.direct = 0             # tensors sent alone, in place

    def flying(self) -> bool:
        """Whether a message of the pipeline is submitted and not yet landed."""
        return bool(self.flights)

    def takes(self, group: List[Any]) -> bool:
        """Whether ``group`` (agreed on every rank) goes through the pipeline: the
        same answer on every rank, from the signatures and the algorithm alone."""
        if self.closed or getattr(self.comm.dp, "allreduce_async", None) is None:
            return False
        if any(t.kind != "allreduce" for t in group):
            return False
        storage = STORAGE[WIRE_DTYPE[group[0].dtype]]
        return sum(t.output.size for t in group) * storage.itemsize >= MIN_BYTES

    def start(self, group: List[Any]) -> None:
        """Submit ``group``'s messages and return (executor thread)."""
        comm = self.comm
        failure = comm.failure()
        if failure is not None:
            comm.complete(group, failure)
            return
        first = group[0]
        wire = WIRE_DTYPE[first.dtype]
        storage = STORAGE[wire]
        wire_op = "sum" if first.op is ReduceOp.Average else first.op.wire
        dp_dtype = "bfloat16" if wire == "bfloat16" else None
        t0 = tl.now_us()
        alone = [storage == t.output.dtype and t.sig.prescale == 1.0 and
                 t.output.size * storage.itemsize >= DIRECT_BYTES for t in group]
        fused = [t for t, a in zip(group, alone) if not a]
        flights: List[_Flight] = []
        slot = -1
        try:
            if fused:
                counts = [t.output.size for t in fused]
                if sum(counts) * storage.itemsize <= comm.fusion.capacity:
                    slot = self._buffer()
                    buf = self.buffers[slot].view(storage, sum(counts))
                else:  # (a lone tensor carried in a wider type: not kept, as group_message)
                    buf = np.empty(sum(counts), dtype=storage)
                spans = FusionBuffer.offsets(counts)
                for t, (a, b) in zip(fused, spans):
                    group_message.copy_in(t, buf[a:b], comm.rank)
                flights.append(_Flight(fused, buf, spans, slot))
            flights += [_Flight([t], None, [], -1) for t, a in zip(group, alone) if a]
            t1 = tl.now_us()
            for f in flights:
                f.t_queued, f.t_in, f.group = t0, t1, len(group)
                f.nbytes = sum(t.output.size for t in f.tensors) * storage.itemsize
                if f.buf is not None:
                    src, dst, scale = f.buf, None, 1.0
                else:
                    t = f.tensors[0]
                    src, dst = t.array, (None if t.output is t.array else t.output)
                    scale = group_message.engine_scale(comm, t, wire_op)
                    f.scaled = scale != 1.0
                f.req = comm.dp.allreduce_async(src, dst, op=wire_op, dtype=dp_dtype, scale=scale)
                f.t_sent = tl.now_us()
                with self.cond:
                    self.flights.append(f)
                    self.cond.notify_all()
            if flights:
                flights[-1].last = True
        except Exception as exc:
            # Not submitted: this rank is out of step with the others from here on.
            if slot >= 0 and not (flights and flights[0].req is not None):
                with self.cond:
                    self.users[slot] -= 1
                    self.cond.notify_all()
            left = [t for f in flights if f.req is None for t in f.tensors] or group
            comm.fail_group(left, exc)
            return
        self.groups += 1
        self.messages += len(flights)
        self.direct += len(flights) - (1 if fused else 0)
        self._ensure_thread()

    def _buffer(self) -> int:
        """A fused buffer no flight uses any more (waits for one to land), taken."""
        with self.cond:
            while True:
                for k in range(DEPTH):
                    slot = (self.turn + k) % DEPTH
                    if self.users[slot] == 0:
                        self.users[slot] = 1
                        self.turn = slot + 1
                        return slot
                self.cond.wait()

    def _ensure_thread(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._land_loop, name="netreduce-landing",
                                           daemon=True)
            self.thread.start()

    def _land_loop(self) -> None:
        while True:
            with self.cond:
                while not self.flights:
                    self.cond.wait()
                f = self.flights[0]
            if f is None:
                with self.cond:
                    self.flights.popleft()
                    self.cond.notify_all()
                return
            self._land(f)
            with self.cond:
                self.flights.popleft()
                if f.slot >= 0:
                    self.users[f.slot] -= 1
                self.cond.notify_all()

    def _land(self, f: _Flight) -> None:
        comm = self.comm
        try:
            f.req.wait()
            t2 = tl.now_us()
            if f.buf is not None:
                for t, (a, b) in zip(f.tensors, f.spans):
                    group_message.copy_out(t, f.buf[a:b], comm.size)
            else:
                group_message.copy_out(f.tensors[0], f.tensors[0].output, comm.size,
                                       scaled=f.scaled)
            t3 = tl.now_us()
        except Exception as exc:
            comm.fail_group(f.tensors, exc)
            return
        if comm.timeline:
            # On the wire from when the message ahead landed (the engine runs one at
            # a time), or from its submission if the link was idle then.
            start = max(f.t_sent, self.last_end)
            args = {"fused": len(f.tensors), "bytes": f.nbytes, "group": f.group}
            for t in f.tensors:
                if not t.t_sent:  # agreed by the ranks' rounds: never negotiated
                    comm.timeline.span(t.name, "queued", t.t_submit, f.t_queued)
                comm.timeline.span(t.name, "copy_in", f.t_queued, f.t_in, args)
                comm.timeline.span(t.name, "allreduce", start, t2, args)
                comm.timeline.span(t.name, "copy_out", t2, t3, args)
        self.last_end = t2
        if f.last:
            comm.groups_executed += 1
        comm.complete(f.tensors)

    def close(self) -> None:
        """Wait for every message in flight to land, then stop the landing thread
        (executor, on its way out; the communicator's shutdown aborts the data plane
        under a message that never lands)."""
        with self.cond:
            self.closed = True
            thread = self.thread
            if thread is None:
                return
            self.flights.append(None)
            self.cond.notify_all()
        thread.join()
