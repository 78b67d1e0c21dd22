"""Speculative steps (netreduce/worker/speculation.py) on the real data planes: three ranks
through the launcher, flat (every rank through a real netreduce-switch) and
hierarchical (shared memory), with an idle rank, a tensor set that changes and two
dtypes, then synchronous steps in one call (Agreement.steady, the algorithm's native
vote_step: Average's copy-out as numpy's multiply); every result exact and
bit-identical on every rank."""
import json

import pytest

from netreduce.environment import discover
from tests.procs import launch_script


SCRIPT = r"""
import hashlib, json, time
import numpy as np
import netreduce as nr
from netreduce import api
nr.init()
r, n = nr.rank(), nr.size()
comm = api._communicator()
digest = hashlib.sha256()

def data(rank, step, name, dtype):
    rng = np.random.default_rng(rank * 1000 + step * 10 + len(name))
    return rng.integers(-1000, 1000, 1024 if name == "g" else 333).astype(dtype)

def step(k, names, dtype=np.float32):
    hs = {m: nr.allreduce_async(data(r, k, m, dtype), op=nr.Sum, name=m) for m in names}
    for m, h in hs.items():
        out = nr.synchronize(h)
        want = sum(data(q, k, m, dtype) for q in range(n))
        assert out.dtype == want.dtype and np.array_equal(out, want), (r, k, m)
        digest.update(out.tobytes())

k = 0
for names, steps in ((["g"], 20), (["g", "h"], 10), (["h"], 10)):
    for _ in range(steps):
        if r == 1 and k == 8:
            time.sleep(0.3)                   # idle past IDLE_S: zero votes, a miss
        step(k, names)
        k += 1
for _ in range(10):                           # 'i' in int32: its own group and wire dtype
    step(k, ["i"], np.int32)
    k += 1
for _ in range(14):                           # synchronous calls: one call per step
    if r == 1 and k == 56:
        time.sleep(0.3)                       # a miss inside a one-call step
    out = nr.allreduce(data(r, k, "s", np.float32), op=nr.Average, name="s",
                       postscale_factor=0.5)
    want = np.multiply(sum(data(q, k, "s", np.float32) for q in range(n)), 0.5 / n)
    assert out.dtype == np.float32 and np.array_equal(out, want), (r, k, out, want)
    digest.update(out.tobytes())
    k += 1
for _ in range(8):                            # ... in place, float64
    x = data(r, k, "d", np.float64)
    assert nr.allreduce_(x, op=nr.Sum, name="d") is x
    assert np.array_equal(x, sum(data(q, k, "d", np.float64) for q in range(n))), (r, k)
    digest.update(x.tobytes())
    k += 1
spec = comm.agreement.spec
print("RESULT " + json.dumps({"rank": r, "digest": digest.hexdigest(), "hits": spec.hits,
                              "misses": spec.misses, "lone_hits": spec.lone_hits}), flush=True)
nr.shutdown()
"""


@pytest.mark.skipif(discover().size > 1, reason="starts its own job")
@pytest.mark.parametrize("algorithm", ["flat", "hierarchical"])
def test_speculative_steps_exact_on_the_real_data_plane(algorithm):
    proc = launch_script(SCRIPT, 3, NETREDUCE_TIMEOUT="20", NETREDUCE_ALGORITHM=algorithm)
    assert proc.returncode == 0, proc.stdout[-4000:]
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in proc.stdout.splitlines()
               if "RESULT " in line]
    assert sorted(x["rank"] for x in results) == [0, 1, 2], proc.stdout[-4000:]
    assert len({x["digest"] for x in results}) == 1        # the same bits everywhere
    assert all(x["hits"] > 0 for x in results)             # steps ran speculatively
    assert any(x["misses"] > 0 for x in results)           # ... and the idle rank's missed
    assert all(x["lone_hits"] > 0 for x in results)        # synchronous steps in one call
