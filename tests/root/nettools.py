"""Tiny traffic tools run *inside* testbed namespaces by the root tests (stdlib only,
so no iperf3 is needed):

    python nettools.py tcp-sink HOST PORT            -> JSON {bytes, seconds, rate_bps}
    python nettools.py tcp-source HOST PORT SECONDS
    python nettools.py udp-sink HOST PORT IDLE_S     -> JSON {datagrams, bytes}
    python nettools.py udp-source HOST PORT COUNT SIZE PPS

A sink prints "ready" once it listens. The TCP sink's rate leaves out the first
quarter of the transfer (slow start and the shaper's initial burst)."""
import json
import socket
import sys
import time


def tcp_sink(host, port):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, int(port)))
    srv.listen(1)
    print("ready", flush=True)
    conn, _ = srv.accept()
    marks = []  # (time, cumulative bytes)
    total = 0
    buf = bytearray(1 << 20)
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        total += n
        marks.append((time.monotonic(), total))
    t0, t1 = marks[0][0], marks[-1][0]
    start = t0 + 0.25 * (t1 - t0)
    ms, mb = next((t, b) for t, b in marks if t >= start)
    rate = (total - mb) * 8 / (t1 - ms) if t1 > ms else 0.0
    print(json.dumps({"bytes": total, "seconds": t1 - t0, "rate_bps": rate}), flush=True)


def tcp_source(host, port, seconds):
    deadline = time.monotonic() + 10
    while True:
        try:
            s = socket.create_connection((host, int(port)), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    chunk = b"\0" * (1 << 16)
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        s.sendall(chunk)
    s.close()


def udp_sink(host, port, idle_s):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind((host, int(port)))
    print("ready", flush=True)
    count = total = 0
    s.settimeout(30.0)  # wait long for the first datagram
    while True:
        try:
            data = s.recv(65536)
        except socket.timeout:
            break
        count += 1
        total += len(data)
        s.settimeout(float(idle_s))
    print(json.dumps({"datagrams": count, "bytes": total}), flush=True)


def udp_source(host, port, count, size, pps):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = b"\1" * int(size)
    gap = 1.0 / float(pps)
    t = time.monotonic()
    for _ in range(int(count)):
        s.sendto(payload, (host, int(port)))
        t += gap
        delay = t - time.monotonic()
        if delay > 0:
            time.sleep(delay)


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    {"tcp-sink": tcp_sink, "tcp-source": tcp_source, "udp-sink": udp_sink,
     "udp-source": udp_source}[cmd](*rest)
