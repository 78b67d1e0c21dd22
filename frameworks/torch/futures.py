"""Turn netreduce handles into torch futures.

torch.distributed's ``Work`` and DDP's communication hooks want a
``torch.futures.Future`` that completes on its own; netreduce hands out handles that
complete when someone synchronizes them. One daemon thread per process does that
synchronizing, in submission order (every rank submits in the same order, so waiting
in order costs at most the gap between neighbouring completions), and sets the futures.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, List, Optional

import torch

from .mpi_ops import synchronize


class _Completer:
    def __init__(self) -> None:
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def _run(self) -> None:
        while True:
            handles, future, finish = self._queue.get()
            try:
                results = [synchronize(h) for h in handles]
                future.set_result(finish(results))
            except BaseException as exc:  # the waiter re-raises it
                future.set_exception(exc)

    def submit(self, handles: List[int], finish: Callable[[List[Any]], Any],
               devices: Optional[List[torch.device]] = None) -> torch.futures.Future:
        """A future that gets ``finish([synchronize(h) for h in handles])``."""
        future = torch.futures.Future(devices=devices) if devices else torch.futures.Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="netreduce-torch-futures",
                                                daemon=True)
                self._thread.start()
        self._queue.put((handles, future, finish))
        return future


completer = _Completer()


def cuda_devices(tensors: List[torch.Tensor]) -> Optional[List[torch.device]]:
    """A future holding CUDA tensors must be told their devices."""
    devices = sorted({t.device for t in tensors if t.is_cuda}, key=str)
    return devices or None
