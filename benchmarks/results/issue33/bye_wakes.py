"""Per-thread context switches of a rank: in a 4 KiB steady loop, right after it, and idle."""
import json
import os
import resource
import sys
import threading
import time
import numpy as np
import netreduce as nr
from netreduce import api

def switches():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                d = dict(ln.split(":", 1) for ln in f if "ctxt_switches" in ln)
            out[int(tid)] = int(d["voluntary_ctxt_switches"]) + int(d["nonvoluntary_ctxt_switches"])
        except OSError:
            pass
    return out

def run_ns():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except OSError:
            pass
    return out

def cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime

nr.init()
comm = api._communicator()
# the communicator's threads by their names (netreduce-executor, -negotiation, -watch)
names = {t.native_id: t.name.replace("netreduce-", "") for t in threading.enumerate()
         if t.name.startswith("netreduce-")}
names[threading.get_native_id()] = "main"
x = np.ones(1024, np.float32)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
idle_s = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
for _ in range(200):
    nr.allreduce(x, name="g", op=nr.Sum)
res = {"rank": nr.rank()}
def phase(label, fn):
    s0, r0, c0, t0 = switches(), run_ns(), cpu(), time.monotonic()
    fn()
    s1, r1, c1, t1 = switches(), run_ns(), cpu(), time.monotonic()
    per, ns = {}, {}
    for tid, v in r1.items():
        ns[names.get(tid, "other")] = ns.get(names.get(tid, "other"), 0) + v - r0.get(tid, 0)
    for tid, v in s1.items():
        per[names.get(tid, "other")] = per.get(names.get(tid, "other"), 0) + v - s0.get(tid, 0)
    res[label] = {"s": round(t1 - t0, 3), "cpu_s": round(c1 - c0, 4),
                  "switches": per, "run_us": {k: round(v / 1e3) for k, v in ns.items()},
                  "per_s": {k: round(v / (t1 - t0), 1) for k, v in per.items()}}
def steady():
    for _ in range(steps):
        nr.allreduce(x, name="g", op=nr.Sum)
phase("steady", steady)
res["steady"]["per_call_us_cpu"] = round(res["steady"]["cpu_s"] / steps * 1e6, 2)
res["steady"]["executor_per_call"] = round(res["steady"]["switches"].get("executor", 0) / steps, 4)
res["steady"]["lone_hits"] = comm.agreement.spec.lone_hits
res["steady"]["executor_us_per_call"] = round(res["steady"]["run_us"].get("executor", 0) / steps, 3)
phase("after1s", lambda: time.sleep(1.0))
phase("idle", lambda: time.sleep(idle_s))
nr.barrier()
print(json.dumps(res), flush=True)
nr.shutdown()
