"""The hvd step's Python per gradient, without the model's compute (issue 33): the
DistributedOptimizer's own hooks, fired in backward order over resnet18's 62
parameters (their shapes, gradients preset), then ``synchronize()``; per step, the
main thread's CPU in the hooks (``time.thread_time``: what the hook chain costs the
thread that runs backward), the wait in synchronize, and the process's CPU (every
thread: executor, landing, engine). Rank 0 prints one JSON line (medians over the
steps); every rank checks the averaged gradients against the exact value.

    netreduce-run -np 2 python3 benchmarks/hook_chain.py --steps 200
    # another checkout's netreduce.torch: PYTHONPATH=benchmarks/overlap_site:DIR
"""
import argparse
import json
import os
import statistics
import threading
import time

import torch

import netreduce.torch as hvd
from common import proc_stat  # this checkout's (benchmarks/ is sys.path[0])
from netreduce.worker import context


def shapes(small: bool):
    if small:
        return [(f"p{i}", (256,)) for i in range(62)]
    from torchvision import models
    return [(n, tuple(p.shape)) for n, p in models.resnet18().named_parameters()]


def threads_cpu() -> dict:
    """CPU seconds (utime + stime) of this process's threads, summed by thread name
    (the main thread apart: it also fills and checks the gradients, outside the
    measured window of proc_cpu_ms_per_step)."""
    out: dict = {}
    named = {t.native_id: t.name for t in threading.enumerate()}  # Python's own names
    for stat in proc_stat.threads():
        name = "main" if stat.pid == os.getpid() else named.get(stat.pid) or stat.comm
        out[name] = out.get(name, 0.0) + stat.cpu_seconds
    return out


def _help_wakes(agreement):
    """Wake-ups the waits put on the executor's queue so far; None: a tree that does not
    count them. The count lives on the agreement's ExecutorWakes (executor_wakes.py),
    on the Agreement itself in older trees."""
    return getattr(getattr(agreement, "wakes", agreement), "help_wakes", None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--small", action="store_true", help="62 tensors of 1 KiB instead")
    ap.add_argument("--compute-ms", type=float, default=0.0,
                    help="before each hook, about this long of torch compute (a matmul, the "
                         "GIL released), as backward's between two gradients: the hooks then "
                         "find the executor idle or inside a round as in the training step")
    args = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    params = [(n, torch.nn.Parameter(torch.zeros(s))) for n, s in shapes(args.small)]
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=0.0),
                                   named_parameters=params)
    hooks = [(p, opt._make_hook(p)) for _, p in reversed(params)]  # backward order
    fills = [torch.full_like(p, float(rank + 1)) for _, p in reversed(params)]
    want = sum(range(1, size + 1)) / size
    mats = reps = None
    if args.compute_ms > 0:
        mats = torch.rand(128, 128), torch.rand(128, 128)
        t = time.perf_counter()
        for _ in range(200):
            torch.mm(*mats)
        reps = max(1, round(args.compute_ms / ((time.perf_counter() - t) / 200 * 1e3)))
    hook_us, sync_ms, cpu_ms, wall_ms, sync_cpu = [], [], [], [], []
    prof = None
    if os.environ.get("HOOK_PROFILE") and rank == 0:
        import cProfile
        prof = cProfile.Profile()
    for step in range(args.warmup + args.steps):
        if prof is not None and step == args.warmup:
            prof.enable()
        if step == args.warmup:
            cpu0 = threads_cpu()
            ag = getattr(getattr(context.comm(), "agreement", None), "rounds", 0)
            wakes = _help_wakes(getattr(context.comm(), "agreement", None)) or 0
        for (p, _), f in zip(hooks, fills):
            p.grad = f.clone()
        c0, w0 = time.process_time(), time.perf_counter()
        h = 0.0
        for p, hook in hooks:
            if mats is not None:
                for _ in range(reps):
                    torch.mm(*mats)
            t = time.thread_time()
            hook(p)
            h += time.thread_time() - t
        s0, sc = time.perf_counter(), time.thread_time()
        opt.synchronize()
        s1 = time.perf_counter()
        sc = time.thread_time() - sc
        c1 = time.process_time()
        for p, _ in hooks:
            if not bool((p.grad == want).all()):
                raise SystemExit(f"rank {rank}: step {step}: wrong average in a gradient")
        if step >= args.warmup:
            hook_us.append(h / len(hooks) * 1e6)
            sync_ms.append((s1 - s0) * 1e3)
            sync_cpu.append(sc / len(hooks) * 1e6)
            cpu_ms.append((c1 - c0) * 1e3)
            wall_ms.append((s1 - w0) * 1e3)
    cpu1 = threads_cpu()
    threads = {k: round((v - cpu0.get(k, 0.0)) / args.steps * 1e3, 3) for k, v in cpu1.items()
               if v - cpu0.get(k, 0.0) > 0}
    agreement = getattr(context.comm(), "agreement", None)
    rounds = round(((agreement.rounds if agreement else 0) - ag) / args.steps, 2)
    # wake-ups the waits put on the executor's queue (None: a tree that does not count them)
    help_wakes = _help_wakes(agreement)
    if help_wakes is not None:
        help_wakes = round((help_wakes - wakes) / args.steps, 2)
    if prof is not None:
        prof.disable()
        prof.dump_stats(os.environ["HOOK_PROFILE"])
    med = {k: round(statistics.median(v), 2) for k, v in
           (("hook_cpu_us", hook_us), ("sync_cpu_us", sync_cpu), ("sync_ms", sync_ms), ("proc_cpu_ms_per_step", cpu_ms),
            ("step_ms", wall_ms))}
    if rank == 0:
        import netreduce
        print(json.dumps(dict(med, thread_cpu_ms_per_step=threads, messages_per_step=rounds,
                              help_wakes_per_step=help_wakes,
                              ranks=size, tensors=len(hooks), steps=args.steps,
                              small=args.small, tree=os.path.dirname(os.path.dirname(
                                  netreduce.__file__)),
                              torch_tree=os.path.dirname(hvd.__file__),
                              load=list(os.getloadavg()))), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
