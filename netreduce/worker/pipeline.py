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
  Its next round goes between the group's last two TAIL_BYTES (1 MiB each: the last
  message or two split in two requests there; agreement.py, ``_tail_round``): the
  executor waits until the data ahead of them has landed, fills the round's vector
  then and queues it before the last TAIL_BYTES, so it completes as the link reaches
  them, and the next agreed group is queued while they are on the wire: the skew is
  spent while the link is busy, and the link does not idle for the round's trip and
  the executor's hand-over;
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
# Smaller groups run on the executor as before (their message is about as short as
# the round trip the pipeline would save), except the last group of a round that a
# tail round follows (takes(small=True)): on the executor it would wait behind the data
# in flight, and the link would idle for the round after it.
MIN_BYTES = 256 << 10
DEPTH = 2  # fused buffers: one on the wire, the next group's being filled
# start(tail=True): the group's last TAIL_BYTES wait for the next round, which is
# filled once all but the last 2 x TAIL_BYTES have landed (Agreement._tail_round):
# ~8 ms of wire each at 1 Gbit/s, for the round's trip and the executor's hand-over
# of the next group.
TAIL_BYTES = 1 << 20


class _Flight:
    """One data-plane message of a group: its tensors, the request, the buffer it
    was fused in (None: one tensor in place) and when it was submitted."""
    __slots__ = ("tensors", "reqs", "buf", "spans", "slot", "t_queued", "t_in", "t_sent",
                 "last", "nbytes", "group", "handed")

    def __init__(self, tensors: List[Any], buf: Optional[np.ndarray],
                 spans: List[Tuple[int, int]], slot: int) -> None:
        self.tensors, self.buf, self.spans, self.slot = tensors, buf, spans, slot
        self.reqs: List[Any] = []   # its data-plane requests (a held-back tail: several)
        self.t_queued = self.t_in = self.t_sent = 0.0
        self.last = False       # the group's last message (its copy_out span ends it)
        self.nbytes = 0         # of this message
        self.group = 0          # tensors in its group
        self.handed = False     # wholly submitted, to the landing thread


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
        self.held_back = 0          # Deferred tails not yet submitted or failed
        self.tails = 0              # ... made (statistics), and of them with a head to
        self.tail_heads = 0         # wait for (the group longer than 2 x TAIL_BYTES)

    def flying(self) -> bool:
        """Whether a message of the pipeline is submitted and not yet landed."""
        return bool(self.flights) or self.held_back > 0

    def takes(self, group: List[Any], small: bool = False) -> bool:
        """Whether ``group`` (agreed on every rank) goes through the pipeline: the
        same answer on every rank, from the signatures, the algorithm and ``small``
        (a group under MIN_BYTES too) alone."""
        if self.closed or getattr(self.comm.dp, "allreduce_async", None) is None:
            return False
        if any(t.kind != "allreduce" for t in group):
            return False
        storage = STORAGE[WIRE_DTYPE[group[0].dtype]]
        return small or sum(t.output.size for t in group) * storage.itemsize >= MIN_BYTES

    def start(self, group: List[Any], tail: bool = False) -> Optional["Deferred"]:
        """Submit ``group``'s messages and return (executor thread). ``tail``: all but
        the group's last TAIL_BYTES, returned as a Deferred that the executor submits
        behind its next round (the last message or two split in requests there); the
        same cut on every rank (from the signatures alone)."""
        comm = self.comm
        failure = comm.failure()
        if failure is not None:
            comm.complete(group, failure)
            return None
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
        deferred: Optional[Deferred] = None
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
            flights[-1].last = True  # (before any lands)
            t1 = tl.now_us()
            pieces = []             # (flight, src, dst, end): each request, in order
            pos = 0                 # elements before each flight
            total = sum(t.output.size for t in group)
            tail_elems = TAIL_BYTES // storage.itemsize if tail else 0
            cut_t = max(0, total - tail_elems)
            cut_m = max(0, total - 2 * tail_elems)
            for f in flights:
                f.t_queued, f.t_in, f.group = t0, t1, len(group)
                f.nbytes = sum(t.output.size for t in f.tensors) * storage.itemsize
                if f.buf is not None:
                    src, dst = f.buf, None
                else:
                    t = f.tensors[0]
                    src, dst = t.array, (None if t.output is t.array else t.output)
                n = src.size
                cuts = [c - pos for c in (cut_m, cut_t) if tail and pos < c < pos + n]
                if not cuts:
                    pieces.append((f, src, dst, pos + n))
                else:  # split where the round's wait and the round go (C-contiguous: views)
                    src = src.reshape(-1)
                    dst = None if dst is None else dst.reshape(-1)
                    for a, b in zip([0] + cuts, cuts + [n]):
                        pieces.append((f, src[a:b], None if dst is None else dst[a:b], pos + b))
                pos += n
            head = None
            for k, (f, src, dst, end) in enumerate(pieces):
                if tail and end > cut_t:
                    deferred = Deferred(self, head, pieces[k:], wire_op, dp_dtype)
                    with self.cond:
                        self.held_back += 1
                    self.tails += 1
                    self.tail_heads += head is not None
                    break
                f.reqs.append(comm.dp.allreduce_async(src, dst, op=wire_op, dtype=dp_dtype))
                f.t_sent = f.t_sent or tl.now_us()
                if tail and end <= cut_m:
                    head = f.reqs[-1]
                if k + 1 == len(pieces) or pieces[k + 1][0] is not f:
                    self._hand(f)
        except Exception as exc:
            # Not submitted: this rank is out of step with the others from here on.
            if slot >= 0 and not (flights and flights[0].handed):
                with self.cond:
                    self.users[slot] -= 1
                    self.cond.notify_all()
            left = [t for f in flights if not f.handed for t in f.tensors] or group
            comm.fail_group(left, exc)
            return None
        self.groups += 1
        self.messages += len(flights)
        self.direct += len(flights) - (1 if fused else 0)
        self._ensure_thread()
        return deferred

    def _hand(self, f: _Flight) -> None:
        """``f`` wholly submitted: to the landing thread."""
        f.handed = True
        with self.cond:
            self.flights.append(f)
            self.cond.notify_all()

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
            for req in f.reqs:
                req.wait()
            t2 = tl.now_us()
            if f.buf is not None:
                for t, (a, b) in zip(f.tensors, f.spans):
                    group_message.copy_out(t, f.buf[a:b], comm.size)
            else:
                group_message.copy_out(f.tensors[0], f.tensors[0].output, comm.size)
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


class Deferred:
    """A group's last TAIL_BYTES, held back by Pipeline.start(tail=True) for the
    executor's next round (Agreement._tail_round): ``await_head()`` until all but the
    last 2 x TAIL_BYTES have landed, the round, ``submit()``; ``fail(exc)`` instead
    when the round cannot come."""

    def __init__(self, pipe: Pipeline, head: Any, pieces: List[Tuple[_Flight, Any, Any, int]],
                 op: str, dtype: Optional[str]) -> None:
        self.pipe, self.head, self.pieces, self.op, self.dtype = pipe, head, pieces, op, dtype

    def _release(self) -> None:
        with self.pipe.cond:
            self.pipe.held_back -= 1

    def await_head(self) -> None:
        if self.head is not None:
            self.head.wait()

    def submit(self) -> None:
        pieces, self.pieces = self.pieces, []
        dp = self.pipe.comm.dp
        for k, (f, src, dst, _) in enumerate(pieces):
            try:
                f.reqs.append(dp.allreduce_async(src, dst, op=self.op, dtype=self.dtype))
                f.t_sent = f.t_sent or tl.now_us()
            except Exception:
                self.pieces = pieces[k:]   # not submitted: failed by the caller (fail)
                raise
            if k + 1 == len(pieces) or pieces[k + 1][0] is not f:
                self.pipe._hand(f)
        self._release()

    def fail(self, exc: BaseException) -> None:
        """The held-back flights fail with ``exc`` (their buffers freed)."""
        flights: List[_Flight] = []
        for f, _, _, _ in self.pieces:
            if not flights or flights[-1] is not f:
                flights.append(f)
        if not self.pieces:
            return              # (submitted, or failed already)
        self.pieces = []
        self._release()
        pipe = self.pipe
        for f in flights:
            if f.slot >= 0:
                with pipe.cond:
                    pipe.users[f.slot] -= 1
                    pipe.cond.notify_all()
            pipe.comm.fail_group(f.tensors, exc)
