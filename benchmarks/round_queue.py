#!/usr/bin/env python3
"""Does an agreement round queue behind the rank's own data? (issue 33, qdelay)
N=4 ranks on the testbed (1 Gbit/s, MTU 9000) drive the data plane directly
(worker.dataplane, no Python agreement around it) and time a round-sized message
(70 int32, the size of an agreement round's vector) four ways, rotated per iteration:

    alone      the small message on an idle link
    big        a BIG_MIB float32 message alone (its time is the reference)
    behind     the big message and the small one submitted back to back on the same
               engine (what the pipeline does: the round queued behind an agreed
               group's data); the small one's cost is behind - big
    beside     the small one on a second engine (a second job on the same aggregator)
               while the big one is on the wire of the first: what a round would wait
               for if it did not queue in the engine but in the shaper, behind the
               rank's standing queue

Rank 0 samples its own uplink's tbf backlog (tc -s qdisc, in its namespace) while
the big message runs, and prints JSON. As root:

    python3 benchmarks/round_queue.py --runs 3 --iters 20 --testbed-name qd1 \\
        --subnet 10.94.1.0/24 --windows 0,32 --out OUT.json

The same backlog sampled from outside, in a namespace of a testbed something else
runs on (e.g. overlap_step.py's rank 0 during a training step), for SECONDS:

    python3 benchmarks/round_queue.py backlog NAMESPACE SECONDS OUT.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
if ROOT not in sys.path:
    sys.path.insert(1, ROOT)

from common import spread, write_record  # noqa: E402

ROUND_ELEMS = 70
MODES = ("alone", "big", "behind", "beside")


def _uplink() -> str:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name != "lo":
            return name
    return ""


class Backlog:
    """The uplink's tbf backlog in bytes, sampled every ~2 ms while on."""

    def __init__(self, dev: str) -> None:
        self.dev, self.on, self.samples = dev, False, []
        self.stop = False
        self.t = threading.Thread(target=self._loop, daemon=True)
        self.t.start()

    def _loop(self) -> None:
        pat = re.compile(r"backlog (\d+)b")
        while not self.stop:
            if not self.on:
                time.sleep(0.002)
                continue
            out = subprocess.run(["tc", "-s", "qdisc", "show", "dev", self.dev],
                                 capture_output=True, text=True).stdout
            m = pat.search(out)
            if m and self.on:
                self.samples.append(int(m.group(1)))
            time.sleep(0.002)


def sample_namespace(ns: str, secs: float, out_path: str) -> None:
    """`tc -s qdisc` backlog of the namespace's uplink every ~3 ms (time, bytes)."""
    links = subprocess.run(["ip", "netns", "exec", ns, "ip", "-o", "link"], capture_output=True,
                           text=True).stdout.splitlines()
    dev = [x.split(":")[1].strip().split("@")[0] for x in links if ": lo:" not in x][0]
    pat = re.compile(r"backlog (\d+)b")
    got = []
    end = time.time() + secs
    while time.time() < end:
        text = subprocess.run(["ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev],
                              capture_output=True, text=True).stdout
        m = pat.search(text)
        if m:
            got.append((round(time.time(), 4), int(m.group(1))))
        time.sleep(0.003)
    v = sorted(b for _, b in got)
    busy = [b for b in v if b > 0]
    summary = {"namespace": ns, "dev": dev, "samples": len(v),
               "nonzero_fraction": len(busy) / max(1, len(v)), "max": v[-1] if v else 0,
               "median_nonzero": busy[len(busy) // 2] if busy else 0}
    print(json.dumps(summary))
    with open(out_path, "w") as f:
        json.dump({"summary": summary, "samples": got}, f)


def rank_main(host: str, port: int, rank: int, size: int, iters: int, big_mib: float) -> None:
    import numpy as np

    from netreduce.worker import dataplane
    a = dataplane.connect((host, port), job="rq-a", rank=rank, size=size, timeout=60)
    b = dataplane.connect((host, port), job="rq-b", rank=rank, size=size, timeout=60)
    big = np.ones(int(big_mib * (1 << 20) / 4), np.float32)
    small = np.ones(ROUND_ELEMS, np.int32)
    small2 = np.ones(ROUND_ELEMS, np.int32)
    sync = np.ones(1, np.float32)
    bl = Backlog(_uplink()) if rank == 0 else None
    modes = ["alone", "big", "behind", "beside"]
    out = {m: [] for m in modes}
    out["backlog"] = []
    for it in range(iters + 2):
        order = modes[it % len(modes):] + modes[:it % len(modes)]
        for mode in order:
            a.allreduce(sync)
            b.allreduce(sync)
            if bl is not None and mode == "big":
                bl.samples, bl.on = [], True
            t0 = time.perf_counter()
            if mode == "alone":
                a.allreduce(small, op="min")
                dt = time.perf_counter() - t0
            elif mode == "big":
                a.allreduce(big)
                dt = time.perf_counter() - t0
            elif mode == "behind":
                rb = a.allreduce_async(big)
                rs = a.allreduce_async(small, op="min")
                rb.wait()
                rs.wait()
                dt = time.perf_counter() - t0
            else:  # beside: the small one on the second engine once the queue has built
                rb = a.allreduce_async(big)
                time.sleep(0.02)
                t1 = time.perf_counter()
                b.allreduce(small2, op="min")
                dt = time.perf_counter() - t1
                rb.wait()
            if bl is not None and mode == "big":
                bl.on = False
                if bl.samples:
                    out["backlog"].append([max(bl.samples), statistics.median(bl.samples), len(bl.samples)])
            if it >= 2:
                out[mode].append(dt * 1e3)
    if rank == 0:
        st = a.stats()
        out["stats"] = {k: v for k, v in st.items() if "rtt" in k or "rto" in k}
        out["all_stats"] = st
        out["window"], out["slots"] = a.window, a.slots
        print("RQ " + json.dumps(out), flush=True)
    if bl is not None:
        bl.stop = True
    a.close()
    b.close()


def run_once(args, tb, window: int) -> dict:
    sw = tb.spawn_switch()
    env = dict(os.environ, NETREDUCE_WINDOW=str(window))
    try:
        host, port = sw.address
        procs = [tb.popen(r, [sys.executable, __file__, "rank", host, str(port), str(r), str(args.np),
                              str(args.iters), str(args.big_mib)],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(args.np)]
        outs = [p.communicate(timeout=args.timeout)[0] for p in procs]
    finally:
        sw.stop()
    line = [x for x in outs[0].splitlines() if x.startswith("RQ ")]
    if not line:
        return {"error": outs[0][-1500:]}
    rec = json.loads(line[-1][3:])
    rec["load"] = os.getloadavg()
    return rec


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "rank":
        a = sys.argv[2:]
        rank_main(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]), float(a[5]))
        return 0
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "backlog":
        sample_namespace(sys.argv[2], float(sys.argv[3]), sys.argv[4])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--big-mib", type=float, default=8.0)
    ap.add_argument("--windows", default="0", help="NETREDUCE_WINDOW values, rotated per run "
                    "(0 = every slot the aggregator grants)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--testbed-name", default="nrrq")
    ap.add_argument("--subnet", default="10.77.35.0/24")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    from netreduce.testbed import Testbed
    windows = [int(w) for w in args.windows.split(",")]
    runs = []
    with Testbed(hosts=args.np, rate=args.rate, name=args.testbed_name, subnet=args.subnet,
                 mtu=args.mtu, replace=True) as tb:
        for k in range(args.runs):
            for w in windows[k % len(windows):] + windows[:k % len(windows)]:
                rec = run_once(args, tb, w)
                rec["window_knob"] = w
                runs.append(rec)
                if "error" in rec:
                    print(f"run {k} window {w}: {rec['error']}", flush=True)
                    continue
                med = {m: statistics.median(rec[m]) for m in MODES}
                bl = rec["backlog"]
                print(f"run {k} window {w} ({rec['window']} of {rec['slots']} slots): alone "
                      f"{med['alone']:.3f} ms, big {med['big']:.2f}, behind {med['behind']:.2f} "
                      f"(+{med['behind'] - med['big']:.3f}), beside {med['beside']:.3f} ms; backlog "
                      f"max {statistics.median(b[0] for b in bl) / 1024:.0f} KiB median "
                      f"{statistics.median(b[1] for b in bl) / 1024:.0f} KiB; {rec['stats']}; "
                      f"load {rec['load'][0]:.1f}", flush=True)
    summary = {}
    for w in windows:
        ok = [r for r in runs if "error" not in r and r["window_knob"] == w]
        sw = summary[f"window_{w}"] = {}
        for m in MODES:
            per = [statistics.median(r[m]) for r in ok]
            if per:
                sw[m + "_ms"] = spread(per)
        adds = [statistics.median(r["behind"]) - statistics.median(r["big"]) for r in ok]
        if adds:
            sw["behind_minus_big_ms"] = spread(adds)
        bls = [statistics.median(b[0] for b in r["backlog"]) for r in ok if r["backlog"]]
        if bls:
            sw["uplink_backlog_max_bytes"] = spread(bls)
    print(json.dumps(summary, indent=1))
    if args.out:
        write_record(args.out, summary, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
