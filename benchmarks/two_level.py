"""Two levels (rack + spine) against one aggregator on the emulated testbed.

    sudo PYTHONPATH=. python3 benchmarks/two_level.py --rate 200mbit --size 4M --iters 5

The testbed layout of netreduce/testbed/two_level.py, 2 racks x 2 hosts: ranks 0..3
in h0..h3 (rack 0 = ranks 0, 1; rack 1 = ranks 2, 3), the rack aggregators in h4 and
h5 (netreduce-switch --spine h6; their links shaped to 3x --rate, a top-of-rack
switch's ports), the spine in h6; workers' and the spine's links shaped to --rate
each way. All share one emulated bridge, so the racks are logical (what goes where
follows the tree). In the same run, mode
``single`` puts one netreduce-switch in h6 and every rank uses it (NETREDUCE_SWITCH
only), mode ``tree`` sends every rank's data through its rack aggregator
(NETREDUCE_RACK_SWITCH) with h6 as the spine. The aggregator/spine link carries
4 S each way with one aggregator and 2 S (one partial sum per rack) with the tree,
so the tree should take about half the time when that link binds.

Ranks go through the public API (netreduce.init, allreduce); a checked phase first
(dtypes, sizes 0, 1, a packet +- 1, exact integers), then --iters timed all-reduces
of --size bytes of float32; time = slowest rank's median. Wire bytes are the veth
counters of every node over the whole run (control traffic included).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Deque, Dict, List, Sequence, Union

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.common import parse_size, stop  # noqa: E402
from netreduce.testbed import Testbed  # noqa: E402
from netreduce.testbed.two_level import two_level_plan  # noqa: E402

RANKS, RACKS, SPINE = 4, (4, 5), 6
RANK = r'''
import json, statistics, sys, time
import numpy as np
import os
import netreduce as nr
from netreduce.protocol.client import ControlClient
from netreduce.protocol.address import parse_address
n, iters = int(sys.argv[1]), int(sys.argv[2])
r = int(os.environ["NETREDUCE_RANK"])
def job_counters(var):
    with ControlClient(parse_address(os.environ[var])) as c:
        return c.call("counters")["jobs"].get(os.environ["NETREDUCE_JOB"], {})
checked = 0
times = []
try:
    nr.init()  # its host exchange is the job's first all-reduce
    size = nr.size()
    for seed, (dtype, count) in enumerate([("float32", 0), ("float32", 1), ("float32", 2237),
                                          ("float32", 2239), ("float64", 100003), ("int32", 70001),
                                          ("int64", 5), ("float16", 30011)]):
        mine = (np.random.default_rng([seed, r]).integers(-8, 8, count)).astype(dtype)
        want = sum(np.random.default_rng([seed, q]).integers(-8, 8, count) for q in range(size))
        got = nr.allreduce(mine, op=nr.Sum, name=f"c{seed}")
        assert np.array_equal(np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)), (dtype, count)
        checked += 1
    x = np.full(n, float(r + 1), np.float32)
    for i in range(iters):
        t = time.perf_counter()
        got = nr.allreduce(x, op=nr.Sum, name=f"t{i}")
        times.append(time.perf_counter() - t)
        assert np.all(got == size * (size + 1) / 2), "wrong sum"
except Exception:
    # The job's counters at its aggregators while this rank still holds the job open
    # (they free it once every rank has left): where a stuck round waits.
    dump = {"rank": r, "checked": checked, "timed": len(times)}
    for var in ("NETREDUCE_RACK_SWITCH", "NETREDUCE_SWITCH"):
        if os.environ.get(var):
            try:
                dump[var] = job_counters(var)
            except Exception as exc:
                dump[var] = repr(exc)
    try:
        dump["stats"] = {k: v for k, v in nr.api._comm().dp.stats().items() if isinstance(v, (int, float))}
    except Exception as exc:
        dump["stats"] = repr(exc)
    print("counters at failure: " + json.dumps(dump), file=sys.stderr, flush=True)
    raise
st = nr.api._comm().dp.stats()
rack = {}
if os.environ.get("NETREDUCE_RACK_SWITCH") and r % 2 == 0:  # what this rank's rack aggregator counted
    rack = job_counters("NETREDUCE_RACK_SWITCH")
print(json.dumps({"rank": r, "median_s": statistics.median(times), "checked": checked,
                  "algorithm": nr.api._comm().dp.name,
                  "stats": {k: v for k, v in st.items() if isinstance(v, (int, float))},
                  "rack": {k: v for k, v in rack.items() if isinstance(v, int) and v}}), flush=True)
nr.shutdown()
'''


def _daemon(tb: Testbed, host: int, args: List[str],
            logs: Dict[str, Deque[str]]) -> subprocess.Popen:
    """netreduce-switch in ``host``; its output's last lines are kept in logs[hN] (read
    on: a pipe nobody reads would also stall a daemon that logs much)."""
    node = tb.hosts[host]
    proc = tb.popen(node, [sys.executable, "-m", "netreduce.switch", "--host", node.address,
                           "--port", "4791", "--allow-open-jobs", *args],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    line = ""
    while time.monotonic() < deadline and "listening on" not in line:
        line = proc.stdout.readline()
        if not line:
            break
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"netreduce-switch in {node.netns} did not start: {line!r}")
    tail: Deque[str] = collections.deque([line], maxlen=200)
    logs[f"h{host}"] = tail
    threading.Thread(target=lambda: tail.extend(proc.stdout), daemon=True).start()
    return proc


def _failure(mode: str, procs: List[subprocess.Popen], errs: Dict[int, str],
             logs: Dict[str, Deque[str]]) -> str:
    """What a failed run leaves to read: every failed rank's exit and error tail (with the
    counters it took at its aggregators), then every daemon's last lines."""
    parts = [f"{mode}: rank(s) {', '.join(str(r) for r in sorted(errs))} failed"]
    for r in sorted(errs):
        lines = errs[r].splitlines()
        dumps = [ln for ln in lines if ln.startswith("counters at failure: ")]
        rest = "\n".join(ln for ln in lines if not ln.startswith("counters at failure: "))
        parts.append(f"--- rank {r} (exit {procs[r].returncode}):\n{rest[-3000:]}")
        parts.extend(dumps)
    for name, tail in logs.items():
        parts.append(f"--- netreduce-switch in {name}, last lines:\n{''.join(list(tail)[-40:])}")
    return "\n".join(parts)


def run_mode(tb: Testbed, mode: str, size: int, iters: int, timeout: float = 300,
             per_host: int = 1, rack_args: Sequence[str] = (),
             rank_timeout_s: Union[float, Sequence[float]] = 60) -> Dict:
    """One job in ``mode`` ('single' or 'tree'): per-rank results and per-node wire
    bytes. ``per_host`` > 1 runs that many ranks in each worker host (the launcher's
    local ranks): the hierarchical all-reduce, its shards through the tree. A rank
    that fails raises RuntimeError with every failed rank's error, the job's counters
    at its aggregators as that rank left, and the daemons' last output lines.
    ``rank_timeout_s``: each rank's NETREDUCE_TIMEOUT, or one per rank (a rank that
    waits longer holds the job open while the others read its counters: an
    aggregator frees a job once every rank has left)."""
    spine = tb.hosts[SPINE].address
    daemons = []
    logs: Dict[str, Deque[str]] = {}
    try:
        daemons.append(_daemon(tb, SPINE, [], logs))
        if mode == "tree":
            for h in RACKS:
                daemons.append(_daemon(tb, h, ["--spine", spine, *rack_args], logs))
        before = tb.counters()
        job = f"tb2-{mode}-" + uuid.uuid4().hex[:6]
        procs = []
        timeouts = ([float(rank_timeout_s)] * (RANKS * per_host)
                    if isinstance(rank_timeout_s, (int, float)) else list(rank_timeout_s))
        for r in range(RANKS * per_host):
            host = r // per_host
            env = dict(os.environ, NETREDUCE_SWITCH=f"{spine}:4791", NETREDUCE_JOB=job,
                       NETREDUCE_RANK=str(r), NETREDUCE_SIZE=str(RANKS * per_host),
                       NETREDUCE_LOCAL_RANK=str(r % per_host), NETREDUCE_LOCAL_SIZE=str(per_host),
                       NETREDUCE_TIMEOUT=str(timeouts[r]),
                       PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
            if mode == "tree":
                env["NETREDUCE_RACK_SWITCH"] = f"{tb.hosts[RACKS[host * 2 // RANKS]].address}:4791"
            procs.append(tb.popen(host, [sys.executable, "-c", RANK, str(size // 4), str(iters)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True))
        ranks = []
        errs: Dict[int, str] = {}
        deadline = time.monotonic() + timeout
        for r, p in enumerate(procs):  # every rank's error, not only the first one's
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                err += f"\n(killed: still running after {timeout:.0f} s)"
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            if p.returncode != 0 or not lines:
                errs[r] = err
            else:
                ranks.append(json.loads(lines[-1]))
        if errs:
            raise RuntimeError(_failure(mode, procs, errs, logs))
        after = tb.counters()
    finally:
        stop(daemons)
    wire = {name: {k: after[name][k] - before[name][k] for k in after[name]} for name in after}
    return {"mode": mode, "ranks": ranks, "wire": wire,
            "time_s": max(r["median_s"] for r in ranks)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="200mbit")
    ap.add_argument("--size", default="4M")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--name", default="nrtwo")
    ap.add_argument("--loss", type=float, default=0.0,
                    help="UDP loss on every namespace's input (nftables), e.g. 0.01")
    ap.add_argument("--json", default=None, help="write the raw records here")
    args = ap.parse_args()
    size = parse_size(args.size)
    layout = two_level_plan(2, 2, args.rate, name=args.name, subnet="10.78.250.0/24")
    with Testbed(plan=layout.plan, replace=True) as tb:
        if args.loss:
            tb.set_loss(args.loss, proto="udp")
        runs = [run_mode(tb, m, size, args.iters) for m in ("single", "tree", "single", "tree")]
    by = {m: [r for r in runs if r["mode"] == m] for m in ("single", "tree")}
    print(f"{'mode':8} {'time s':>8} {'GB/s/rank':>10} {'agg/spine rx MB':>16} "
          f"{'rack rx MB':>11} {'worker tx MB':>13}")
    for m, rs in by.items():
        for r in rs:
            w = r["wire"]
            racks = "/".join(f"{w[f'h{h}']['rx_bytes'] / 1e6:.1f}" for h in RACKS) if m == "tree" else "-"
            worker_tx = sum(w[f"h{i}"]["tx_bytes"] for i in range(RANKS)) / RANKS / 1e6
            print(f"{m:8} {r['time_s']:8.3f} {size / r['time_s'] / 1e9:10.3f} "
                  f"{w[f'h{SPINE}']['rx_bytes'] / 1e6:16.1f} {racks:>11} {worker_tx:13.1f}")
    best = {m: min(r["time_s"] for r in rs) for m, rs in by.items()}
    print(f"tree vs single aggregator: {best['single'] / best['tree']:.2f}x faster "
          f"(best of {len(by['tree'])} alternating runs each)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
