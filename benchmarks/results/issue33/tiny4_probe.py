# ruff: noqa
# tiny4 (12-07): a scratch script of BENCHMARKS.md "4 KiB all-reduce at N=4 on the AMD boot", kept as it ran.
"""Per-thread CPU and context switches per call, each rank (tiny4 probe)."""
import json
import os
import subprocess
import sys
import time
import uuid

def tasks():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                st = f.read()
            name = st[st.index("(")+1:st.rindex(")")]
            with open(f"/proc/self/task/{tid}/status") as f:
                d = dict(line.split(":", 1) for line in f if ":" in line)
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run_ns = int(f.read().split()[0])
            out[tid] = (name, run_ns, int(d["voluntary_ctxt_switches"]), int(d["nonvoluntary_ctxt_switches"]))
        except FileNotFoundError:
            pass
    return out

def worker():
    import numpy as np
    import netreduce as nr
    nr.init()
    x = np.ones(1024, np.float32)
    raw = os.environ.get("RAW") == "1"
    if raw:
        dp = nr.api._g.comm.dp
        run = lambda: dp.allreduce(x, None, op="sum")
        nr.allreduce(x, name="sync")
    else:
        run = lambda: nr.allreduce(x, name="g", op=nr.Sum)
    iters = int(os.environ.get("ITERS", "2000"))
    for _ in range(300):
        run()
    a = tasks(); t = time.perf_counter()
    for _ in range(iters):
        run()
    per = (time.perf_counter() - t) / iters
    b = tasks()
    th = []
    for tid, (name, r, v, n) in b.items():
        if tid not in a: continue
        _, r0, v0, n0 = a[tid]
        th.append({"tid": tid, "name": name, "cpu_us": (r - r0) / iters / 1e3,
                   "vol": (v - v0) / iters, "invol": (n - n0) / iters})
    print(json.dumps({"rank": nr.rank(), "us": per * 1e6, "threads": th}), flush=True)
    nr.shutdown()

def drive(code, np_, raw):
    sys.path.insert(0, os.path.join(code, "benchmarks"))
    import control_plane as cp
    sw, addr = cp._spawn_switch(code)
    job = uuid.uuid4().hex[:8]
    procs = []
    for r in range(np_):
        env = dict(os.environ, PYTHONPATH=code, NETREDUCE_RANK=str(r), NETREDUCE_SIZE=str(np_),
                   NETREDUCE_LOCAL_RANK=str(r), NETREDUCE_LOCAL_SIZE=str(np_), NETREDUCE_SWITCH=addr,
                   NETREDUCE_JOB=job, NETREDUCE_CACHE_AGREEMENT="0" if raw else "1",
                   NETREDUCE_ALGORITHM="auto", NETREDUCE_CYCLE_TIME="1", RAW="1" if raw else "0")
        procs.append(subprocess.Popen([sys.executable, __file__, "worker"], env=env, cwd=code,
                                      stdout=subprocess.PIPE, text=True))
    res = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        res.append(json.loads(out.strip().splitlines()[-1]))
    sw.terminate(); sw.wait()
    for r in res:
        tot = sum(t["cpu_us"] for t in r["threads"])
        print(f"rank {r['rank']} {r['us']:.1f} us/call, cpu {tot:.1f} us/call")
        for t in r["threads"]:
            if t["cpu_us"] > 0.5 or t["vol"] > 0.01 or t["invol"] > 0.01:
                print(f"   {t['name']:16s} cpu {t['cpu_us']:6.1f}  vol {t['vol']:.2f}  invol {t['invol']:.2f}")

if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker()
    else:
        drive(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "raw")
