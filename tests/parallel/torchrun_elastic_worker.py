"""One worker of test_torchrun_elastic.py, started by torchrun: the
``init_process_group("netreduce")`` backend, a 16-element parameter vector trained
by all-reduce, a checkpoint (rank 0's, shared file) to resume from at each restart —
torchrun restarts every worker when the membership changes. It stops, on every rank
at the same step, once the test creates $ELASTIC_OUT/stop. One line per step in
$ELASTIC_OUT/log-<pid>.jsonl: {rank, size, step, group}; {"final": w's bytes} last."""
import json
import os
import time

import torch
import torch.distributed as dist

import netreduce.torch  # noqa: F401  (registers the backend)

out = os.environ["ELASTIC_OUT"]
dist.init_process_group("netreduce")
rank, size = dist.get_rank(), dist.get_world_size()
checkpoint = os.path.join(out, "checkpoint.pt")
step, w = 0, torch.zeros(16, dtype=torch.float64)
if os.path.exists(checkpoint):
    saved = torch.load(checkpoint)
    step, w = saved["step"], saved["w"]
log = open(os.path.join(out, f"log-{os.getpid()}.jsonl"), "a")
while True:
    grad = torch.sin(torch.arange(16, dtype=torch.float64) + 0.1 * step + rank)
    stop = torch.tensor([float(os.path.exists(os.path.join(out, "stop")))])
    dist.all_reduce(grad)
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)
    w += grad / size
    step += 1
    if rank == 0:
        torch.save({"step": step, "w": w}, checkpoint + ".tmp")
        os.replace(checkpoint + ".tmp", checkpoint)
    log.write(json.dumps({"rank": rank, "size": size, "step": step,
                          "group": os.environ.get("GROUP_RANK"), "t": time.time()}) + "\n")
    log.flush()
    if stop.item():
        break
    time.sleep(0.05)
log.write(json.dumps({"final": w.numpy().tobytes().hex(), "rank": rank, "size": size}) + "\n")
log.close()
dist.destroy_process_group()
