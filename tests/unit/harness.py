"""Run N ranks as threads of this process through the public API, on the fakes."""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional

from netreduce import config
from netreduce.worker import context
from netreduce.worker.communicator import Communicator
from netreduce.environment import Topology

from tests.unit.fakes import FakeControlServer, FakeFabric


class Ranks:
    def __init__(self, size: int, knobs: Optional[Dict[str, Any]] = None,
                 job: str = "job") -> None:
        self.size, self.job = size, job
        self.knobs = config.snapshot(knobs)
        self.server = FakeControlServer()
        self.fabric = FakeFabric(timeout=float(self.knobs["NETREDUCE_TIMEOUT"]))
        self.comms: List[Optional[Communicator]] = [None] * size

    def run(self, fn: Callable[[int], Any], timeout: float = 60.0,
            shutdown: bool = True) -> List[Any]:
        """fn(rank) on every rank; returns results, or raises the first rank's error
        (all errors are kept in self.errors)."""
        results: List[Any] = [None] * self.size
        self.errors: List[Optional[BaseException]] = [None] * self.size

        def worker(r: int) -> None:
            try:
                comm = Communicator(rank=r, size=self.size, job=self.job,
                                    address=self.server.address,
                                    dataplane=self.fabric.connect(None, self.job, r, self.size),
                                    knobs=self.knobs)
                comm.topology = Topology(r, self.size, r, self.size, self.job, "threads")
                self.comms[r] = comm
                context.thread.comm = comm
                try:
                    results[r] = fn(r)
                finally:
                    context.thread.comm = None
                    if shutdown:
                        comm.shutdown()
            except BaseException as exc:  # noqa: BLE001 — reported to the test
                self.errors[r] = exc

        threads = [threading.Thread(target=worker, args=(r,), daemon=True)
                   for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
            if t.is_alive():
                raise TimeoutError(f"a rank did not finish within {timeout} s")
        for err in self.errors:
            if err is not None:
                raise err
        return results

    def close(self) -> None:
        self.server.stop()
