#!/usr/bin/env python3
"""Instructions (Ir) per MiB of one rank's engine, counted by valgrind's callgrind, so
that a change to the native data path can be compared on a loaded machine without perf
counters (issue 33; engineinsn). User space only: callgrind does not see the kernel's
work (sendmsg's copy, the receive, the softirq), which is most of a rank's CPU.

A netreduce-switch on loopback (--payload-bytes P: 1432 = MTU 1500, 8936 = MTU 9000),
N=2 ranks; rank 1 runs natively, rank 0 under callgrind, counting only inside
Engine::Run (one message's work on the engine thread: stamp, ICRC, send, receive,
copy into place, timers). Each rank all-reduces one warm-up message, then M messages
of S bytes of float32 (rank r gives r + 1 + i, each result checked); rank 0's counts
are zeroed after the warm-up (callgrind_control -z: the first message of a job costs
2-8x a later one, and how much varies run to run under valgrind's timing). Ir per MiB
is the hi run's count over hi x S; with --lo > 0 also the difference of two runs
(M = lo and M = hi messages) over (hi - lo) x S.

    python3 benchmarks/engine_callgrind.py --payload 1432 --mib 16 [--native-dir DIR]
        [--lo 0 --hi 3] [--repeats 2] [--json OUT] [--keep DIR]

--native-dir: the tree whose netreduce (and _native) rank 0 and rank 1 import (the
switch too); default this checkout.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RANK = r"""
import os, subprocess, sys, time, numpy as np
sys.path.insert(0, {tree!r})
from netreduce.worker import dataplane
rank, size, host, port, job, count, msgs = (int(sys.argv[1]), 2, sys.argv[2], int(sys.argv[3]),
                                            sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
with dataplane.connect((host, port), job, rank, size, timeout=600.0) as conn:
    for i in range(msgs + 1):
        a = np.full(count, rank + 1 + i, np.float32)
        conn.allreduce(a)
        want = np.float32(3 + 2 * i)
        assert (a == want).all(), f"message {{i}}: wrong result"
        if i == 0 and rank == 0:  # the warm-up's counts are left out: zeroed, then spin
            subprocess.run(["callgrind_control", "-z", str(os.getpid())], capture_output=True)
            t = time.time()  # (callgrind takes commands while the process runs)
            while time.time() - t < 2.0:
                pass
    print("STATS", conn.stats())
"""


def one_run(tree: str, payload: int, count: int, msgs: int, out: str) -> int:
    env = dict(os.environ, PYTHONPATH=tree)
    sys.path.insert(0, tree)
    from netreduce.switch import spawn  # noqa: E402

    job = f"cg{os.getpid()}{msgs}{int(time.time() * 1000) % 100000}"
    script = RANK.format(tree=tree)
    with spawn(payload_bytes=payload) as sw:
        host, port = sw.address
        args = [host, str(port), job, str(count), str(msgs)]
        r1 = subprocess.Popen([sys.executable, "-c", script, "1", *args], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
               "--toggle-collect=netreduce::Engine::Run(*", f"--callgrind-out-file={out}",
               sys.executable, "-c", script, "0", *args]
        r0 = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        o1, _ = r1.communicate(timeout=600)
        if r0.returncode != 0 or r1.returncode != 0:
            raise SystemExit(f"rank failed:\n{r0.stderr[-3000:]}\n{o1[-3000:]}")
    return total_ir(out)


def total_ir(out: str) -> int:
    text = subprocess.run(["callgrind_annotate", out], capture_output=True, text=True,
                          check=True).stdout
    m = re.search(r"^([\d,]+)(?: \([^)]*\))?\s+\(?PROGRAM TOTALS", text, re.M)
    if m is None:
        raise SystemExit("no PROGRAM TOTALS in callgrind_annotate's output")
    return int(m.group(1).replace(",", ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--payload", type=int, default=1432)
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--lo", type=int, default=0)
    ap.add_argument("--hi", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--native-dir", default=ROOT)
    ap.add_argument("--keep", default=None, help="folder for the callgrind.out files")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    keep = args.keep or tempfile.mkdtemp(prefix="engine_cg_")
    os.makedirs(keep, exist_ok=True)
    count = args.mib * 2**20 // 4
    rows = []
    for rep in range(args.repeats):
        irs = {}
        for m in ((args.lo, args.hi) if args.lo > 0 else (args.hi,)):
            out = os.path.join(keep, f"callgrind.p{args.payload}.m{m}.r{rep}.out")
            irs[m] = one_run(os.path.abspath(args.native_dir), args.payload, count, m, out)
        per_mib = irs[args.hi] / (args.hi * args.mib)
        diff = ((irs[args.hi] - irs[args.lo]) / ((args.hi - args.lo) * args.mib)
                if args.lo > 0 else None)
        rows.append({"repeat": rep, "ir": irs, "ir_per_mib": per_mib, "ir_per_mib_diff": diff,
                     "load": os.getloadavg()[0]})
        print(f"payload {args.payload}: Ir {irs} -> {per_mib:,.0f} Ir per MiB"
              + (f" (difference: {diff:,.0f})" if diff is not None else "")
              + f" (load {os.getloadavg()[0]:.1f})", flush=True)
    med = statistics.median(r["ir_per_mib"] for r in rows)
    print(f"median {med:,.0f} Ir per MiB; callgrind files in {keep}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": sys.argv, "native_dir": args.native_dir, "payload": args.payload,
                       "mib": args.mib, "lo": args.lo, "hi": args.hi, "runs": rows,
                       "median_ir_per_mib": med}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
