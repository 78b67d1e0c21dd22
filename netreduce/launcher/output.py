"""Where the ranks' output goes: netreduce-run's stdout/stderr, each line prefixed as
horovodrun does ("[2]<stdout>:..."), optionally with a timestamp; and with
``output_dir`` also, unprefixed, to OUTPUT_DIR/rank.<rank>/stdout and stderr
(horovodrun's --output-filename; ranks zero-padded so that they sort).

A local rank's pipes are read here line by line (attach()); a remote host's ranks
arrive in chunks over one ssh connection (host_connection.py), which feeds each
rank's RankStream: whole lines are written, a rank's last unterminated line when its
stream ends."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import IO, List, Optional


class RankStream:
    """One rank's stdout or stderr, as lines out."""

    def __init__(self, output: "Output", rank: int, name: str) -> None:
        self.output = output
        self.out = sys.stdout.buffer if name == "stdout" else sys.stderr.buffer
        self.prefix = f"[{rank}]<{name}>:".encode()
        self.copy: Optional[IO[bytes]] = None
        if output.output_dir:
            folder = os.path.join(output.output_dir, f"rank.{str(rank).zfill(output.width)}")
            os.makedirs(folder, exist_ok=True)
            self.copy = open(os.path.join(folder, name), "wb")
        self.partial = b""

    def line(self, line: bytes) -> None:
        """One whole line (its newline added if missing)."""
        if not line.endswith(b"\n"):
            line += b"\n"
        if self.copy is not None:
            self.copy.write(line)
            self.copy.flush()
        head = b""
        if self.output.prefix:
            head = (time.asctime().encode() if self.output.timestamp else b"") + self.prefix
        with self.output.lock:
            self.out.write(head + line)
            self.out.flush()

    def feed(self, data: bytes) -> None:
        """A chunk of the stream: its whole lines written, the rest kept."""
        data = self.partial + data
        end = data.rfind(b"\n") + 1
        self.partial = data[end:]
        for line in data[:end].splitlines(keepends=True):
            self.line(line)

    def close(self) -> None:
        if self.partial:
            self.line(self.partial)
            self.partial = b""
        if self.copy is not None:
            self.copy.close()
            self.copy = None


class Output:
    """One per job; close() at the end waits (bounded) for the last lines."""

    def __init__(self, prefix: bool = True, output_dir: Optional[str] = None, size: int = 1,
                 timestamp: bool = False) -> None:
        self.prefix = prefix
        self.output_dir = output_dir
        self.width = len(str(max(size - 1, 0)))
        self.timestamp = timestamp
        self.lock = threading.Lock()
        self.threads: List[threading.Thread] = []
        if output_dir:
            os.makedirs(output_dir, exist_ok=True)

    @property
    def captures(self) -> bool:
        """Whether a local rank's output must pass through here (else it inherits
        netreduce-run's stdout and stderr)."""
        return self.prefix or bool(self.output_dir)

    def stream(self, rank: int, name: str) -> RankStream:
        return RankStream(self, rank, name)

    def watch(self, thread: threading.Thread) -> None:
        """A thread that writes output: close() waits for it."""
        self.threads.append(thread)

    def attach(self, rank: int, proc: subprocess.Popen) -> None:
        """Copy a local rank's stdout and stderr pipes (when it has them)."""
        if not self.captures:
            return
        for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            if pipe is None:
                continue
            t = threading.Thread(target=self._pump, args=(pipe, self.stream(rank, name)),
                                 daemon=True)
            t.start()
            self.watch(t)

    @staticmethod
    def _pump(pipe: IO[bytes], stream: RankStream) -> None:
        try:
            for line in iter(pipe.readline, b""):
                stream.line(line)
        finally:
            pipe.close()
            stream.close()

    def close(self, timeout_s: float = 2.0) -> None:
        """Wait (bounded) for the pumps to write what the ranks printed last."""
        deadline = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
