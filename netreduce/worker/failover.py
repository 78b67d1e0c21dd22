"""Aggregator failover: the job's data path dies mid-job, training goes on.

An Algorithm (algorithms/base.py) over the job's current path — the aggregator(s),
a standby, or the host all-reduce (job_paths.py) — that the communicator calls like
any other. When the path fails (its aggregator's control connection closes, or an
all-reduce on it fails), every rank moves to the next path that admits them all
and the interrupted all-reduce completes there, exactly.

Why it is exact. The path reduces out of place into one of two scratch buffers
(alternating by call), never into the caller's arrays: a call's input stays intact
until its result is complete, and the result of the last completed call stays in
its scratch while the next call runs. Results of a call reach a rank only once
every rank contributed to all of it, and a rank starts call c+1 only after call c
returned, so when the path dies every rank has completed either the same number
of calls, m, or m+1 (the fastest ones got the last results, the others did not):

* ranks that completed m+1 hold call m's result; the lowest of them sends it over
  the new path (its bytes as int32, the others add zeros: exact for every dtype),
  and the others return it from the interrupted call;
* every call not completed everywhere (call m when nobody finished it, call m+1
  otherwise) is run again on the new path from the intact inputs.

Partial in-place results do exist — scratch of the interrupted call holds the sums
of the chunks that had arrived — and are simply dropped, counted in stats()
``interrupted_partial``. The cost of failover being on: one copy of each result
(scratch to the caller's buffer) and two scratch buffers of the largest call.

Who recovers: each rank's monitor thread long-polls the job's rendezvous
(rendezvous.py, served by rank 0, not by the aggregator) for a failover request;
whichever rank notices first (EOF on an aggregator's control connection, a failed
all-reduce) posts one. The monitor aborts the path, waits for its own executor to
leave it, exchanges (completed calls, partial) with every rank, and opens the next
path with job_paths.Opener. If no path admits every rank, every rank's all-reduce
raises a DataPlaneError naming the aggregator that failed; every step of that is
bounded by NETREDUCE_TIMEOUT.
"""
from __future__ import annotations

import copy
import logging
import select
import socket
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from netreduce.algorithms.base import check_reduction, unscaled
from netreduce.algorithms.serial import Serial
from netreduce.errors import DataPlaneError, NetReduceError
from netreduce.worker import job_status

log = logging.getLogger("netreduce")
WATCH_POLL_S = 0.2  # how often the path watcher re-reads the current path's sockets


def _connections(path: Any) -> List[Any]:
    if getattr(path, "connections", None):
        return list(path.connections)
    if hasattr(path, "shard"):  # hierarchical: its flat connection and its shard's
        return [c for c in (path.flat, path.shard) if c is not None]
    return [path.connection]


def _received(path: Any) -> int:
    try:
        return int(path.stats().get("packets_received", 0))
    except Exception:  # an engine not started or already released
        return 0


class Failover:
    name = "failover"
    scales_results = False  # results scaled after the all-reduce, in Python (base.py)

    def __init__(self, cands: Sequence[Any], index: int, path: Any, opener: Any, rv: Any,
                 topo: Any, timeout: float, start_reasons: Sequence[str] = ()) -> None:
        self.cands, self.index, self.opener, self.rv = list(cands), index, opener, rv
        self.rank, self.size, self.job = topo.rank, topo.size, topo.job
        self.timeout = timeout
        self._path = path
        self._cond = threading.Condition()
        self._gen = 0                      # path generation: +1 per failover
        self._recovering: Optional[int] = None
        self._failed: Optional[NetReduceError] = None
        self._closing = False
        self._in_call = False              # the executor is inside the path
        self._pending: Optional[int] = None  # call index started, not completed
        self._done = 0                     # calls completed
        self._bufs = [np.empty(0, np.uint8), np.empty(0, np.uint8)]
        self._nbytes = [0, 0]
        self._rx_start = 0
        # One call on the path at a time, in the order made (the exactness argument
        # above rests on it): a submitted call (allreduce_async) runs on the serial's
        # thread, and a blocking call made meanwhile queues behind it.
        self._serial = Serial("netreduce-failover-calls")
        self.history: List[Dict[str, Any]] = []  # one record per failover
        self.degraded = list(start_reasons)      # why the job did not start on the first path
        self._monitor = threading.Thread(target=self._monitor_loop, daemon=True,
                                         name="netreduce-failover")
        self._watcher = threading.Thread(target=self._watch_loop, daemon=True,
                                         name="netreduce-path-watch")
        self._monitor.start()
        self._watcher.start()
        if self.rank == 0 and self.degraded:
            _report_refusals(self.cands, range(index), self.degraded, self.job,
                             self.cands[index].kind)

    # -- the Algorithm interface ---------------------------------------------------
    def allreduce(self, src: np.ndarray, dst: Optional[np.ndarray] = None, op: str = "sum",
                  dtype: Optional[str] = None, scale: float = 1.0) -> np.ndarray:
        if scale != 1.0:
            raise unscaled(self.name, scale)
        src, dst, _ = check_reduction(src, dst, op, dtype, "netreduce")
        return self._serial.call(lambda: self._call(src, dst, op, dtype))

    def allreduce_async(self, src: np.ndarray, dst: Optional[np.ndarray] = None,
                        op: str = "sum", dtype: Optional[str] = None,
                        scale: float = 1.0) -> Any:
        """allreduce() queued behind every call made before it, on failover's own
        thread: the executor goes on while it is on the wire and through a failover
        (netreduce/worker/pipeline.py); the request's wait() returns ``dst``."""
        if scale != 1.0:
            raise unscaled(self.name, scale)
        src, dst, _ = check_reduction(src, dst, op, dtype, "netreduce")
        return self._serial.submit(lambda: self._call(src, dst, op, dtype))

    def _call(self, src: np.ndarray, dst: np.ndarray, op: str, dtype: Optional[str]
              ) -> np.ndarray:
        """One call, completed on the current path or, through failovers, on the
        next (the module's docstring says why exactly)."""
        with self._cond:
            c = self._done
            scratch = self._scratch(c, src)
            self._pending = c
        while True:
            with self._cond:
                # Bounded even if the monitor got stuck: the abort, two exchanges and
                # an admission attempt per path, each within NETREDUCE_TIMEOUT.
                if not self._cond.wait_for(
                        lambda: self._recovering is None or self._failed is not None,
                        timeout=self.timeout * (3 + 2 * len(self.cands))):
                    self._failed = DataPlaneError(
                        f"rank {self.rank}: {self._describe()} failed and the job's failover "
                        f"did not finish within {self.timeout * (3 + 2 * len(self.cands)):g} s")
                if self._failed is not None:
                    raise copy.copy(self._failed)
                if self._done > c:  # recovery delivered this call's result
                    break
                path, gen = self._path, self._gen
                self._in_call = True
            self._rx_start = _received(path)
            error: Optional[NetReduceError] = None
            try:
                path.allreduce(src, scratch, op=op, dtype=dtype)
            except NetReduceError as exc:
                error = exc
            with self._cond:
                self._in_call = False
                if error is None:
                    self._done, self._pending = c + 1, None
                self._cond.notify_all()
                if error is None:
                    break
                if self._failed is not None:
                    raise copy.copy(self._failed)
                moving = self._gen != gen or self._recovering is not None
            if not moving:
                self._request(gen, f"an all-reduce on it failed: {error}")
                with self._cond:
                    if not self._cond.wait_for(
                            lambda: self._gen != gen or self._recovering is not None
                            or self._failed is not None, timeout=self.timeout):
                        self._failed = DataPlaneError(
                            f"rank {self.rank}: {self._describe()} failed ({error}) and the "
                            f"job's failover did not start within {self.timeout:g} s")
        np.copyto(dst, scratch)
        return dst

    def _scratch(self, c: int, src: np.ndarray) -> np.ndarray:
        i = c % 2
        if self._bufs[i].nbytes < src.nbytes:
            self._bufs[i] = np.empty(src.nbytes, np.uint8)
        self._nbytes[i] = src.nbytes
        return self._bufs[i][:src.nbytes].view(src.dtype).reshape(src.shape)

    def abort(self, reason: str) -> None:
        """The communicator's abort (a rank died, the job failed): no failover."""
        with self._cond:
            if self._failed is None:
                self._failed = DataPlaneError(reason)
            self._cond.notify_all()
            path = self._path
        try:
            path.abort(reason)
        except NetReduceError:
            pass

    def stats(self) -> Dict[str, Any]:
        with self._cond:
            path = self._path
            out: Dict[str, Any] = {
                "algorithm": self.name, "path": self.cands[self.index].describe(),
                "path_kind": self.cands[self.index].kind, "generation": self._gen,
                "failovers": len(self.history), "degraded_at_start": bool(self.degraded),
                "results_from_peer": sum(h["from_peer"] for h in self.history),
                "calls_redone": sum(h["redone"] for h in self.history),
                "interrupted_partial": sum(h["partial_ranks"] for h in self.history)}
        try:
            for k, v in path.stats().items():
                out.setdefault(k, v)
        except NetReduceError:
            pass
        return out

    def status(self) -> Dict[str, Any]:
        """What the job runs on now, for `netreduce info` and its metrics (job_status.py):
        degraded = the host all-reduce (no aggregator sums the job's data)."""
        with self._cond:
            cand = self.cands[self.index]
            return {"job": self.job, "size": self.size, "path": cand.describe(),
                    "path_kind": cand.kind, "on_primary": self.index == 0,
                    "degraded": cand.kind == "host", "start_reasons": list(self.degraded),
                    "generation": self._gen, "failovers": len(self.history),
                    "history": [{k: h[k] for k in ("from", "to", "reason", "completed")}
                                for h in self.history[-5:]],
                    "failed": str(self._failed) if self._failed is not None and
                    not self._closing else ""}

    def counters(self) -> Dict[str, Any]:
        return _connections(self._path)[0].counters()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            if self._failed is None:
                self._failed = DataPlaneError(f"rank {self.rank}: this connection was closed")
            self._cond.notify_all()
            path, reason = self._path, str(self._failed)
        self._serial.close(reason, 0.0)  # a call still queued fails (one running: _failed)
        try:
            # Every rank closes before rank 0 stops the rendezvous it serves.
            self.rv.gather("closing", None, wait=min(self.timeout, 10.0))
        except NetReduceError:
            pass
        path.close()

    # -- detection -----------------------------------------------------------------
    def _describe(self) -> str:
        return self.cands[self.index].describe()

    def _request(self, gen: int, reason: str) -> None:
        try:
            self.rv.request(gen, f"rank {self.rank}: {self._describe()}: {reason}")
        except NetReduceError as exc:
            self._fatal(DataPlaneError(f"rank {self.rank}: {self._describe()} failed ({reason}) "
                                       f"and the job's rendezvous is gone too: {exc}"))

    def _fatal(self, error: NetReduceError) -> None:
        with self._cond:
            if self._failed is None:
                self._failed = error
            self._cond.notify_all()
            path = self._path
        try:
            path.abort(str(error))
        except NetReduceError:
            pass

    def _watch_loop(self) -> None:
        """EOF on an aggregator's control connection: it stopped or died."""
        while True:
            with self._cond:
                if self._closing or self._failed is not None:
                    return
                gen, path, cand = self._gen, self._path, self.cands[self.index]
                busy = self._recovering is not None
            if busy or cand.kind != "switch":  # a host path dies only with a rank
                threading.Event().wait(WATCH_POLL_S)
                continue
            socks = [c.control_socket() for c in _connections(path)]
            try:
                ready, _, _ = select.select(socks, [], [], WATCH_POLL_S)
            except (OSError, ValueError):
                ready = socks  # closed under us: see below
            for i, s in enumerate(ready):
                try:
                    data = s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:  # a reply for a concurrent call: not ours to read
                    threading.Event().wait(WATCH_POLL_S)
                    continue
                with self._cond:
                    if self._gen != gen or self._closing:
                        break
                self._request(gen, "its control connection closed (it stopped or died)")
                with self._cond:
                    self._cond.wait_for(lambda: self._gen != gen or self._failed is not None
                                        or self._closing, timeout=self.timeout)
                break

    def _monitor_loop(self) -> None:
        while True:
            with self._cond:
                if self._closing or self._failed is not None:
                    return
                gen = self._gen
            try:
                req = self.rv.watch(gen)
            except NetReduceError as exc:
                with self._cond:
                    if self._closing or self._failed is not None:
                        return
                self._fatal(DataPlaneError(f"rank {self.rank}: the job's rendezvous (rank 0) "
                                           f"is gone: {exc}"))
                return
            if req and int(req["gen"]) == gen:
                try:
                    self._recover(gen, str(req.get("reason", "")))
                except NetReduceError as exc:
                    self._fatal(exc)
                    return
                except Exception as exc:  # a bug must not leave the executor waiting
                    log.exception("netreduce failover failed")
                    self._fatal(DataPlaneError(f"rank {self.rank}: failover failed: {exc!r}"))
                    return

    # -- recovery --------------------------------------------------------------------
    def _recover(self, gen: int, reason: str) -> None:
        t0 = time.monotonic()
        with self._cond:
            if self._gen != gen or self._failed is not None:
                return
            self._recovering = gen
            old, old_index = self._path, self.index
        try:
            old.abort(f"failing over: {reason}")
        except NetReduceError:
            pass
        with self._cond:
            if not self._cond.wait_for(lambda: not self._in_call, timeout=self.timeout):
                raise DataPlaneError(f"rank {self.rank}: the all-reduce on {self._describe()} "
                                     f"did not stop within {self.timeout:g} s of the abort")
            done, pending = self._done, self._pending
            last = self._nbytes[(done - 1) % 2] if done else 0
            now = self._nbytes[done % 2] if pending is not None else 0
        partial = pending is not None and _received(old) > self._rx_start
        t_parked = time.monotonic()
        states = self.rv.gather(f"recover-{gen}", {"done": done, "pending": pending is not None,
                                                   "last": last, "now": now, "partial": partial})
        dones = [int(s["done"]) for s in states]
        lo, hi = min(dones), max(dones)
        if hi - lo > 1 or any(d == lo and not s["pending"] for d, s in zip(dones, states)
                              if hi > lo):
            raise DataPlaneError(f"rank {self.rank}: ranks out of step at failover (completed "
                                 f"calls {dones}); the job cannot recover")
        try:
            old.close()
        except NetReduceError:
            pass
        failed = self.cands[old_index]
        n = len(self.cands)
        # The paths after the failed one, then those before it, the failed one last
        # (it may come back: a restarted daemon).
        order = [(old_index + k) % n for k in range(1, n + 1)]
        t_agreed = time.monotonic()
        index, path, reasons = self.opener.first(self.cands, order, f"gen{gen + 1}",
                                                 reach_for=min(self.timeout, 10.0))
        if path is None:
            raise DataPlaneError(
                f"rank {self.rank} of job '{self.job}': {failed.describe()} failed ({reason}) "
                f"and no other path admitted every rank: {' | '.join(reasons)}")
        t_opened = time.monotonic()
        from_peer = 0
        if hi > lo:
            holder = dones.index(hi)
            nbytes = int(states[holder]["last"])
            words = np.zeros((nbytes + 3) // 4, np.int32)
            if self.rank == holder:
                words.view(np.uint8)[:nbytes] = self._bufs[lo % 2][:nbytes]
            if words.size:  # the same on every rank: the holder's size
                path.allreduce(words)
            if done == lo:
                self._bufs[lo % 2][:nbytes] = words.view(np.uint8)[:nbytes]
                from_peer = 1
        record = {"gen": gen, "from": failed.describe(), "to": self.cands[index].describe(),
                  "reason": reason, "completed": dones, "from_peer": from_peer,
                  "redone": int(pending is not None and not from_peer),
                  "interrupted_bytes": now,  # the call under way here (0: none)
                  "partial_ranks": sum(1 for s in states if s["partial"]),
                  # seconds: abort until the executor left the path; the exchange;
                  # admission at the new path; the whole recovery (no redo included)
                  "parked_s": round(t_parked - t0, 4), "exchange_s": round(t_agreed - t_parked, 4),
                  "open_s": round(t_opened - t_agreed, 4), "recovery_s": round(time.monotonic() - t0, 4)}
        if self.rank == 0:  # aggregators that refused the job on the way count it
            _report_refusals(self.cands, order[:order.index(index)], reasons, self.job,
                             self.cands[index].kind)
        with self._cond:
            if from_peer:
                self._done, self._pending = lo + 1, None
            self._path, self.index, self._gen = path, index, gen + 1
            self._recovering = None
            self.history.append(record)
            self._cond.notify_all()
        (log.warning if self.rank == 0 else log.info)(
            "netreduce: job '%s': %s failed (%s); continuing on %s (calls completed per rank "
            "%s, %d rank(s) held partial results)", self.job, failed.describe(), reason,
            self.cands[index].describe(), dones, record["partial_ranks"])


def _report_refusals(cands: Sequence[Any], tried: Sequence[int], reasons: Sequence[str],
                     job: str, to: str) -> None:
    """Rank 0: tell the aggregators of the candidates that did not take the job (in
    the background: the job does not wait for them)."""
    pairs = [(cands[i], r) for i, r in zip(tried, reasons)]
    if pairs:
        threading.Thread(target=lambda: [job_status.report_fell_back(c, r, job, to)
                                         for c, r in pairs],
                         daemon=True, name="netreduce-fell-back").start()
