"""A user-space UDP relay between workers and an aggregator that duplicates, reorders
and delays packets (test infrastructure for the loss-recovery tests, not a hot path).

    python -m tests.relay --listen 127.0.0.2 --upstream 127.0.0.1:PORT \\
        [--dup 0.05] [--reorder 0.1] [--delay-ms 0.2] [--reorder-ms 2] [--seed 1]

It listens on the aggregator's port number at another loopback address, TCP and
UDP alike: control connections are forwarded line for line (so the grant's data
port is right for the relay too), datagrams go through the mangler. Each worker
source gets its own upstream socket, so the aggregator sees every rank at its own
address and sends its results back through the relay, mangled the same way. Like a
NAT's application gateway, it rewrites the data address a ``register`` names into
that rank's upstream socket's: the aggregator takes a rank's packets from the address
it registered only.

Every datagram is delayed by a uniform 0..--delay-ms; with probability --reorder it
is held --reorder-ms longer (later ones overtake it); with probability --dup a
second copy follows after another random delay. Prints "relay ready" once it
listens, and a JSON line of counters when it gets SIGTERM."""
from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import selectors
import signal
import socket
import sys
import threading
import time
from typing import Dict, List, Tuple


def _pipe(src: socket.socket, dst: socket.socket, rewrite=None) -> None:
    try:
        pending = b""
        while True:
            data = src.recv(65536)
            if not data:
                break
            if rewrite is None:
                dst.sendall(data)
                continue
            pending += data
            *lines, pending = pending.split(b"\n")
            dst.sendall(b"".join(rewrite(line) + b"\n" for line in lines))
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _tcp_forwarder(listen: Tuple[str, int], upstream: Tuple[str, int], rewrite) -> socket.socket:
    srv = socket.create_server(listen)

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(upstream)
            except OSError:
                conn.close()
                continue
            for a, b, f in ((conn, up, rewrite), (up, conn, None)):
                threading.Thread(target=_pipe, args=(a, b, f), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return srv


class Mangler:
    def __init__(self, args) -> None:
        self.rng = random.Random(args.seed)
        self.dup, self.reorder = args.dup, args.reorder
        self.delay, self.reorder_s = args.delay_ms / 1e3, args.reorder_ms / 1e3
        self.heap: List[Tuple[float, int, socket.socket, bytes, Tuple[str, int]]] = []
        self.tie = itertools.count()
        self.counters = {"forwarded": 0, "duplicated": 0, "reordered": 0, "to_aggregator": 0,
                         "to_workers": 0}

    def push(self, sock: socket.socket, data: bytes, to: Tuple[str, int]) -> None:
        now = time.monotonic()
        due = now + self.rng.uniform(0, self.delay)
        if self.rng.random() < self.reorder:
            due += self.reorder_s * self.rng.uniform(0.5, 1.0)
            self.counters["reordered"] += 1
        heapq.heappush(self.heap, (due, next(self.tie), sock, data, to))
        if self.rng.random() < self.dup:
            self.counters["duplicated"] += 1
            heapq.heappush(self.heap, (due + self.rng.uniform(0, self.reorder_s), next(self.tie),
                                       sock, data, to))

    def flush(self) -> float:
        """Sends what is due; returns seconds until the next one (or 0.05)."""
        now = time.monotonic()
        while self.heap and self.heap[0][0] <= now:
            _, _, sock, data, to = heapq.heappop(self.heap)
            try:
                sock.sendto(data, to)
                self.counters["forwarded"] += 1
            except OSError:
                pass
        return max(0.0, self.heap[0][0] - now) if self.heap else 0.05


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", default="127.0.0.2")
    p.add_argument("--upstream", required=True, help="aggregator HOST:PORT (TCP control, UDP data)")
    p.add_argument("--dup", type=float, default=0.05)
    p.add_argument("--reorder", type=float, default=0.1)
    p.add_argument("--delay-ms", type=float, default=0.2)
    p.add_argument("--reorder-ms", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    upstream = (host, int(port))
    listen = (args.listen, upstream[1])
    lock = threading.Lock()
    backs: Dict[Tuple[str, int], socket.socket] = {}  # worker -> its upstream socket
    watched: set = set()

    def back_for(worker: Tuple[str, int]) -> socket.socket:
        with lock:
            back = backs.get(worker)
            if back is None:
                back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                back.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
                back.bind((upstream[0], 0))
                back.setblocking(False)
                backs[worker] = back
            return back

    def rewrite(line: bytes) -> bytes:
        try:
            msg = json.loads(line)
        except ValueError:
            return line
        if not isinstance(msg, dict) or msg.get("cmd") != "register" or "data_address" not in msg:
            return line
        host, _, port = str(msg["data_address"]).rpartition(":")
        msg["data_address"] = "%s:%d" % back_for((host, int(port))).getsockname()
        return json.dumps(msg).encode()

    tcp = _tcp_forwarder(listen, upstream, rewrite)
    front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    front.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    front.bind(listen)
    front.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(front, selectors.EVENT_READ, None)
    m = Mangler(args)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    print("relay ready", flush=True)
    while not stop:
        with lock:
            for worker, back in backs.items():
                if back not in watched:
                    sel.register(back, selectors.EVENT_READ, worker)
                    watched.add(back)
        for key, _ in sel.select(m.flush()):
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            while True:
                try:
                    data, frm = sock.recvfrom(65536)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break
                if key.data is None:  # a worker's datagram: upstream through its own socket
                    back = back_for(frm)
                    if back not in watched:
                        sel.register(back, selectors.EVENT_READ, frm)
                        watched.add(back)
                    m.counters["to_aggregator"] += 1
                    m.push(back, data, (upstream[0], upstream[1]))
                else:  # the aggregator's answer to worker key.data
                    m.counters["to_workers"] += 1
                    m.push(front, data, key.data)
    tcp.close()
    print(json.dumps(m.counters), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
