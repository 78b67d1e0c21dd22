"""Ranks started by torchrun (python -m torch.distributed.run), not by netreduce-run:
rank and size come from RANK/WORLD_SIZE, and ``init_process_group("netreduce")`` with
no other argument must find an aggregator by itself — rank 0 starts one and publishes
its address in torch's store. The ``netreduce://`` rendezvous (no MASTER_ADDR) is
checked too, with an aggregator named by NETREDUCE_SWITCH. This file is also the
worker (see __main__); workers report through files, not stdout."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _batch(rank: int):
    import torch
    gen = torch.Generator().manual_seed(10 + rank)
    return torch.randn(5, 4, generator=gen), torch.randn(5, 2, generator=gen)


def worker(mode: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import netreduce.torch  # noqa: F401  (registers the backend)
    from netreduce.torch import process_group

    if mode == "netreduce":
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(var, None)
        dist.init_process_group("netreduce", init_method="netreduce://")
    else:
        dist.init_process_group("netreduce")  # env:// from torchrun's variables
    r, n = dist.get_rank(), dist.get_world_size()
    assert (r, n) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])), (r, n)
    assert dist.get_backend() == "netreduce"

    # rank r contributes r: every element must be n(n-1)/2
    for dtype in (torch.float32, torch.int64):
        t = torch.full((1000,), r, dtype=dtype)
        dist.all_reduce(t)
        assert torch.all(t == n * (n - 1) // 2), (dtype, t[:4])

    # One DDP step from different initial weights: DDP broadcasts rank 0's (seed 0),
    # then averages the ranks' gradients, which each rank recomputes locally.
    torch.manual_seed(0 if r == 0 else 100 + r)
    ddp = DDP(torch.nn.Linear(4, 2))
    torch.manual_seed(0)
    reference = torch.nn.Linear(4, 2)
    for rr in range(n):
        x, y = _batch(rr)
        (F.mse_loss(reference(x), y) / n).backward()
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x, y = _batch(r)
    F.mse_loss(ddp(x), y).backward()
    for p, q in zip(ddp.module.parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), (p.grad, q.grad)
    opt.step()
    gathered = [None] * n
    dist.all_gather_object(gathered, [p.detach() for p in ddp.module.parameters()])
    assert all(torch.equal(a, b) for other in gathered for a, b in zip(gathered[0], other))

    address = os.environ["NETREDUCE_SWITCH"]
    embedded = int(process_group._embedded_switch is not None)
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{r}"), "w") as f:
        f.write(f"OK {r} {n} {address} {embedded}\n")


import pytest  # noqa: E402

torch = pytest.importorskip("torch")
from netreduce.environment import discover  # noqa: E402

pytestmark = pytest.mark.skipif(discover().size > 1, reason="starts its own ranks")


def _torchrun(tmp_path, mode: str, switch_address: str = "") -> list:
    env = dict(os.environ, NR_TEST_OUT=str(tmp_path), NETREDUCE_TIMEOUT="20",
               OMP_NUM_THREADS="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for var in ("NETREDUCE_SWITCH", "NETREDUCE_RANK", "NETREDUCE_SIZE", "NETREDUCE_JOB",
                "NETREDUCE_LOCAL_RANK", "NETREDUCE_LOCAL_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env.pop(var, None)
    if switch_address:
        env["NETREDUCE_SWITCH"] = switch_address
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--standalone", os.path.abspath(__file__), mode]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180,
                          cwd=ROOT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    reports = sorted(p.read_text().split() for p in tmp_path.iterdir())
    assert [r[:3] for r in reports] == [["OK", "0", "2"], ["OK", "1", "2"]], reports
    return reports


@pytest.mark.slow
def test_torchrun_env_init_starts_embedded_aggregator(tmp_path):
    """No NETREDUCE_SWITCH, plain init_process_group("netreduce"): rank 0 hosts the
    aggregator and rank 1 learns the same address from the store."""
    reports = _torchrun(tmp_path, "env")
    assert reports[0][3] == reports[1][3] and reports[0][3].startswith("127.0.0.1:")
    assert [r[4] for r in reports] == ["1", "0"], reports


@pytest.mark.slow
def test_torchrun_netreduce_rendezvous_without_master_addr(switch, tmp_path):
    host, port = switch.address
    reports = _torchrun(tmp_path, "netreduce", f"{host}:{port}")
    assert [r[3] for r in reports] == [f"{host}:{port}"] * 2
    assert [r[4] for r in reports] == ["0", "0"], reports


def test_netreduce_rendezvous_without_aggregator_says_what_to_do(monkeypatch):
    """torchrun-style ranks, netreduce://, no NETREDUCE_SWITCH: a local error that
    names both ways out, before any connection is attempted."""
    from netreduce.torch import mpi_ops, process_group
    if mpi_ops.is_initialized():
        pytest.skip("netreduce is initialized in this process")
    monkeypatch.delenv("NETREDUCE_SWITCH", raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(mpi_ops.NetReduceError, match="rank 1 of 2.*NETREDUCE_SWITCH.*env://"):
        next(process_group._rendezvous("netreduce://"))


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    worker(sys.argv[1], os.environ["NR_TEST_OUT"])
