#!/usr/bin/env python3
"""The engine's rate while the ranks compute (issue 33, wirerate): N=4 ranks on the testbed
(1 Gbit/s, MTU 9000) all-reduce a 9.44 MB message (resnet18's largest) three times per
mode, with each rank's spinning process idle ("idle") or busy ("busy": 4 spinning
processes on the host's cores, as 4 ranks' backward), modes rotated per iteration and
trees (--code NAME=DIR, the aggregator from the same tree) alternated per run. Per
mode and rank: seconds per message, the engine's stats, every thread's CPU, run delay
and switches (netreduce/testbed/proc_stat.py: schedstat and status), the aggregator's threads' too (rank 0);
"busynN" also renices the aggregator's threads to -N for that mode. As root:

    python3 benchmarks/busy_rate.py --code main=DIR --code new=. --iters 4 --runs 6 \
        --name wr1 --subnet 10.98.1.0/24 --out OUT.json    # PROBE_MODES=idle,busy
"""
import json
import multiprocessing as mp
import os
import sys
import time

import numpy as np


def spinner(ev, stop):
    while not stop.is_set():
        if ev.is_set():
            x = 0
            t = time.perf_counter() + 0.05
            while time.perf_counter() < t:
                x += 1
        else:
            ev.wait(0.05)


def sched(pid):
    from common import proc_stat  # this checkout's (benchmarks/ is sys.path[0])
    out = {}
    for t in proc_stat.threads(pid):
        try:
            cpu, delay, n = proc_stat.schedstat(pid, t.pid)
            vol, inv = proc_stat.ctx_switches(pid, t.pid)
        except (OSError, IndexError, ValueError, KeyError):
            continue  # ended meanwhile
        out[f"{t.pid}:{t.comm}"] = [cpu, delay, n, vol, inv]
    return out


def sdiff(a, b):
    return {k: [y - x for x, y in zip(a[k], b[k])] for k in b if k in a}


def snmp():
    t = open("/proc/net/snmp").read().splitlines()
    u = [line for line in t if line.startswith("Udp:")]
    d = dict(zip(u[0].split()[1:], map(int, u[1].split()[1:])))
    return {k: d[k] for k in ("InDatagrams", "RcvbufErrors", "SndbufErrors", "InErrors")}


def rank_main(host, port, rank, size, iters, code, nelem, swpid):
    sys.path.insert(0, code)
    from netreduce.worker import dataplane
    ev, stop = mp.Event(), mp.Event()
    sp = mp.Process(target=spinner, args=(ev, stop), daemon=True)
    sp.start()
    conn = dataplane.connect((host, int(port)), job="probe", rank=rank, size=size, timeout=60)
    a = np.ones(nelem, np.float32)
    sync = np.ones(1, np.float32)
    modes = os.environ.get("PROBE_MODES", "idle,busy").split(",")
    out = {m: [] for m in modes}
    out.update({"st_" + m: [] for m in modes})
    for it in range(iters):
        for mode in modes[it % len(modes):] + modes[:it % len(modes)]:
            conn.allreduce(sync)
            if rank == 0:
                nv = int(mode.split("n")[1]) if "n" in mode[1:] and mode.startswith("busyn") else 0
                for tid in os.listdir("/proc/%s/task" % swpid):
                    try:
                        os.setpriority(os.PRIO_PROCESS, int(tid), -nv)
                    except OSError:
                        pass
            conn.allreduce(sync)
            if mode.startswith("busy"):
                ev.set()
                time.sleep(0.03)
            s0, sc0, sw0, n0 = conn.stats(), sched("self"), sched(swpid) if rank == 0 else {}, snmp()
            t0 = time.perf_counter()
            for _ in range(3):
                conn.allreduce(a)
            dt = (time.perf_counter() - t0) / 3
            s1, sc1, sw1, n1 = conn.stats(), sched("self"), sched(swpid) if rank == 0 else {}, snmp()
            ev.clear()
            out.setdefault("sc_" + mode, []).append(sdiff(sc0, sc1))
            out.setdefault("sw_" + mode, []).append(sdiff(sw0, sw1))
            out.setdefault("udp_" + mode, []).append({k: n1[k] - n0[k] for k in n1})
            out[mode].append(dt)
            out["st_" + mode].append({k: s1[k] - s0[k] for k in s1 if isinstance(s1[k], int) and k in s0})
    stop.set()
    print("RANK%d %s" % (rank, json.dumps(out)), flush=True)
    conn.close()


def _med(v):
    return sorted(v)[len(v) // 2] if v else None


def driver(name, subnet, iters, codes, nelem, runs):
    import subprocess
    sys.path.insert(0, codes[0][1])
    from netreduce.testbed import Testbed
    res = []
    for run in range(runs):
        order = codes if run % 2 == 0 else codes[::-1]
        for tag, code in order:
            code, *opts = code.split(",")
            opts = dict(o.split("=") for o in opts)
            with Testbed(hosts=4, rate="1gbit", name=name, subnet=subnet, mtu=9000, replace=True) as tb:
                swargs = ["--slots", opts["slots"]] if "slots" in opts else []
                swargs += ["--threads", opts["threads"]] if "threads" in opts else []
                sw = tb.spawn_switch(args=swargs, env=dict(os.environ, PYTHONPATH=code))
                if "nice" in opts:
                    for tid in os.listdir("/proc/%d/task" % sw.pid):
                        os.setpriority(os.PRIO_PROCESS, int(tid), int(opts["nice"]))
                host, port = sw.address
                la = os.getloadavg()[0]
                procs = [tb.popen(r, [sys.executable, __file__, "rank", host, str(port), str(r), "4",
                                      str(iters), code, str(nelem), str(sw.pid)],
                                  stdout=subprocess.PIPE, text=True) for r in range(4)]
                outs = [p.communicate(timeout=600)[0] for p in procs]
                aggsnmp = tb.run(tb.aggregator, ["cat", "/proc/net/snmp"], capture_output=True,
                                 text=True).stdout
                qd = tb.qdisc_drops()
                sw.stop()
            ranks = {}
            for o in outs:
                for line in o.splitlines():
                    if line.startswith("RANK"):
                        r, js = line.split(" ", 1)
                        ranks[r] = json.loads(js)
            r0 = ranks.get("RANK0", {})
            rec = {"run": run, "tree": tag, "load": la, "ranks": ranks,
                   "aggsnmp": [line for line in aggsnmp.splitlines() if line.startswith("Udp")],
                   "qdisc_drops": qd}
            for m in r0:
                if not m.startswith(("st_", "sc_", "sw_", "udp_")):
                    rec[m + "_ms"] = _med(r0[m]) * 1e3
            print(json.dumps({k: rec[k] for k in rec if k not in ("ranks", "aggsnmp", "qdisc_drops")}), flush=True)
            res.append(rec)
    return res


if __name__ == "__main__":
    if sys.argv[1] == "rank":
        rank_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]),
                  sys.argv[7], int(sys.argv[8]), sys.argv[9])
    else:
        import argparse
        ap = argparse.ArgumentParser()
        ap.add_argument("--code", action="append", default=[])
        ap.add_argument("--iters", type=int, default=6)
        ap.add_argument("--runs", type=int, default=1)
        ap.add_argument("--nelem", type=int, default=2359296)
        ap.add_argument("--name", default="wr1")
        ap.add_argument("--subnet", default="10.98.1.0/24")
        ap.add_argument("--out", default="")
        a = ap.parse_args()
        codes = [tuple(c.split("=", 1)) for c in a.code]
        res = driver(a.name, a.subnet, a.iters, codes, a.nelem, a.runs)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(res, f)
