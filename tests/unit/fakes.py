"""Stand-ins for the lead's control server and native data plane, so the communicator
runs end to end in one process (ranks as threads) without netreduce._native.

FakeControlServer speaks the same protocol (netreduce/protocol/messages.py: the
version exchange, typed requests and replies) and calls the same handler signature
(srv, sess, msg) and disconnect hook (srv, sess) as netreduce/switch/server.py.
FakeFabric pairs the k-th all-reduce of every rank of a job and checks they have
the same length, op and dtype — exactly the invariant negotiation must guarantee.
"""
from __future__ import annotations

import socket
import socketserver
import threading
from typing import Any, Dict, List, Optional

import numpy as np

from netreduce.protocol import codec, messages
from netreduce.switch import coordinator as coord
from netreduce.switch.dispatch import greet
from netreduce.switch.waits import resolve
from netreduce.errors import DataPlaneError


class _Session:
    def __init__(self) -> None:
        self.state: Dict[str, Any] = {}
        self.job = None
        self.rank = None
        self.version = None
        self.peer = "127.0.0.1:0"


class FakeControlServer:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: Dict[str, Any] = {}
        self.requests = 0
        fake = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                sess = _Session()
                out = threading.Lock()

                def write(line: bytes) -> None:
                    try:
                        with out:
                            self.wfile.write(line)
                            self.wfile.flush()
                    except (ConnectionError, OSError, ValueError):
                        pass

                def answer(msg: Any) -> None:
                    fn = coord.HANDLERS.get(type(msg))
                    try:
                        if fn is None:
                            raise coord.RequestError(f"'{messages.command(msg)}' is not served")
                        line = codec.encode_reply(resolve(fn(fake, sess, msg)), msg.id)
                    except coord.RequestError as exc:
                        line = codec.encode_error(str(exc), msg.id)
                    write(line)

                try:
                    for line in self.rfile:
                        try:
                            msg = codec.decode_request(line)
                        except codec.ProtocolError as exc:
                            write(codec.encode_error(str(exc), exc.rid))
                            continue
                        if isinstance(msg, messages.Hello) or sess.version is None:
                            reply, agreed = greet(sess, msg)
                            write(reply)
                            if not agreed:
                                return
                            continue
                        fake.requests += 1
                        if msg.id is not None:  # answered whenever it can be, like the real server
                            threading.Thread(target=answer, args=(msg,), daemon=True).start()
                        else:
                            answer(msg)
                except (ConnectionError, OSError):
                    pass
                finally:
                    coord.on_disconnect(fake, sess)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            # socketserver's default backlog of 5 drops SYNs when N ranks x 3
            # connections arrive at once; each drop costs a 1 s SYN retransmit.
            request_queue_size = 128

        self.server = Server(("127.0.0.1", 0), Handler)
        self.address = self.server.server_address
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.02},
                                       daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeFabric:
    """The k-th call of each rank of a job meets the k-th call of the others."""

    def __init__(self, timeout: float = 10.0) -> None:
        self.cond = threading.Condition()
        self.timeout = timeout
        self.rounds: Dict[tuple, Dict[int, tuple]] = {}
        self.results: Dict[tuple, Any] = {}
        self.calls: List[tuple] = []  # (job, rank, count, op, dtype) in call order

    def connect(self, address, job: str, rank: int, size: int, **_: Any) -> "FakeConn":
        return FakeConn(self, job, rank, size)


class FakeConn:
    def __init__(self, fabric: FakeFabric, job: str, rank: int, size: int) -> None:
        self.fabric, self.job, self.rank, self.size = fabric, job, rank, size
        self.count = 0
        self.aborted: Optional[str] = None
        self.closed = False

    def allreduce(self, src: np.ndarray, dst: Optional[np.ndarray] = None, op: str = "sum",
                  dtype: Optional[str] = None, scale: float = 1.0) -> np.ndarray:
        """netreduce/algorithms/base.py's Algorithm.allreduce; ``scale`` multiplies the
        result as Connection's engine does (numpy's multiply in the element type)."""
        f = self.fabric
        dst = src if dst is None else dst
        key = (self.job, self.count)
        self.count += 1
        data = src
        if dtype == "bfloat16":  # widen bit patterns to float32 for the arithmetic
            data = (src.astype(np.uint32) << 16).view(np.float32)
        with f.cond:
            f.calls.append((self.job, self.rank, src.size, op, dtype or src.dtype.name))
            if self.aborted:
                raise DataPlaneError(self.aborted)
            f.rounds.setdefault(key, {})[self.rank] = (data.copy(), op, dtype or src.dtype.name)
            got = f.rounds[key]
            if len(got) == self.size:
                sigs = {(v[0].size, v[1], v[2]) for v in got.values()}
                if len(sigs) != 1:
                    f.results[key] = DataPlaneError(f"ranks disagree on message {key}: {sigs}")
                else:
                    fn = {"sum": np.add, "min": np.minimum, "max": np.maximum}[op]
                    acc = got[0][0].copy()
                    for r in range(1, self.size):
                        acc = fn(acc, got[r][0])
                    f.results[key] = acc
                f.cond.notify_all()
            ok = f.cond.wait_for(lambda: key in f.results or self.aborted, f.timeout)
            if self.aborted:
                raise DataPlaneError(self.aborted)
            if not ok:
                raise DataPlaneError(f"timed out waiting for message {key}")
            result = f.results[key]
        if isinstance(result, Exception):
            raise result
        if dtype == "bfloat16":
            b = result.astype(np.float32).view(np.uint32)
            result = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
        np.copyto(dst, result.reshape(dst.shape), casting="unsafe")
        if scale != 1.0:
            np.multiply(dst, scale, out=dst)
        return dst

    def abort(self, reason: str) -> None:
        with self.fabric.cond:
            self.aborted = reason
            self.fabric.cond.notify_all()

    def close(self) -> None:
        self.closed = True

    def stats(self) -> dict:
        return {"messages": self.count}


class FakeSwitchProcess:
    """What netreduce.switch.spawn returns, backed by a FakeControlServer."""

    def __init__(self) -> None:
        self.server = FakeControlServer()
        self.address = self.server.address
        self.stopped = False

    def stop(self) -> None:
        self.server.stop()
        self.stopped = True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
