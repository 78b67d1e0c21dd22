"""The vote folded into the data: a steady step in one data-plane message
(docs/control_plane.md, "Speculation").

A round (netreduce/worker/agreement.py) costs one data-plane message before the agreed
group's own message. In a steady training loop the round agrees on the same small
group step after step, so once two consecutive agreements ran exactly the same one
group G (same ids, in the same fused order), every rank makes its next message a
*speculative* one instead of a round: one sum all-reduce of

    [ vote per id of G | other | G's data, fused as the group would be ]

in a scratch buffer (the user's arrays are only read). A rank votes 1 for an id it
has submitted (not stale) and contributes that tensor's data, 0 and zeros otherwise;
``other`` is 1 when it has anything the round must see: other cached ids, log
entries held for a round, ids to invalidate, a join, its shutdown, a stale
submission. The sums say what happened, and say it the same on every rank:

* every vote is N: every rank contributed G's data, so the sums are G's result —
  copied out (post-scale, Average) as the group's own message would have been;
* otherwise the sums are discarded (nothing was written to a user's array) and the
  submissions stay pending for the round that follows.

The next message is speculative again only when every vote was N and ``other`` is
0; otherwise it is a round, which then sees everything the speculation did not.
Both choices depend only on the sums, so every rank issues the same messages in the
same order. A rank with nothing submitted joins at the idle pace with zero votes,
exactly as it joins rounds, so stale_s, bans, the coordinator fallback and its
NETREDUCE_TIMEOUT errors work as without speculation (after one failed
speculation). Votes are exact because G's wire dtype holds every count up to N
exactly (float32/float64/int32/int64) and its wire op is a sum.

A G of one float tensor whose synchronous call finds nothing else here runs its
step in one call on the user's thread (Agreement.steady, run_lone): the same
message, built without a Tensor or Handle, through the algorithm's native vote_step
where it has one.
"""
from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from netreduce.ops import STORAGE, WIRE_DTYPE, ReduceOp
from netreduce.protocol.signature import nbytes
from netreduce.worker import group_message
from netreduce.worker import timeline as tl
from netreduce.worker.fusion_buffer import FusionBuffer

EXACT_WIRE = ("float32", "float64", "int32", "int64")  # a sum of N ones is exact
MAX_BYTES = 64 << 10        # larger groups: the round is small next to the data
FLOAT32_MAX = float(np.finfo(np.float32).max)
SUM_OPS = (ReduceOp.Sum, ReduceOp.Average)


def eligible(group: Sequence[Any]) -> bool:
    """Whether a fused group can carry its own vote (the same answer on every rank:
    it reads only the signature, which the coordinator checked across ranks)."""
    if not group:
        return False
    wire = WIRE_DTYPE.get(group[0].dtype)
    if wire not in EXACT_WIRE:
        return False
    for t in group:
        if t.kind != "allreduce" or t.op not in SUM_OPS or WIRE_DTYPE.get(t.dtype) != wire:
            return False
    return sum(nbytes(t.sig) for t in group) <= MAX_BYTES


class Speculation:
    """One communicator's speculative messages: armed by rounds, run under the
    agreement's run lock (by the executor, or by a user thread in Handle.wait)."""

    def __init__(self, agreement: Any) -> None:
        self.ag = agreement
        self.ids: Optional[Tuple[int, ...]] = None   # armed: G's ids, in fused order
        self.prev: Optional[Tuple[int, ...]] = None  # the last group agreed on
        self.sigs: Tuple[tuple, ...] = ()
        self.spans: List[Tuple[int, int]] = []
        self.buf: Optional[np.ndarray] = None
        self.views: List[np.ndarray] = []
        # per tensor of G, from its signature at arming (a step whose signature differs
        # is not G's): whether its contribution is a plain copy into its view, and the
        # factor its result is multiplied by when that is a plain float multiply
        # (None: the general copy_in/copy_out (group_message.py), e.g. int8 or bfloat16)
        self.plain_in: List[bool] = []
        self.out_factor: List[Optional[float]] = []
        self.shaped: List[np.ndarray] = []  # the views in each tensor's shape
        self.votes: Optional[np.ndarray] = None  # buf[:k + 1]
        self.full: List[int] = []           # the votes of a complete step: N per id
        self.idset: frozenset = frozenset()  # G's ids
        self.hits = 0                                 # statistics (tests, benchmarks)
        self.lone_hits = 0                            # ... of them in one call (run_lone)
        self.misses = 0
        self.idle = 0                                 # messages where no rank had anything
        self.waited = False     # the user was waiting for the last step (run() says why)
        # the message being issued: G's tensors this rank holds (None: not), other
        self.mine: List[Any] = []
        self.other = False
        self.t0 = 0.0           # when its part was written (timeline)
        # G's lone tensor, when G is one tensor whose step can run in one call on the
        # user's thread (Agreement.steady: its own dtype on the wire, no prescale, a
        # float result); None otherwise
        self.lone: Optional[str] = None
        self.lone_in: Optional[np.ndarray] = None   # its data, during run_lone's _fill_lone
        # the algorithm whose vote_step (the whole message in one native call:
        # native/algorithms/vote_step.h) run_lone uses, if it has one
        self.step_dp: Any = None
        self.step_fn: Optional[Callable[..., int]] = None

    @property
    def armed(self) -> bool:
        return self.ids is not None

    def disarm(self) -> None:
        self.ids = None
        self.lone = None

    def covered(self) -> bool:
        """Whether this rank holds all of G (read on user threads under the
        agreement's lock; a stale answer only delays a step to the next poll)."""
        return self.ids is not None and self.idset <= self.ag.pending.keys()

    def agreed(self, groups: List[Tuple[Tuple[int, ...], List[Any]]]) -> None:
        """A round agreed on ``groups`` ((ids, tensors) in execution order): arm when
        it is one eligible group, the same as the previous agreement's. A round that
        agreed nothing (a slower rank) leaves the history as it was."""
        if not groups:
            return
        if len(groups) != 1 or not eligible(groups[0][1]):
            self.prev = None
            return
        ids, tensors = groups[0]
        if ids == self.prev:
            self._arm(ids, tensors)
        self.prev = ids

    def _arm(self, ids: Tuple[int, ...], tensors: List[Any]) -> None:
        self.ids = ids
        self.sigs = tuple(t.sig for t in tensors)
        counts = [int(np.prod(t.sig.shape, dtype=np.int64)) if t.sig.shape else 1 for t in tensors]
        self.spans = FusionBuffer.offsets(counts)
        storage = STORAGE[WIRE_DTYPE[tensors[0].dtype]]
        size = len(ids) + 1 + sum(counts)
        if self.buf is None or self.buf.dtype != storage or self.buf.size != size:
            self.buf = np.empty(size, dtype=storage)
        data = self.buf[len(ids) + 1:]
        self.views = [data[a:b] for a, b in self.spans]  # each tensor's place
        self.shaped = [v.reshape(t.sig.shape) for v, t in zip(self.views, tensors)]
        self.votes = self.buf[:len(ids) + 1]
        size_ = self.ag.comm.size
        self.full = [size_] * len(ids)
        self.idset = frozenset(ids)
        self.plain_in = [WIRE_DTYPE[t.dtype] == t.dtype and t.sig.prescale == 1.0 for t in tensors]
        self.out_factor = [
            (t.sig.postscale / size_ if t.op is ReduceOp.Average else t.sig.postscale)
            if t.dtype in ("float32", "float64") else None for t in tensors]
        factor = self.out_factor[0]
        # (a factor beyond float32's range would make numpy multiply in float64)
        self.lone = tensors[0].name if len(tensors) == 1 and self.plain_in[0] and \
            factor is not None and abs(factor) <= FLOAT32_MAX else None

    def run(self, held: bool, by_user: bool = False) -> Optional[bool]:
        """One speculative message. Returns True when G completed, False when the
        sums were discarded, None when the message failed (the failure is reported:
        the plain executor takes over)."""
        ag, comm, ids = self.ag, self.ag.comm, self.ids
        assert ids is not None and self.buf is not None and self.votes is not None
        k = len(ids)
        mine: List[Any] = []
        now = time.monotonic()
        with ag.lock:
            joined = bool(ag.joins) and ag.joined()
            other = held or ag.leaving or joined or bool(ag.invalidate) or \
                not ag.pending.keys() <= self.idset
            for i, sig in zip(ids, self.sigs):
                t = None if joined else ag.pending.get(i)
                if t is not None and (now - ag.since[i] > ag.stale_s or t.sig != sig):
                    t, other = None, True   # the round that follows bans it
                mine.append(t)
        self.mine, self.other = mine, other
        if not ag.issue(self.buf, "sum", self._fill):
            return None
        ag.rounds += 1
        sums = self.votes.tolist()
        complete = sums[:k] == self.full
        if complete:
            for t, view, shaped, factor in zip(mine, self.views, self.shaped, self.out_factor):
                if factor is None:
                    group_message.copy_out(t, view, comm.size)
                elif factor == 1.0:
                    t.output[...] = shaped    # the output has the tensor's dtype and shape
                else:   # what scale_into does for a float tensor, without its dispatch
                    np.multiply(shaped, factor, out=t.output)
            if comm.timeline:
                t1 = tl.now_us()
                for t in mine:
                    comm.timeline.span(t.name, "allreduce", self.t0, t1,
                                       {"fused": k, "speculative": 1})
            with ag.lock:
                for i in ids:
                    ag.pending.pop(i, None)
                    ag.since.pop(i, None)
            ag.mark_agreed(mine)
            self.hits += 1
            comm.groups_executed += 1
            comm.complete(mine)
            # The user waited for this step when it ran it (help), or when its wait was
            # under way as the executor ran it (it lost the run lock to a poll): either
            # way a synchronous loop, whose next submission is left to its wait.
            self.waited = by_user or all(t.handle._event.waited for t in mine)
        elif not any(sums):
            self.idle += 1                    # nobody had anything: nothing to see
            return False
        else:
            self.misses += 1
        if not complete or sums[k] != 0:
            self.disarm()                     # a round next: it sees what we did not
        return complete

    def run_lone(self, array: np.ndarray, output: np.ndarray) -> Optional[bool]:
        """run() for G's lone tensor, submitted here and nothing else (Agreement.steady
        checked that, so this rank's part is a vote of 1, ``other`` 0 and ``array``),
        on the caller's thread, inside the message its Communicator.claim began: True
        when ``output`` holds the result, False when the sums were discarded (disarmed:
        a round next), None when the message failed (reported)."""
        ag = self.ag
        assert self.buf is not None and self.votes is not None
        dp = ag.comm.dp
        if dp is not self.step_dp:              # (failover may change the path)
            self.step_dp, self.step_fn = dp, getattr(dp, "vote_step", None)
        # fill, message, votes, copy-out in one native call (arrays in the machine's
        # byte order: numpy's builtin dtype objects)
        if self.step_fn is not None and array.dtype is self.buf.dtype is output.dtype:
            outcome = ag.step_call(self.step_fn, array, self.buf, output, self.out_factor[0],
                                   ag.comm.size)
            if outcome is None:
                return None
            other = outcome == 2
        else:
            self.lone_in = array
            if not ag.issue(self.buf, "sum", self._fill_lone):
                self.lone_in = None
                return None
            votes = self.votes.tolist()
            outcome = 1 if votes[0] == ag.comm.size else 0
            other = votes[1] != 0
            if outcome:
                factor = self.out_factor[0]
                assert factor is not None   # (a lone tensor's is: _arm)
                if factor == 1.0:
                    output[...] = self.shaped[0]
                else:   # what scale_into does for a float tensor, without its dispatch
                    np.multiply(self.shaped[0], factor, out=output)
        ag.rounds += 1
        if not outcome:
            self.misses += 1
            self.disarm()
            return False
        ag.agreed += 1
        ag.comm.groups_executed += 1
        self.hits += 1
        self.lone_hits += 1
        self.waited = True      # the user's own thread ran it: a synchronous loop
        if other:
            self.disarm()       # a round next: it sees what we did not
        return True

    def _fill_lone(self) -> None:
        """run_lone's part of the message (Agreement.issue calls it)."""
        votes = self.votes
        assert votes is not None
        votes[0] = 1
        votes[1] = 0
        self.shaped[0][...] = self.lone_in
        self.lone_in = None     # held no longer than the message: the user's array

    def _fill(self) -> None:
        """This rank's part of the message (Agreement.issue calls it): a vote and the
        data per tensor of G it holds (``mine``), 0 and zeros for the others, and
        ``other``."""
        votes, comm, mine = self.votes, self.ag.comm, self.mine
        self.mine = []          # held no longer than the message: the user's arrays
        assert votes is not None
        for j, (t, view) in enumerate(zip(mine, self.views)):
            if t is None:
                votes[j] = 0
                view.fill(0)
            else:
                votes[j] = 1
                if self.plain_in[j]:
                    self.shaped[j][...] = t.array  # same dtype and shape: a copy
                else:
                    group_message.copy_in(t, view, comm.rank)
        votes[len(mine)] = 1 if self.other else 0
        self.t0 = tl.now_us() if comm.timeline else 0.0
