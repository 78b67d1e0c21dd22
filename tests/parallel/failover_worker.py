"""One rank of a failover job (tests/parallel/test_failover.py), through the public
API. Prints one JSON line.

    python failover_worker.py MODE MARK STEPS

MODE exact   STEPS all-reduces of seeded data (int32 and quarter-integer float32,
             sizes from 1 element to 4 Mi elements, most of them many chunks), each
             checked bit for bit against numpy on every rank; rank 0 creates the
             file MARK.RANK before step 3 (the test kills the aggregator once all did), and the
             steps after that are large, so that the kill lands inside one
     hold    STEPS all-reduces, MARK.RANK, a pause until MARK.go exists, STEPS more
     psets   exact's all-reduces, each followed by one in each of two process sets
     torch   a Horovod-API training loop (netreduce.torch DistributedOptimizer) of
             STEPS steps; every rank creates MARK.RANK before step 3; reports the loss and a
             digest of the parameters (identical on every rank)
"""
from __future__ import annotations

import hashlib
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import netreduce as nr  # noqa: E402
from netreduce.errors import NetReduceError  # noqa: E402
from tests.procs import finish  # noqa: E402

SIZES = [1, 1000, 65_537, 1 << 20, 3_000_001, 4 << 20]  # elements


def data(dtype: str, rank: int, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, rank])
    if dtype == "int32":
        return rng.integers(-10**6, 10**6, count).astype(np.int32)
    return (rng.integers(-64, 64, count).astype(np.float32) / 4)


def exact(rank: int, size: int, mark: str, steps: int, out: dict) -> None:
    digest = hashlib.sha256()
    for step in range(steps):
        n = SIZES[step] if step < 3 else 4 << 20 if step == 3 else SIZES[3 + step % 3]
        dtype = ("int32", "float32")[step % 2]
        mine = data(dtype, rank, n, step)
        want = sum(data(dtype, r, n, step) for r in range(size))
        if step == 3:  # right before a 16 MiB all-reduce: the kill lands in it
            open(f"{mark}.{rank}", "w").close()
        got = nr.allreduce(mine, op=nr.Sum, name=f"t{step}")
        if not np.array_equal(got, want):
            bad = np.flatnonzero(got != want)
            out["wrong"] = f"step {step}: {bad.size} of {n} elements differ, first {bad[:5]}"
            return
        digest.update(got.tobytes())
        out["checked"] += 1
    out["digest"] = digest.hexdigest()


def hold(rank: int, size: int, mark: str, steps: int, out: dict) -> None:
    """STEPS checked all-reduces, MARK.RANK, then wait (60 s at most) for MARK.go
    while the test looks at the running job, then STEPS more."""
    for step in range(2 * steps):
        if step == steps:
            open(f"{mark}.{rank}", "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(f"{mark}.go") and time.monotonic() < deadline:
                time.sleep(0.02)
        n = SIZES[step % 4]
        mine = data("int32", rank, n, step)
        got = nr.allreduce(mine, op=nr.Sum, name=f"h{step}")
        if not np.array_equal(got, sum(data("int32", r, n, step) for r in range(size))):
            out["wrong"] = f"step {step}"
            return
        out["checked"] += 1
    out["digest"] = "same"


def psets(rank: int, size: int, mark: str, steps: int, out: dict) -> None:
    """exact's global all-reduces, each followed by one in each process set this rank
    belongs to ({0, 1} and {1, .., size-1}), checked bit for bit."""
    from netreduce.worker import process_sets
    sets = [process_sets.add_process_set([0, 1]),
            process_sets.add_process_set(list(range(1, size)))]
    digest = hashlib.sha256()
    for step in range(steps):
        n = SIZES[step] if step < 3 else 4 << 20 if step == 3 else SIZES[3 + step % 3]
        if step == 3:
            open(f"{mark}.{rank}", "w").close()
        got = nr.allreduce(data("int32", rank, n, step), op=nr.Sum, name=f"g{step}")
        if not np.array_equal(got, sum(data("int32", r, n, step) for r in range(size))):
            out["wrong"] = f"step {step}: global"
            return
        digest.update(got.tobytes())
        for i, ps in enumerate(sets):
            if rank not in ps.ranks:
                continue
            m = SIZES[(step + i) % 4]
            with process_sets.using(ps):
                got = nr.allreduce(data("float32", rank, m, 100 + step), op=nr.Sum,
                                   name=f"p{i}.{step}")
            want = sum(data("float32", r, m, 100 + step) for r in ps.ranks)
            if not np.array_equal(got, want):
                out["wrong"] = f"step {step}: process set {ps.ranks}"
                return
        out["checked"] += 1
    out["digest"] = digest.hexdigest()


def torch_loop(rank: int, size: int, mark: str, steps: int, out: dict) -> None:
    import torch
    import netreduce.torch as hvd
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(64, 256, generator=gen)
    y = torch.randint(0, 10, (64,), generator=gen)
    losses = []
    for step in range(steps):
        if step == 3:
            open(f"{mark}.{rank}", "w").close()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
        out["checked"] += 1
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
    out["digest"] = digest.hexdigest()
    out["losses"] = losses


def main() -> None:
    mode, mark, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    out: dict = {"checked": 0}
    t0 = time.monotonic()
    try:
        nr.init()
        out["rank"] = nr.rank()
        {"exact": exact, "hold": hold, "psets": psets, "torch": torch_loop}[mode](nr.rank(), nr.size(), mark,
                                                                 steps, out)
        out["stats"] = {k: v for k, v in nr.api._comm().dp.stats().items()
                        if isinstance(v, (int, float, str, bool))}
        out["history"] = getattr(nr.api._comm().dp, "history", [])
    except NetReduceError as exc:
        out["failure"] = f"{type(exc).__name__}: {exc}"
        if out.get("rank") is not None and not os.path.exists(f"{mark}.{out['rank']}"):
            open(f"{mark}.{out['rank']}", "w").close()  # failed early: do not keep the test waiting
    out["seconds"] = time.monotonic() - t0
    finish(out)


if __name__ == "__main__":
    main()
