# ruff: noqa
# tiny5 (12-07), from tiny4_pyonly.py: a scratch script of BENCHMARKS.md "4 KiB all-reduce at N=4 on the AMD boot", kept as it ran.
"""Pure Python cost of the steady path: the native vote_step stubbed (tiny5: PROFILE=1 adds a cProfile of rank 0)."""
import os
import time
import numpy as np
import netreduce as nr
nr.init()
x = np.ones(1024, np.float32)
run = lambda: nr.allreduce(x, name="g", op=nr.Sum)
for _ in range(500): run()
nr.allreduce(x, name="sync")   # both ranks here, then stub
for _ in range(300): run()
dp = nr.api._g.comm.dp
class Fake:
    def vote_step(self, src, buf, out, factor, ranks):
        return 1
    def allreduce(self, src, dst, dt, op):
        if dst is not None and dst is not src:
            dst[...] = src
real = dp._native
dp._native = Fake()
ag = nr.api._g.comm.agreement
h0 = ag.spec.hits
res = []
for rep in range(7):
    c0 = time.thread_time()
    for _ in range(20000): run()
    res.append((time.thread_time()-c0)/20000*1e6)
if os.environ.get("PROFILE") == "1" and nr.rank() == 0:
    import cProfile, pstats, io
    pr = cProfile.Profile(); pr.enable()
    for _ in range(20000): run()
    pr.disable(); sio = io.StringIO(); pstats.Stats(pr, stream=sio).sort_stats("tottime").print_stats(40); print(sio.getvalue(), flush=True)
dp._native = real
print(f"rank {nr.rank()} python-only cpu us/call {sorted(res)[3]:.2f} [{' '.join(f'{r:.2f}' for r in res)}] hits {ag.spec.hits-h0}", flush=True)
nr.allreduce(x, name="sync2")
nr.shutdown()
