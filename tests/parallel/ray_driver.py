"""The driver tests/parallel/test_ray.py runs in its own process (so the local Ray
cluster it starts ends with it): Ray Train's TorchTrainer with NetReduceConfig, then
netreduce's RayExecutor, both with 2 CPU workers. Prints one line, RESULT <json>."""
import json
import os
import shutil
import sys
import tempfile

import ray
import torch
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer

from netreduce.launcher.ray_executor import RayExecutor
from netreduce.torch.ray_train import NetReduceConfig
from tests.prebuild import files_line

STEPS, LR, WORKERS = 8, 0.05, 2
TRUE_W = [1.0, -2.0, 3.0, 0.5]


def batch(rank):
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(32, 4, generator=gen)
    return x, x @ torch.tensor(TRUE_W) + 0.1


def fresh_model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def train_loop(cfg):
    import torch.distributed as dist
    import ray.train
    import ray.train.torch
    import netreduce.torch as hvd
    from netreduce.torch import process_group

    rank = ray.train.get_context().get_world_rank()
    model = ray.train.torch.prepare_model(fresh_model())  # DDP over the default group
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = batch(rank)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = ((model(x).squeeze(-1) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    t = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(t)
    hvd.init()  # the Horovod API over the same job
    avg = hvd.allreduce(torch.tensor([float(rank)]), name="ray.avg")
    switch = process_group._embedded_switch
    record = {"rank": rank, "backend": dist.get_backend(), "sum": int(t.item()),
              "hvd_avg": avg.item(), "layout": [hvd.rank(), hvd.size(), hvd.local_rank(),
                                                  hvd.local_size()],
              "losses": losses, "weights": [p.detach().reshape(-1).tolist()
                                            for p in model.parameters()],
              "aggregator_pid": switch.proc.pid if switch is not None else None}
    with open(os.path.join(cfg["out"], f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


def reference_weights():
    """One process, the mean of the workers' losses: what DDP's averaged step gives."""
    model = fresh_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(STEPS):
        opt.zero_grad()
        loss = sum(((model(batch(r)[0]).squeeze(-1) - batch(r)[1]) ** 2).mean()
                   for r in range(WORKERS)) / WORKERS
        loss.backward()
        opt.step()
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]


def executor_fn(scale):
    import numpy as np
    import netreduce as nr
    nr.init()
    summed = nr.allreduce(np.full(70001, nr.rank() + 1, dtype=np.int32), op=nr.Sum)
    return {"rank": nr.rank(), "size": nr.size(), "local": [nr.local_rank(), nr.local_size()],
            "exact": bool((summed == scale * nr.size() * (nr.size() + 1) // 2).all())}


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main():
    ray.init(num_cpus=2 * WORKERS, include_dashboard=False, log_to_driver=False)
    # each worker's report, read back here (then the folder goes); named for
    # tests/prebuild.py, which removes it where this run is killed first
    out = tempfile.mkdtemp(prefix="nr-ray-")
    print(files_line(out), flush=True)
    try:
        result = TorchTrainer(train_loop, train_loop_config={"out": out},
                              scaling_config=ScalingConfig(num_workers=WORKERS),
                              torch_config=NetReduceConfig()).fit()
        ranks = [json.load(open(os.path.join(out, f))) for f in sorted(os.listdir(out))]
    finally:
        shutil.rmtree(out, ignore_errors=True)
    pid = ranks[0]["aggregator_pid"] if ranks else None
    trainer = {"error": repr(result.error) if result.error else None, "ranks": ranks,
               "reference": reference_weights(),
               "aggregator_left_running": bool(pid and alive(pid))}

    executor = RayExecutor(num_workers=WORKERS)
    executor.start()
    aggregator = executor._aggregator.proc.pid
    first = executor.run(executor_fn, args=[1])
    again = executor.run(executor_fn, kwargs={"scale": 1})  # the same actors, still joined
    executor.shutdown()
    summary = {"trainer": trainer, "executor": {"first": first, "again": again,
                                                 "aggregator_left_running": alive(aggregator)}}
    ray.shutdown()
    print("RESULT " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    sys.exit(main())
