#!/usr/bin/env python3
"""Who resends in a reduce-scatter over two aggregators (issue 33: test_owner_shard's
two-aggregator check saw the aggregators resend results, once 27 % of the payload).

    PYTHONPATH=. python3 benchmarks/owner_resends.py --runs 5 \\
        --json benchmarks/results/issue33/owner_resends.json
    # A/B against another built checkout (its native module built), alternated per run
    PYTHONPATH=. python3 benchmarks/owner_resends.py --runs 5 --pythonpath /tmp/base \\
        --json benchmarks/results/issue33/owner_resends_ab.json

Each run starts two netreduce-switch daemons on loopback (the daemon's defaults: a
multicast group per job, jumbo 64 KiB payloads) and `netreduce-run -np N` ranks that
do what the test does (init, barrier, a reduce-scatter of 400,003 float32 spread over
both aggregators, barrier), `--iters` times. Per reduce-scatter it keeps, summed over
the ranks' engines, which rule resent (timeout_probes: a lane quiet for a timeout;
tail_probes; gap_resends; overtaken_resends; held_probes) and how many proved needless,
and, summed over both aggregators, the results answered to a resend of a completed
slot (retransmitted_results), the unicast copies of group results
(group_unicast_copies) and all bytes out as a fraction of the payload. Counts, not
timings; the load average beside each run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from common import command_line, machine_description, utc_now, write_json  # noqa: E402

PAYLOAD = 400_003 * 4
ENGINE = ("retransmits", "timeout_probes", "tail_probes", "gap_resends", "overtaken_resends",
          "held_probes", "spurious_retransmits", "needless_by_repeat", "ignored_results")
AGG = ("bytes_out", "packets_out", "retransmitted_results", "duplicates", "group_unicast_copies")

RANK = r'''
import json, os, numpy as np, netreduce as nr
from netreduce import api
nr.init()
r, n = nr.rank(), nr.size()
dp = api._communicator().dp
x = (np.arange(400_003, dtype=np.float32) % 89) * (r + 1)
ENGINE, AGG = @KEYS@
def snap():
    jobs = [[j for j in c.counters()["jobs"].values() if not j.get("finished")][0]
            for c in dp.connections]
    return [c.stats() for c in dp.connections], jobs
for it in range(int(os.environ["OWNER_RESENDS_ITERS"])):
    nr.barrier(); (e0, a0) = snap()
    got = nr.api.reducescatter_async(x, op=nr.Sum, name="rs" + str(it)).wait()
    nr.barrier(); (e1, a1) = snap()
    rec = {"rank": r, "it": it,
           "engine": {k: sum(q[k] - p[k] for p, q in zip(e0, e1)) for k in ENGINE},
           "srtt_us": [q["srtt_us"] for q in e1], "rto_us": [q["rto_us"] for q in e1],
           "first_rtt_us": [q["first_rtt_us"] for q in e1]}
    if r == 0:
        rec["aggregators"] = {k: sum(q[k] - p[k] for p, q in zip(a0, a1)) for k in AGG}
    print("OWNER_RESENDS", json.dumps(rec), flush=True)
lo, cnt = api.shard_rows(x.shape[0], n, r)
full = nr.allreduce(x, op=nr.Sum, name="check")
assert np.array_equal(got, full[lo:lo + cnt])
nr.shutdown()
'''.replace("@KEYS@", repr((ENGINE, AGG)))


def one_run(code: str, ranks: int, iters: int) -> list:
    """A run on the checkout `code`: both daemons and the ranks from it."""
    env = dict(os.environ, PYTHONPATH=code, OWNER_RESENDS_ITERS=str(iters), OMP_NUM_THREADS="1")
    starter = (
        "import json, subprocess, sys\n"
        "from netreduce.switch import spawn\n"
        "sw = [spawn(host='127.0.0.1', port=0) for _ in range(2)]\n"
        "try:\n"
        "    env = dict(__import__('os').environ, NETREDUCE_ALGORITHM='flat', NETREDUCE_TIMEOUT='20',\n"
        "               NETREDUCE_SWITCH=','.join('127.0.0.1:%d' % s.address[1] for s in sw))\n"
        f"    p = subprocess.run([sys.executable, '-m', 'netreduce.launcher', '-np', '{ranks}', '--',\n"
        "                        sys.executable, '-c', sys.stdin.read()], env=env, text=True,\n"
        "                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)\n"
        "finally:\n"
        "    for s in sw: s.stop()\n"
        "sys.stdout.write(p.stdout); sys.exit(p.returncode)\n")
    p = subprocess.run([sys.executable, "-c", starter], input=RANK, env=env, cwd=code, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=360)
    if p.returncode != 0:
        raise SystemExit(f"run on {code} failed:\n{p.stdout[-3000:]}")
    recs = [json.loads(ln.split("OWNER_RESENDS", 1)[1]) for ln in p.stdout.splitlines()
            if "OWNER_RESENDS" in ln]
    out = []
    for it in range(iters):
        mine = [r for r in recs if r["it"] == it]
        agg = next(r["aggregators"] for r in mine if r["rank"] == 0)
        out.append({
            "iteration": it,
            "engine": {k: sum(r["engine"][k] for r in mine) for k in ENGINE},
            "aggregators": agg,
            "bytes_out_over_payload": round(agg["bytes_out"] / PAYLOAD, 4),
            "srtt_us": [r["srtt_us"] for r in sorted(mine, key=lambda r: r["rank"])],
            "rto_us": [r["rto_us"] for r in sorted(mine, key=lambda r: r["rank"])],
        })
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3, help="reduce-scatters per run")
    ap.add_argument("--pythonpath", action="append", default=[],
                    help="another built checkout to alternate with this one (repeatable)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    codes = [REPO] + [os.path.abspath(p) for p in args.pythonpath]
    records = []
    for run in range(args.runs):
        order = codes[run % len(codes):] + codes[:run % len(codes)]
        for code in order:
            load = os.getloadavg()
            for rec in one_run(code, args.ranks, args.iters):
                rec.update(run=run, code=code, load=[round(v, 2) for v in load])
                records.append(rec)
                e, a = rec["engine"], rec["aggregators"]
                print(f"run {run} {os.path.basename(code)} it {rec['iteration']} load "
                      f"{load[0]:.1f}: resends {e['retransmits']} (timeout {e['timeout_probes']}, "
                      f"tail {e['tail_probes']}, gap {e['gap_resends']}, overtaken "
                      f"{e['overtaken_resends']}, needless {e['spurious_retransmits']}), "
                      f"retransmitted results {a['retransmitted_results']}, unicast copies "
                      f"{a['group_unicast_copies']}, bytes out {rec['bytes_out_over_payload']}x",
                      flush=True)
    if args.json:
        meta = {"command": command_line(), "date": utc_now(), "machine": machine_description(),
                "ranks": args.ranks, "iters": args.iters, "codes": codes}
        write_json(args.json, meta, records)


if __name__ == "__main__":
    main()
