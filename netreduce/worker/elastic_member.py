"""This process's membership in an elastic job: its side of the elastic driver.

netreduce-run's elastic driver (netreduce/launcher/elastic/) gives every worker
NETREDUCE_ELASTIC (its address) and NETREDUCE_ELASTIC_WORKER (the worker's name,
HOST:SLOT). ``join()``, which init() calls, asks the driver for this worker's place in
the first membership epoch after the last one it was in — waiting while the driver
forms it — and sets the process's rank, size, local rank and size and epoch
(NETREDUCE_RANK, ... NETREDUCE_EPOCH) from the answer, so that rank discovery and
admission read them as they read a launcher's. A worker that the new epoch leaves
out (its host was removed or blacklisted) gets RemovedFromJob.

A thread long-polls the driver for host updates (hosts added or removed by
discovery, counted by the driver only when they change the ranks): ``pending()``
says whether one came that the current epoch does not reflect yet, which
netreduce/elastic.py turns into HostsUpdatedInterrupt at a commit that all ranks agree on.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, List, Optional, Tuple

from netreduce import config
from netreduce.errors import (AdmissionError, ControlPlaneError, DataPlaneError, NetReduceError,
                              OperationTimeoutError, RankFailedError, ShutdownError)
from netreduce.protocol import auth, messages
from netreduce.protocol.address import format_address, parse_address
from netreduce.protocol.client import ControlConnection

log = logging.getLogger("netreduce")

WORKER_RANK = -1       # the rank a worker's proof names (the driver's server.py)
UPDATES_WAIT_S = 30.0  # one updates poll; the driver holds it until an update or then
RETRY_S = 1.0          # between attempts to reach the driver again (updates poll)
START_RETRY_S = 0.5    # between starts in the same epoch (the aggregator is away)
# A start (init()) that fails with one of these is tried again: in the same epoch
# while the driver says it stands (the aggregator is restarting, say), else in the next.
RETRIED = (RankFailedError, ControlPlaneError, AdmissionError, DataPlaneError,
           OperationTimeoutError, ShutdownError)


class RemovedFromJob(NetReduceError):
    """The elastic driver left this worker out of the job's new membership."""


class ElasticJobOver(NetReduceError):
    """The elastic driver stopped the job (it failed or finished) while this worker
    asked for its place."""


class _DriverConnection:
    """One connection to the driver (the control protocol's schema and version
    exchange: protocol/client.py), bound to this worker by the job's proof."""

    def __init__(self, address: Tuple[str, int], job: str, worker: str, secret: str,
                 timeout: Optional[float]) -> None:
        self.address = format_address(address)
        self.where = f"elastic driver {self.address} (worker {worker})"
        try:
            # the driver is one of the job's own servers: TLS as they serve it
            self.conn = ControlConnection(address, timeout=timeout, aggregator=False)
            self.conn.request(messages.ElasticBind(
                job=job, worker=worker, auth=auth.prove_on(self.conn, secret, job, WORKER_RANK)))
        except ControlPlaneError as exc:
            raise self._error(exc) from None

    def request(self, msg: messages.Request, timeout: Optional[float]) -> Any:
        """``msg``'s reply; ``timeout`` None waits as long as the driver takes."""
        try:
            return self.conn.request(msg, timeout=timeout)
        except ControlPlaneError as exc:
            raise self._error(exc) from None

    def _error(self, exc: ControlPlaneError) -> ControlPlaneError:
        """``exc`` naming the driver (the connection's words name "the aggregator")."""
        text = str(exc)
        unreachable = f"cannot reach aggregator control port {self.address}: "
        if text.startswith(unreachable):
            why = text[len(unreachable):].split("; is netreduce-switch", 1)[0]
            return ControlPlaneError(f"{self.where}: cannot connect: {why}; is netreduce-run "
                                     "(the driver) still running?")
        for said in (f"the aggregator at {self.address}", f"aggregator {self.address}"):
            text = text.replace(said + ": ", "").replace(said, "it")
        return ControlPlaneError(f"{self.where}: {text}")

    def close(self) -> None:
        self.conn.close()


class Member:
    """The membership of this process (one per process: ``member()``)."""

    def __init__(self, address: str, worker: str, job: str) -> None:
        self.address = parse_address(address, what="NETREDUCE_ELASTIC")
        self.worker, self.job = worker, job
        self.epoch = 0                  # the last epoch joined (0: none yet)
        self.assignment: Optional[messages.ElasticJoinReply] = None
        self.synced = 0                 # host updates the current epoch reflects
        self._lock = threading.Lock()
        self._changes: List[Tuple[int, int]] = []  # (update number, flags) seen by the watch
        self._watch: Optional[threading.Thread] = None
        self._join_conn: Optional[_DriverConnection] = None
        self._retry_same = False        # the next join() keeps the current epoch
        self._failing_since: Optional[float] = None

    def _connect(self, timeout: Optional[float]) -> _DriverConnection:
        return _DriverConnection(self.address, self.job, self.worker, auth.job_secret(), timeout)

    def join(self) -> messages.ElasticJoinReply:
        """This worker's place in the epoch after the last one it was in; sets the
        process's rank variables. RemovedFromJob, ElasticJobOver, ControlPlaneError."""
        if self._retry_same and self.assignment is not None:
            self._retry_same = False
            reply = self.assignment
        else:
            reply = self._driver_call(messages.ElasticJoin(after=self.epoch), timeout=None)
        if reply.removed:
            rank = self.assignment.rank if self.assignment is not None else "?"
            raise RemovedFromJob(f"worker {self.worker} (rank {rank} of epoch {self.epoch}) is "
                                 f"not in the job's next membership: {reply.removed}")
        if reply.stop:
            raise ElasticJobOver(f"worker {self.worker}: the elastic driver stopped the job "
                                 f"'{self.job}': {reply.stop}")
        self.epoch = reply.epoch
        self.assignment = reply
        with self._lock:
            self.synced = reply.updates
            self._changes = [c for c in self._changes if c[0] > self.synced]
        for knob, value in (("NETREDUCE_RANK", reply.rank), ("NETREDUCE_SIZE", reply.size),
                            ("NETREDUCE_LOCAL_RANK", reply.local_rank),
                            ("NETREDUCE_LOCAL_SIZE", reply.local_size),
                            ("NETREDUCE_EPOCH", reply.epoch)):
            config.set_for_process(knob, value)
        self._start_watch()
        log.debug("worker %s: epoch %d, rank %d of %d", self.worker, self.epoch, reply.rank,
                  reply.size)
        return reply

    def _driver_call(self, msg: messages.Request, timeout: Optional[float]) -> Any:
        if self._join_conn is None:
            self._join_conn = self._connect(None)
        try:
            return self._join_conn.request(msg, timeout=timeout)
        except ControlPlaneError:
            self._join_conn.close()
            self._join_conn = None
            raise

    def started(self) -> None:
        """init() completed in the current epoch."""
        self._failing_since = None

    def failed_start(self, exc: BaseException) -> None:
        """init() failed in the current epoch with ``exc`` (one of RETRIED): decide
        where the next join() goes — the same epoch while the driver says it stands
        (after START_RETRY_S), else the next — or re-raise ``exc`` once
        NETREDUCE_START_TIMEOUT has passed since the first failure in a row."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        if now - self._failing_since > float(config.get("NETREDUCE_START_TIMEOUT")):
            raise exc
        status = self._driver_call(messages.ElasticStatus(),
                                   timeout=float(config.get("NETREDUCE_TIMEOUT")))
        self._retry_same = status.epoch == self.epoch and not status.breaking
        log.info("worker %s: start in epoch %d failed (%s); %s", self.worker, self.epoch, exc,
                 "trying again in the same epoch" if self._retry_same else
                 "asking for the next epoch")
        if self._retry_same:
            time.sleep(START_RETRY_S)

    # --- host updates -----------------------------------------------------------------
    def pending(self) -> Tuple[int, bool, bool]:
        """(latest host update seen, any removed, any added) past ``synced``; (synced,
        False, False) when none."""
        with self._lock:
            fresh = [c for c in self._changes if c[0] > self.synced]
        if not fresh:
            return self.synced, False, False
        flags = 0
        for _, f in fresh:
            flags |= f
        return max(n for n, _ in fresh), bool(flags & 1), bool(flags & 2)

    def settle(self, update: int) -> None:
        """Every rank agreed that updates up to ``update`` are being acted on."""
        with self._lock:
            self.synced = max(self.synced, update)

    def _start_watch(self) -> None:
        if self._watch is None:
            self._watch = threading.Thread(target=self._watch_loop, daemon=True,
                                           name="netreduce-elastic-watch")
            self._watch.start()

    def _watch_loop(self) -> None:
        conn: Optional[_DriverConnection] = None
        seen = 0
        while True:
            try:
                if conn is None:
                    conn = self._connect(float(config.get("NETREDUCE_TIMEOUT")))
                with self._lock:
                    seen = max([seen, self.synced] + [c[0] for c in self._changes])
                reply = conn.request(messages.ElasticUpdates(seen=seen, wait=UPDATES_WAIT_S),
                                     timeout=UPDATES_WAIT_S + 30)
            except (ControlPlaneError, OSError, ValueError) as exc:
                log.debug("worker %s: host-update watch: %s", self.worker, exc)
                if conn is not None:
                    conn.close()
                    conn = None
                threading.Event().wait(RETRY_S)
                continue
            changes = [(int(n), int(f)) for n, f in reply.changes]
            if changes:
                with self._lock:
                    known = {c[0] for c in self._changes}
                    self._changes.extend(c for c in changes if c[0] not in known)


_member: Optional[Member] = None
_member_lock = threading.Lock()


def member() -> Optional[Member]:
    """This process's membership, or None outside an elastic job (NETREDUCE_ELASTIC unset)."""
    global _member
    address = config.get("NETREDUCE_ELASTIC")
    if not address:
        return None
    with _member_lock:
        if _member is None:
            worker = config.get("NETREDUCE_ELASTIC_WORKER")
            job = config.get("NETREDUCE_JOB")
            if not worker or not job:
                raise NetReduceError(
                    f"NETREDUCE_ELASTIC={address} names an elastic driver, but "
                    f"NETREDUCE_ELASTIC_WORKER ({worker!r}) or NETREDUCE_JOB ({job!r}) is "
                    "unset; the driver (netreduce-run) sets all three for its workers")
            _member = Member(address, worker, job)
        return _member
