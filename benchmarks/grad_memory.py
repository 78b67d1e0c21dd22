#!/usr/bin/env python3
"""resnet18 batch-1 training steps in one process, no communication: CPU and minor page
faults per step by how long the gradients' memory lives (issue 33, the hvd path's CPU).

    PYTHONPATH=benchmarks/overlap_site python3 benchmarks/grad_memory.py MODE STEPS WARMUP

    plain  torch's own: zero_grad() (set to None) frees every gradient before the forward
    copy   a post-accumulate hook copies each gradient into a buffer kept from step to
           step and drops autograd's (DDP's buckets' way)
    delay  zero_grad()'s gradients held until the next backward's first gradient hook
           (DistributedOptimizer.zero_grad in 0ec2bfd, reverted: BENCHMARKS.md, hvd57)

Run several at once (the testbed's 4 ranks share 2 cores), modes alternated; the
MALLOC_* tunables of BENCHMARKS.md's malloc section in the environment give the
no-trim reference. Prints one JSON line: CPU, system CPU and wall ms per step, minor
faults per step, and the parameters' sum (the same in every mode: same arithmetic)."""
import json
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F
from torchvision import models


def main() -> None:
    mode, steps, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = models.resnet18()
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    data = torch.randn(1, 3, 224, 224)
    target = torch.LongTensor(1).random_() % 1000
    kept, held = {}, []

    def copy_hook(p):
        buf = kept.get(p)
        if buf is None:
            kept[p] = buf = torch.empty_like(p.grad)
        buf.copy_(p.grad)
        p.grad = buf

    for p in params:
        if mode == "copy":
            p.register_post_accumulate_grad_hook(copy_hook)
        elif mode == "delay":
            p.register_post_accumulate_grad_hook(lambda p: held.clear())

    def step():
        if mode == "delay":
            held.extend(p.grad for p in params if p.grad is not None)
        opt.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        opt.step()

    for _ in range(warm):
        step()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    for _ in range(steps):
        step()
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    cpu = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / steps
    print(json.dumps({"mode": mode + ("%nt" if os.environ.get("MALLOC_TRIM_THRESHOLD_") else ""),
                      "cpu_ms": round(cpu * 1e3, 2),
                      "sys_ms": round((r1.ru_stime - r0.ru_stime) / steps * 1e3, 2),
                      "wall_ms": round((t1 - t0) / steps * 1e3, 2),
                      "minflt": round((r1.ru_minflt - r0.ru_minflt) / steps, 1),
                      "sum": float(sum(p.double().sum() for p in params))}))


if __name__ == "__main__":
    main()
