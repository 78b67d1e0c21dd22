"""The hierarchical ("parallel") all-reduce: shared memory inside a host, one shard
per local rank through the aggregator, shared memory again (docs/hierarchical.md).

Host h runs local ranks 0..L-1. Local rank l of every host is rank h of the
aggregator sub-job ``<job>/shard-<l>`` (world size H = number of hosts), so a host
streams L shards of S/L bytes each, in parallel, through L engine connections, and
its link carries S each way instead of L·S. The whole per-chunk pipeline runs in
native code (native/algorithms/hierarchical.cc) with the GIL released; this class
only checks arguments, owns the connections and turns native errors into
NetReduceErrors. With one host there is no sub-job and no network stage at all.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from netreduce import _native
from netreduce.algorithms.base import check_reduction, unscaled
from netreduce.algorithms.hosts import Layout
from netreduce.algorithms.serial import Serial
from netreduce.errors import DataPlaneError, NetReduceError, RankFailedError

log = logging.getLogger("netreduce")
# Ring slots: the shared-memory stage of chunk k+1 overlaps the network of chunk k, and
# a third slot keeps one more shard queued at the engine, so that a rank descheduled
# for a few ms (more ranks than cores) does not leave the link idle.
DEPTH = 3


def shard_job(job: str, local_rank: int) -> str:
    return f"{job}/shard-{local_rank}"


class Hierarchical:
    name = "hierarchical"
    scales_results = False  # results scaled after the all-reduce, in Python (base.py)

    def __init__(self, flat: Any, layout: Layout, native: Any, shard: Optional[Any],
                 timeout: float = 60.0) -> None:
        self.flat = flat          # the flat connection: topology exchange, kept for the job's place
        self.layout = layout
        self._native = native
        self.shard = shard        # this local rank's sub-job connection (None on one host)
        # The native pipeline runs one call at a time (chunk serials must follow the
        # same order on every local rank): calls, submitted ones (allreduce_async)
        # included, run in the order made; direct users may have several threads.
        self._serial = Serial("netreduce-hierarchical")
        self._timeout_s = timeout  # NETREDUCE_TIMEOUT: what a native call may last
        self._where = (f"rank {layout.rank} (local rank {layout.local_rank} of "
                       f"{layout.local_size} on host '{layout.labels[layout.host_index]}')")

    # -- construction: every rank of the job calls this at once ------------------
    @classmethod
    def build(cls, flat: Any, layout: Layout, *, job: str, address: Any, timeout: float,
              start_timeout: float, shard_chunk: int, connect: Callable[..., Any],
              connect_kw: Dict[str, Any], spin_us: float) -> "Hierarchical":
        L, H = layout.local_size, layout.num_hosts
        if not shard_chunk:
            shard_chunk = (1 << 20) if H > 1 else (256 << 10)
        shard_chunk = max(64, shard_chunk // 64 * 64)
        # Local rank 0 creates the segment; the others learn (pid, fd, nonce) through
        # a second exchange over the flat data plane and open it.
        seg = _native.ShmSegment.create(L, L * shard_chunk, DEPTH) if layout.local_rank == 0 else None
        rows = np.zeros((layout_size(layout), 3), dtype=np.int64)
        if seg is not None:
            rows[layout.rank] = (layout.pids[layout.rank], seg.fd, seg.nonce)
        flat.allreduce(rows)
        if seg is None:
            leader = layout.local_ranks[0]
            pid, fd, nonce = (int(x) for x in rows[leader])
            try:
                seg = _native.ShmSegment.attach(pid, fd, nonce, layout.local_rank)
            except (ValueError, _native.EngineError) as exc:
                raise DataPlaneError(f"rank {layout.rank}: cannot attach to the shared-memory "
                                     f"segment of rank {leader} (local rank 0): {exc}") from None
        shard = None
        try:
            engine = None
            if H > 1:
                # Each sub-job has a pool of its own at the aggregator, so every stream
                # may keep its whole pool in flight (NETREDUCE_WINDOW still caps it):
                # on a loaded host a larger window rides out scheduling gaps.
                shard = connect(address, job=shard_job(job, layout.local_rank),
                                rank=layout.host_index, size=H, **dict(connect_kw, timeout=timeout))
                engine = shard._live()  # the native engine (waits for the sub-job's ranks)
            native = _native.Hierarchical(seg, engine, layout.local_ranks,
                                          layout.labels[layout.host_index], timeout,
                                          spin_us)  # NETREDUCE_SHM_SPIN_US
            try:
                native.start(start_timeout)
            except _native.EngineError as exc:
                raise DataPlaneError(f"rank {layout.rank}: {exc}") from None
        except BaseException:
            if shard is not None:
                shard.close()
            raise
        return cls(flat, layout, native, shard, timeout)

    # -- the Algorithm interface ---------------------------------------------------
    def allreduce(self, src: np.ndarray, dst: Optional[np.ndarray] = None, op: str = "sum",
                  dtype: Optional[str] = None, scale: float = 1.0) -> np.ndarray:
        if scale != 1.0:
            raise unscaled(self.name, scale)
        src, dst, name = check_reduction(src, dst, op, dtype, "netreduce")
        native = self._live()
        return self._serial.call(lambda: self._reduce(native, src, dst, name, op))

    def allreduce_async(self, src: np.ndarray, dst: Optional[np.ndarray] = None,
                        op: str = "sum", dtype: Optional[str] = None,
                        scale: float = 1.0) -> Any:
        """allreduce() queued behind every call made before it and run on the
        algorithm's own thread; the request's wait() returns ``dst`` or raises what
        allreduce() would (agreed groups in flight, netreduce/worker/pipeline.py)."""
        if scale != 1.0:
            raise unscaled(self.name, scale)
        src, dst, name = check_reduction(src, dst, op, dtype, "netreduce")
        native = self._live()
        return self._serial.submit(lambda: self._reduce(native, src, dst, name, op))

    def _reduce(self, native: Any, src: np.ndarray, dst: np.ndarray, name: str,
                op: str) -> np.ndarray:
        try:
            native.allreduce(src, dst, _native.DTYPES[name], _native.OPS[op])
        except _native.EngineError as exc:
            raise self._error(native, exc) from None
        return dst

    def _error(self, native: Any, exc: Exception) -> NetReduceError:
        failed = native.failed_rank
        if failed >= 0:
            return RankFailedError(f"{self._where}: {exc}", failed)
        return DataPlaneError(f"{self._where}: {exc}")

    @property
    def vote_step(self) -> Optional[Callable[..., int]]:
        """A steady step's whole message in one native call (Speculation.run_lone,
        native/algorithms/vote_step.h): 0 discarded, 1 complete, 2 complete with more
        to say. None with a native module built before it."""
        return self._vote_step if hasattr(_native.Hierarchical, "vote_step") else None

    def _vote_step(self, src: np.ndarray, buf: np.ndarray, out: np.ndarray, factor: float,
                   ranks: int) -> int:
        native = self._live()
        try:
            return self._serial.call(native.vote_step, src, buf, out, factor, ranks)
        except _native.EngineError as exc:
            raise self._error(native, exc) from None

    def _live(self) -> Any:
        if self._native is None:
            raise DataPlaneError(f"{self._where}: this connection was closed")
        return self._native

    def abort(self, reason: str) -> None:
        self._live().abort(reason)

    def stats(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {f"shm_{k}": v for k, v in self._live().stats().items()}
        if self.shard is not None:
            out.update(self.shard.stats())
        out["algorithm"] = self.name
        return out

    def counters(self) -> Dict[str, Any]:
        return self.flat.counters()

    def close(self) -> None:
        # Queued calls fail; a running one has NETREDUCE_TIMEOUT at most (bounded
        # natively) before the segment and the shard's engine go away under it.
        self._serial.close(f"{self._where}: this connection was closed", self._timeout_s)
        native, self._native = self._native, None
        del native  # unmaps the segment; the engine it used goes with the shard below
        if self.shard is not None:
            self.shard.close()
        self.flat.close()


def layout_size(layout: Layout) -> int:
    return sum(len(h) for h in layout.hosts)


__all__: List[str] = ["Hierarchical", "shard_job"]
