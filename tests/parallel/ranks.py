"""Run one function as N rank processes on loopback and collect what each returns."""
from __future__ import annotations

import multiprocessing as mp
import traceback
from typing import Any, Callable, List

_CTX = mp.get_context("fork")


def _entry(fn, rank, size, args, q):
    try:
        q.put((rank, True, fn(rank, size, *args)))
    except BaseException as exc:  # report, never hang the parent
        q.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def rank_barrier(parties: int) -> Any:
    """A barrier the rank processes of one run_ranks() call can meet at (pass it in args)."""
    return _CTX.Barrier(parties)


def run_ranks(fn: Callable[..., Any], size: int, *args: Any, timeout: float = 120.0) -> List[Any]:
    """fn(rank, size, *args) in `size` processes; returns the results by rank, or
    raises AssertionError with every failing rank's traceback."""
    q = _CTX.Queue()
    procs = [_CTX.Process(target=_entry, args=(fn, r, size, args, q)) for r in range(size)]
    for p in procs:
        p.start()
    results: dict = {}
    errors = []
    try:
        for _ in range(size):
            rank, ok, value = q.get(timeout=timeout)
            if ok:
                results[rank] = value
            else:
                errors.append(f"rank {rank}: {value}")
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(size)]


def rounds_of_sums(rank: int, size: int, address: Any, job: str, count: int, rounds: int) -> Any:
    """A rank that all-reduces `rounds` float32 arrays of `count`, rank r giving r + 1 + i
    in round i, each checked in full; returns its engine's stats and group note (why it
    left the job's multicast group out, "" if it did not)."""
    import numpy as np
    from netreduce.worker import dataplane

    with dataplane.connect(address, job, rank, size, timeout=30.0) as conn:
        for i in range(rounds):
            a = np.full(count, rank + 1 + i, np.float32)
            conn.allreduce(a)
            want = size * (size + 1) // 2 + size * i
            assert (a == want).all(), (rank, i, np.unique(a)[:5])
        return conn.stats(), conn._engine.group_note

