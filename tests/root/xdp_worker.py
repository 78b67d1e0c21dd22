"""The two ends of the AF_XDP transport test (tests/root/test_xdp_transport.py), each
run inside a testbed namespace; each prints one JSON line last.

    python xdp_worker.py echo HOST PORT COUNT [--threads T] [--device DEV]
        Opens T data ports on the AF_XDP transport (netreduce._native.XdpPorts, as the
        aggregator does), answers COUNT datagrams (over all ports) each with its bytes
        reversed, from the address it was sent to; prints what carried them.
    python xdp_worker.py probe HOST PORT SIZES [--ports T] [--sources S]
        From S plain kernel UDP sockets, sends one datagram of every size in SIZES
        (comma-separated) to each of ports PORT..PORT+T-1 of HOST and checks every
        answer: every datagram back, every byte reversed (the kernel drops one with a
        bad UDP checksum, so an answer proves its checksum).
    python xdp_worker.py open HOST PORT
        Only opens the transport and prints what happened (refusals: their message).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def payload(size: int, port_index: int, source: int) -> bytes:
    head = bytes([port_index, source]) + size.to_bytes(4, "big")
    body = bytes((i * 7 + size) & 0xFF for i in range(max(0, size - len(head))))
    return (head + body)[:size]


def udp_errors() -> dict:
    """The UDP counters of /proc/net/snmp (InCsumErrors: datagrams dropped for a bad
    checksum), of this network namespace."""
    with open("/proc/net/snmp") as f:
        rows = [ln.split() for ln in f if ln.startswith("Udp:")]
    return dict(zip(rows[0][1:], map(int, rows[1][1:])))


def echo(args) -> None:
    from netreduce import _native
    ports = _native.XdpPorts(args.host, args.port, device=args.device, threads=args.threads)
    print("ready", flush=True)
    answered = 0
    deadline = time.monotonic() + args.timeout
    while answered < args.count and time.monotonic() < deadline:
        for i in range(args.threads):
            for data, (src, sport), local in ports.recv(i, 20.0, 64):
                ports.send(i, src, sport, data[::-1], local)
                answered += 1
    out = {"answered": answered, "describe": ports.describe(), "info": ports.info(),
           "stats": [ports.stats(i) for i in range(args.threads)],
           "program": ports.program_counters()}
    ports.close()
    print(json.dumps(out), flush=True)


def probe(args) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    socks = []
    for _ in range(args.sources):
        s = socket.socket(family, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.settimeout(0.2)
        socks.append(s)
    before = udp_errors()
    want = {}
    for si, s in enumerate(socks):
        for p in range(args.ports):
            for size in sizes:
                data = payload(size, p, si)
                want[(si, data[::-1])] = (p, size)
                s.sendto(data, (args.host, args.port + p))
    got, wrong = set(), []
    deadline = time.monotonic() + args.timeout
    while len(got) < len(want) and time.monotonic() < deadline:
        for si, s in enumerate(socks):
            try:
                data, addr = s.recvfrom(65536)
            except socket.timeout:
                continue
            key = (si, data)
            if key in want:
                got.add(key)
            else:
                wrong.append([si, len(data), addr[1]])
    missing = sorted(want[k] for k in want if k not in got)
    after = udp_errors()
    print(json.dumps({"sent": len(want), "answered": len(got), "missing": missing[:20],
                      "wrong": wrong[:20],
                      "csum_errors": after.get("InCsumErrors", 0) - before.get("InCsumErrors", 0)}),
          flush=True)


def open_only(args) -> None:
    from netreduce import _native
    try:
        ports = _native.XdpPorts(args.host, args.port, device=args.device)
    except Exception as exc:  # the refusal is the result
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
        return
    print(json.dumps({"describe": ports.describe(), "info": ports.info()}), flush=True)
    ports.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("echo", "probe", "open"))
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("arg", nargs="?", default="")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ports", type=int, default=1)
    p.add_argument("--sources", type=int, default=1)
    p.add_argument("--device", default="")
    p.add_argument("--timeout", type=float, default=20.0)
    args = p.parse_args()
    if args.mode == "echo":
        args.count = int(args.arg)
        echo(args)
    elif args.mode == "probe":
        args.sizes = args.arg
        probe(args)
    else:
        open_only(args)


if __name__ == "__main__":
    main()
