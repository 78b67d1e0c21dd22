"""Chrome-trace timeline of every tensor's phases, like Horovod's HOROVOD_TIMELINE.

NETREDUCE_TIMELINE=path turns it on. Rank 0 writes ``path``; other ranks write only
when the path contains ``{rank}`` (one file each), because N processes appending to
one file would interleave. Each tensor gets its own row (a trace "thread"), each
phase one complete ("X") event:

    negotiate       submitted -> request handed to the coordinator
    wait_for_ranks  request handed over -> every rank had submitted it (response)
    queued          submitted -> its message starts, for a tensor the ranks agreed on
                    among themselves (a cached one: netreduce/worker/agreement.py)
    copy_in         into the fusion buffer (with the prescale)
    allreduce       the data-plane all-reduce of the fused message
    copy_out        out of the fusion buffer (with postscale / average)

and the ranks' agreement rounds (each a small data-plane message) have a row of
their own, "(agreement rounds)", one "round" event each.

Timestamps are wall-clock microseconds so that traces of different ranks line up.
Load the file in chrome://tracing or ui.perfetto.dev.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Dict, Optional

PHASES = ("negotiate", "wait_for_ranks", "queued", "copy_in", "allreduce", "copy_out", "round")


def now_us() -> float:
    return time.time_ns() / 1000.0


class Timeline:
    def __init__(self, path: str, rank: int) -> None:
        self.path = path
        self.rank = rank
        self._lock = threading.Lock()
        self._tids: Dict[str, int] = {}
        self._file = open(path, "w")
        # JSON array format; the closing bracket is written by close(). Chrome also
        # loads an unterminated array, so a crashed run's trace is still readable.
        self._file.write("[\n")
        self._first = True
        self._emit({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                    "args": {"name": f"rank {rank}"}})

    @classmethod
    def from_config(cls, path: str, rank: int) -> Optional["Timeline"]:
        if not path:
            return None
        if "{rank}" in path:
            return cls(path.replace("{rank}", str(rank)), rank)
        return cls(path, rank) if rank == 0 else None

    def _emit(self, event: Dict[str, Any]) -> None:
        text = json.dumps(event, separators=(",", ":"))
        self._file.write(text if self._first else ",\n" + text)
        self._first = False

    def _tid(self, name: str) -> int:
        tid = self._tids.get(name)
        if tid is None:
            tid = self._tids[name] = len(self._tids) + 1
            self._emit({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid,
                        "args": {"name": name}})
        return tid

    def span(self, tensor: str, phase: str, start_us: float, end_us: float,
             args: Optional[Dict[str, Any]] = None) -> None:
        with self._lock:
            if self._file.closed:
                return
            event = {"name": phase, "ph": "X", "pid": self.rank, "tid": self._tid(tensor),
                     "ts": round(start_us, 1), "dur": round(max(end_us - start_us, 0.0), 1)}
            if args:
                event["args"] = args
            self._emit(event)

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.write("\n]\n")
                self._file.close()
