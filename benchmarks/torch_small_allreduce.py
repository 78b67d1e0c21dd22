"""A 4 KiB synchronous all-reduce through netreduce.torch (Horovod's API): the median
time per call over --iters calls after --warmup, on every rank of a job started with
netreduce-run; rank 0 prints one JSON line (ms per call, slowest rank's median, and the
process CPU per call).

    netreduce-run -np 2 python3 benchmarks/torch_small_allreduce.py --iters 2000
"""
import argparse
import json
import statistics
import time

import torch

import netreduce.torch as hvd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    hvd.init()
    x = torch.ones(1024)
    for _ in range(args.warmup):
        hvd.allreduce(x, name="g")
    meds, cpus = [], []
    for _ in range(args.repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(args.iters):
            hvd.allreduce(x, name="g")
        meds.append((time.perf_counter() - t0) / args.iters * 1e3)
        cpus.append((time.process_time() - c0) / args.iters * 1e6)
    slowest = hvd.allreduce(torch.tensor([statistics.median(meds)]), name="ms", op=hvd.Max)
    if hvd.rank() == 0:
        print(json.dumps({"ranks": hvd.size(), "ms_per_call": round(float(slowest[0]), 4),
                          "per_repeat_ms": [round(m, 4) for m in meds],
                          "cpu_us_per_call_rank0": round(statistics.median(cpus), 1)}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
