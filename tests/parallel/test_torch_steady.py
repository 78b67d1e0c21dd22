"""netreduce.torch's synchronous all-reduces in the steady state take the core's one-call
step (frameworks/torch/mpi_ops.py _allreduce_now -> netreduce/api.py _steady): two
ranks through the launcher, named hvd.allreduce (autograd-aware, its gradient the
all-reduce of the gradient) and hvd.allreduce_ (in place, float64) step after step;
every result exact, the same bits on every rank, and the speculation's one-call
counter moved on every rank (a torch path that still submitted and waited leaves it
at 0)."""
import json

import pytest

from netreduce.environment import discover
from tests.procs import launch_script

SCRIPT = r"""
import hashlib, json
import torch
import netreduce.torch as hvd
from netreduce import api
hvd.init()
r, n = hvd.rank(), hvd.size()
digest = hashlib.sha256()

def data(rank, step, dtype):
    g = torch.Generator().manual_seed(rank * 1000 + step)
    return torch.randint(-1000, 1000, (1024,), generator=g).to(dtype)

for k in range(24):                              # a new tensor, autograd through it
    x = data(r, k, torch.float32).requires_grad_()
    out = hvd.allreduce(x, name="s", op=hvd.Sum)
    want = sum(data(q, k, torch.float32) for q in range(n))
    assert torch.equal(out.detach(), want), (r, k)
    digest.update(out.detach().numpy().tobytes())
    if k == 23:
        out.sum().backward()                     # the gradient: a sum of n ones
        assert torch.equal(x.grad, torch.full_like(x, float(n))), (r, x.grad[:4])
for k in range(24, 40):                          # in place, float64, averaged
    y = data(r, k, torch.float64)
    assert hvd.allreduce_(y, name="d") is y
    want = sum(data(q, k, torch.float64) for q in range(n)) / n
    assert torch.equal(y, want), (r, k)
    digest.update(y.numpy().tobytes())
spec = api._communicator().agreement.spec
print("RESULT " + json.dumps({"rank": r, "digest": digest.hexdigest(),
                              "lone_hits": spec.lone_hits}), flush=True)
hvd.shutdown()
"""


@pytest.mark.skipif(discover().size > 1, reason="starts its own job")
def test_torch_synchronous_steps_take_the_one_call_path():
    proc = launch_script(SCRIPT, 2, NETREDUCE_TIMEOUT="20")
    assert proc.returncode == 0, proc.stdout[-4000:]
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in proc.stdout.splitlines()
               if "RESULT " in line]
    assert sorted(x["rank"] for x in results) == [0, 1], proc.stdout[-4000:]
    assert len({x["digest"] for x in results}) == 1        # the same bits everywhere
    assert all(x["lone_hits"] > 0 for x in results), results
