"""One worker of benchmarks/elastic.py: resnet18 (torchvision's, 46.8 MB of float32
gradients) trained on a fixed random batch with Horovod's torch API — netreduce.torch
or horovod.torch (ELASTIC_IMPL) — under ``hvd.elastic.run`` with a TorchState
committed every ELASTIC_COMMIT steps, or (ELASTIC_MODE=static) a plain loop.

Every worker appends one line per step to $ELASTIC_OUT/<pid>.jsonl: {step, size, rank,
t0, t1} (wall clock at the step's start and end), and {"pid", "host"} first.
Knobs: ELASTIC_STEPS (total), ELASTIC_BATCH (8), ELASTIC_IMAGE (64 px),
ELASTIC_COMMIT (1)."""
import importlib
import json
import os
import socket
import sys
import time

import torch
import torch.nn.functional as F

IMPL = os.environ.get("ELASTIC_IMPL", "netreduce")
hvd = importlib.import_module("netreduce.torch" if IMPL == "netreduce" else "horovod.torch")


def resnet18():
    """torchvision's resnet18; its CUDA wheel's ops do not load beside the CPU torch,
    and the models need none: declare the two op schemas its import registers fake
    kernels for (shared/research/torchvision.md). Without torchvision, the same
    layout from benchmarks/train_rank.py."""
    try:
        import torchvision  # noqa: F401
    except RuntimeError:
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        lib = torch.library.Library("torchvision", "FRAGMENT")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor qdets, Tensor qscores, float iou_threshold) -> Tensor")
        resnet18.keep = lib  # the library object must outlive the import
    except ImportError:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from train_rank import build_model
        return build_model("resnet18"), "benchmarks/train_rank.py resnet18"
    from torchvision import models
    return models.resnet18(), "torchvision resnet18"


def main() -> None:
    out = os.environ["ELASTIC_OUT"]
    steps = int(os.environ.get("ELASTIC_STEPS", "20"))
    batch = int(os.environ.get("ELASTIC_BATCH", "8"))
    image = int(os.environ.get("ELASTIC_IMAGE", "64"))
    commit_every = int(os.environ.get("ELASTIC_COMMIT", "1"))
    static = os.environ.get("ELASTIC_MODE") == "static"
    log = open(os.path.join(out, f"{os.getpid()}.jsonl"), "a")

    def write(record):
        log.write(json.dumps(record) + "\n")
        log.flush()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, which = resnet18()
    write({"pid": os.getpid(), "host": socket.gethostname(), "model": which,
           "grad_bytes": 4 * sum(p.numel() for p in model.parameters())})
    hvd.init()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001 * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    gen = torch.Generator().manual_seed(1)
    data = torch.randn(batch, 3, image, image, generator=gen)
    target = torch.randint(0, 1000, (batch,), generator=gen)

    def step(n):
        t0 = time.time()
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
        write({"step": n, "size": hvd.size(), "rank": hvd.rank(), "t0": t0, "t1": time.time()})

    if static:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        for n in range(1, steps + 1):
            step(n)
        return

    state = hvd.elastic.TorchState(model, optimizer, step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            step(state.step + 1)
            state.step += 1
            if state.step % commit_every == 0:
                state.commit()

    train(state)


if __name__ == "__main__":
    main()
