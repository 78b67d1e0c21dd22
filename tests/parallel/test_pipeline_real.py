"""Agreed groups in flight while the next round runs (netreduce/worker/pipeline.py), on
the real data plane: three ranks through the launcher and a real netreduce-switch,
backward-like bursts of tensors submitted a few at a time, so that rounds agree
groups that go on the wire behind one another: large tensors reduced in place
(float32 and float64, Sum and Average with a post-scale), a prescaled one and small
ones fused in the pipeline's own buffer, an int32 group, a float16 tensor carried as
float32 in a buffer beyond the fusion threshold's; a rank that lags in some steps.
Every result exact and bit-identical on every rank."""
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
# name -> (elements, dtype, op, prescale, postscale): in the order "backward" makes them
TENSORS = [("w4", 300_000, np.float32, nr.Average, 1.0, 1.0),
           ("b4", 333, np.float32, nr.Average, 1.0, 1.0),
           ("w3", 70_000, np.float32, nr.Average, 1.0, 1.0),
           ("p3", 80_000, np.float32, nr.Sum, 0.5, 1.0),
           ("b3", 1024, np.float32, nr.Average, 1.0, 1.0),
           ("d2", 40_000, np.float64, nr.Sum, 1.0, 1.0),
           ("w2", 100_000, np.float32, nr.Average, 1.0, 0.25),
           ("i1", 90_000, np.int32, nr.Sum, 1.0, 1.0),
           ("h1", 300_000, np.float16, nr.Sum, 1.0, 1.0),
           ("b1", 77, np.float32, nr.Sum, 1.0, 1.0)]

def data(rank, step, name, count, dtype):
    rng = np.random.default_rng(rank * 100_000 + step * 100 + len(name) * 7 + ord(name[0]))
    bound = 300 if dtype == np.float16 else 1000     # float16: sums exact
    return rng.integers(-bound, bound, count).astype(dtype)

def want(step, name, count, dtype, op, pre, post):
    parts = [data(q, step, name, count, dtype) for q in range(n)]
    if pre != 1.0:
        parts = [np.multiply(p, pre) for p in parts]
    s = parts[0].copy()
    for p in parts[1:]:
        s += p
    factor = post / n if op is nr.Average else post
    return s if factor == 1.0 else np.multiply(s, factor)

for k in range(12):
    handles = []
    for j, (name, count, dtype, op, pre, post) in enumerate(TENSORS):
        x = data(r, k, name, count, dtype)
        handles.append((name, x, nr.allreduce_async(x, op=op, name=name, prescale_factor=pre, inplace=True,
                                                     postscale_factor=post)))
        if j % 3 == 2:
            time.sleep(0.004 * (1 + (r == 1 and k % 4 == 1)))  # the next layer's backward
    for (name, x, h), t in zip(handles, TENSORS):
        out = nr.synchronize(h)
        assert out is x, name
        w = want(k, *t)
        assert out.dtype == w.dtype and np.array_equal(out, w), (r, k, name)
        digest.update(out.tobytes())
p = comm.agreement.pipeline
print("RESULT " + json.dumps({"rank": r, "algorithm": comm.dp.name,
                              "digest": digest.hexdigest(), "groups": p.groups,
                              "direct": p.direct, "messages": p.messages}), flush=True)
nr.shutdown()
"""


@pytest.mark.skipif(discover().size > 1, reason="starts its own job")
def test_agreed_groups_in_flight_exact_on_the_real_data_plane():
    proc = launch_script(SCRIPT, 3, NETREDUCE_TIMEOUT="20", NETREDUCE_ALGORITHM="flat",
                         NETREDUCE_FUSION_THRESHOLD="1M")
    assert proc.returncode == 0, proc.stdout[-4000:]
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in proc.stdout.splitlines()
               if "RESULT " in line]
    assert sorted(x["rank"] for x in results) == [0, 1, 2], proc.stdout[-4000:]
    assert len({x["digest"] for x in results}) == 1         # the same bits everywhere
    assert len({(x["groups"], x["direct"], x["messages"]) for x in results}) == 1
    assert all(x["groups"] > 0 for x in results)            # groups went through the pipeline
    assert all(x["direct"] > 0 for x in results)            # ... large tensors in place
    assert all(x["messages"] > x["direct"] for x in results)  # ... small ones fused


DEATH = r"""
import json, os, time
import numpy as np
import netreduce as nr
from netreduce import api
from netreduce.errors import RankFailedError
nr.init()
r, n = nr.rank(), nr.size()
pipeline = api._communicator().agreement.pipeline
x = np.ones(8 << 20, np.float32)                      # 32 MiB: long enough on the wire
for _ in range(3):
    nr.synchronize(nr.allreduce_async(x, op=nr.Sum, name="big", inplace=True))
    x.fill(1)
assert pipeline.groups > 0                            # agreed and sent in flight
if r == 1:
    # killed with its message on the wire: at once after the executor submits it. A
    # main thread polling pipeline.flying() every 0.5 ms could miss the whole flight
    # on a loaded host; rank 1 then left after the message landed and the others
    # completed it (flake2_D_test_pipeline_algorithms_170948.txt, load 6.9).
    start = pipeline.start
    def start_and_die(group):
        start(group)
        os._exit(0)
    pipeline.start = start_and_die
h = nr.allreduce_async(x, op=nr.Sum, name="big", inplace=True)
if r == 1:
    nr.synchronize(h)                                 # does not return: rank 1 exits
    os._exit(3)
t0 = time.monotonic()
try:
    nr.synchronize(h)
    raise AssertionError("the all-reduce completed without rank 1")
except RankFailedError as exc:
    assert exc.rank == 1 and "rank 1" in str(exc), str(exc)
nr.shutdown()                                         # the executor's messages have ended
print("RESULT " + json.dumps({"rank": r, "s": time.monotonic() - t0}), flush=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(discover().size > 1, reason="starts its own job")
def test_a_rank_dying_under_a_message_in_flight_fails_the_others_naming_it():
    # The error comes at once (the handle fails with the job); the message on the wire
    # must end too, or shutdown() waits for it: at the data plane's timeout (60 s here),
    # or shutdown's own 30 s. The communicator aborts it once the coordinator says rank
    # 1 died (ABORT_GRACE_S later).
    proc = launch_script(DEATH, 3, timeout=120, NETREDUCE_TIMEOUT="60",
                         NETREDUCE_ALGORITHM="flat")
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in proc.stdout.splitlines()
               if "RESULT " in line]
    assert sorted(x["rank"] for x in results) == [0, 2], proc.stdout[-4000:]
    assert all(x["s"] < 20 for x in results), results
