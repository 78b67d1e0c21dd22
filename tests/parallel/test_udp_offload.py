"""UDP GSO and GRO (native/transport/udp/), and each path without them, end to end on
loopback: a real netreduce-switch and three rank processes with NETREDUCE_UDP_OFFLOAD
auto (both), gso (segmented sends, plain receives), gro (plain sends, coalesced
receives) and off, at the payloads MTU 1500 and 9000 give (1432 and 8936 B: many
datagrams per GSO send and GRO receive), every dtype, with 2 % of the packets dropped
by the engine's knob so that resends go through the same paths. Every result is exact;
the engines and the daemon name the path they took (`netreduce info`'s data_path).
Loss on a real wire and the packets a capture sees: tests/root/test_loss_testbed.py,
tests/root/test_gso_wire.py, tests/parallel/test_wire_capture.py."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

import numpy as np
import pytest

from netreduce import _native
from netreduce.worker import dataplane
from netreduce.switch import spawn
from tests.parallel.ranks import run_ranks
from tests.procs import collect_ok

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PATHS = {"auto": "udp gso+gro", "gso": "udp gso, recvmmsg", "gro": "udp sendmmsg, gro",
         "off": "udp sendmmsg/recvmmsg"}
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")


def _values(rank: int, count: int, dtype: str) -> np.ndarray:
    """Small integers, exact in every dtype whatever the order of addition."""
    return np.random.default_rng([rank, count, DTYPES.index(dtype)]).integers(-8, 9, count)


def _contribution(rank: int, count: int, dtype: str) -> np.ndarray:
    vals = _values(rank, count, dtype)
    if dtype == "bfloat16":  # as uint16 bit patterns: float32's top half
        return (vals.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return vals.astype(dtype)


def _reference(size: int, count: int, dtype: str) -> np.ndarray:
    total = np.sum([_values(r, count, dtype) for r in range(size)], axis=0)
    if dtype == "bfloat16":
        return (total.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return total.astype(dtype)


def _ranks(rank, size, address, job):
    with dataplane.connect(address, job, rank, size, timeout=60.0, drop_rate=0.02,
                           retransmit_ms=2.0) as conn:
        wrong = []
        for dtype in DTYPES:
            for count in (1, 1001, 300_007):
                a = _contribution(rank, count, dtype)
                out = conn.allreduce(a, np.empty_like(a),
                                     dtype="bfloat16" if dtype == "bfloat16" else None)
                if not np.array_equal(out, _reference(size, count, dtype)):
                    wrong.append(f"{dtype} x{count}")
        return {"wrong": wrong, "path": conn.data_path, "stats": conn.stats()}


@pytest.mark.parametrize("payload", [1432, 8936])
@pytest.mark.parametrize("offload", ["auto", "gso", "gro", "off"])
def test_exact_on_every_offload_path_with_loss(monkeypatch, offload, payload):
    monkeypatch.setenv("NETREDUCE_UDP_OFFLOAD", offload)  # the daemon's and the ranks'
    with spawn(payload_bytes=payload, slots=32) as sw:
        results = run_ranks(_ranks, 3, sw.address, "offload-" + uuid.uuid4().hex[:6], timeout=300)
        assert f"data path {PATHS[offload]};" in sw.ready, sw.ready  # then the job-secrets words
    for r in results:
        assert r["wrong"] == [], r
        assert r["path"] == PATHS[offload], r
        assert r["stats"]["payload_bytes"] == payload
    # The knob's drops were repaired: every rank resent something.
    assert all(r["stats"]["dropped_by_knob"] > 0 and r["stats"]["retransmits"] > 0 for r in results)


def test_a_loopback_payload_keeps_the_zero_copy_receive(monkeypatch):
    # Loopback's 64 KiB datagrams: two never share a coalesced receive, so the engine
    # does not ask for GRO and keeps receiving straight into place.
    monkeypatch.setenv("NETREDUCE_UDP_OFFLOAD", "auto")
    with spawn(slots=8) as sw:
        results = run_ranks(_ranks, 2, sw.address, "offload-" + uuid.uuid4().hex[:6], timeout=300)
    assert [r["path"] for r in results] == [PATHS["gso"]] * 2
    assert all(r["wrong"] == [] for r in results)


# Fault injection for the one fallback the kernel decides at send time: a device that
# cannot segment (an IPsec route, UDP-Lite) answers a GSO send with EIO. This shim,
# preloaded into the rank processes, fails every sendmmsg whose first message carries
# a UDP_SEGMENT control message with EIO, and passes everything else to libc.
EIO_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
int sendmmsg(int fd, struct mmsghdr* v, unsigned n, int flags) {
  static int (*real)(int, struct mmsghdr*, unsigned, int);
  if (!real) real = (int (*)(int, struct mmsghdr*, unsigned, int))dlsym(RTLD_NEXT, "sendmmsg");
  for (unsigned i = 0; i < n; ++i) {
    struct msghdr* h = &v[i].msg_hdr;
    for (struct cmsghdr* c = CMSG_FIRSTHDR(h); c; c = CMSG_NXTHDR(h, c)) {
      if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_SEGMENT) {
        if (i == 0) { errno = EIO; return -1; }
        return real(fd, v, i, flags);
      }
    }
  }
  return real(fd, v, n, flags);
}
"""

RANK_SCRIPT = r"""
import json, sys
import numpy as np
from netreduce.worker import dataplane
host, port, job, rank = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
with dataplane.connect((host, port), job, rank, 2, timeout=60.0) as conn:
    a = np.full(300_007, rank + 1, dtype=np.float64)
    conn.allreduce(a)
    print(json.dumps({"ok": bool((a == 3).all()), "path": conn.data_path}), flush=True)
"""


def test_a_device_that_cannot_segment_falls_back_to_plain_sends(tmp_path, monkeypatch):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler for the fault-injection shim")
    src, lib = tmp_path / "eio.c", tmp_path / "eio.so"
    src.write_text(EIO_SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src), "-ldl"], check=True)
    monkeypatch.setenv("NETREDUCE_UDP_OFFLOAD", "auto")
    env = dict(os.environ, LD_PRELOAD=str(lib),
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    with spawn(payload_bytes=1432, slots=32) as sw:
        job = "eio-" + uuid.uuid4().hex[:6]
        procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, sw.address[0],
                                   str(sw.address[1]), job, str(r)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(2)]
        results = collect_ok(procs, timeout=120)
    for r in results:
        assert r["ok"], r
        # The fallback is named where `netreduce info` and the logs show the path.
        assert r["path"] == ("udp sendmmsg, gro (no GSO: a GSO send failed (Input/output "
                             "error), plain sends since)"), r


def test_info_names_the_data_path():
    assert _native.udp_data_path("auto") == PATHS["auto"]
    assert _native.udp_data_path("off") == PATHS["off"]
    with pytest.raises(ValueError, match="auto, off, gso or gro"):
        _native.udp_data_path("fast")
