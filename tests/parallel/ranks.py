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
