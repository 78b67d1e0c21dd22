"""The CNN of pytorch_train.py trained with DistributedDataParallel on netreduce.

    netreduce-run -np 4 python examples/pytorch_ddp.py                  # "netreduce" backend
    netreduce-run -np 4 python examples/pytorch_ddp.py --backend gloo --hook
                                          # gloo group, gradients through allreduce_hook
    netreduce-run -np 4 python examples/pytorch_ddp.py --overlap
                                          # each gradient sent as backward makes it
    torchrun --nproc-per-node 4 examples/pytorch_ddp.py   # with NETREDUCE_SWITCH=host:port

For a DDP user the change is the backend name in init_process_group; importing
netreduce.torch is what registers it. Exits non-zero unless the loss fell and every
rank ends with identical weights.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import netreduce.torch as nrt  # registers the "netreduce" backend
from pytorch_train import Net, make_data, weights_digest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="netreduce", choices=["netreduce", "gloo"])
    parser.add_argument("--hook", action="store_true",
                        help="register netreduce.torch.allreduce_hook on the DDP model")
    parser.add_argument("--overlap", action="store_true",
                        help="netreduce.torch.ddp_overlap(model): each gradient's "
                        "all-reduce starts as backward produces it (on the netreduce "
                        "backend DDP does this by default; with gloo, this call adds it)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.01, help="per rank; scaled by size")
    parser.add_argument("--samples", type=int, default=4096)
    args = parser.parse_args()

    # torchrun exports MASTER_ADDR/PORT; under netreduce-run without them, rank 0
    # opens the TCPStore and netreduce tells the others where ("netreduce://").
    init = "env://" if "MASTER_ADDR" in os.environ else "netreduce://"
    dist.init_process_group(args.backend, init_method=init)
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(1234)  # DDP also broadcasts rank 0's weights at construction

    images, labels = make_data(args.samples)
    images, labels = images[rank::size], labels[rank::size]
    model = DDP(Net())
    if args.hook:
        model.register_comm_hook(None, nrt.allreduce_hook)
    elif args.overlap:
        nrt.ddp_overlap(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)

    losses = []
    for epoch in range(args.epochs):
        perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(epoch))
        total, batches = 0.0, 0
        for start in range(0, len(labels), args.batch_size):
            idx = perm[start:start + args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images[idx]), labels[idx])
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        epoch_loss = torch.tensor(total / batches)
        dist.all_reduce(epoch_loss, op=dist.ReduceOp.AVG if args.backend == "netreduce"
                        else dist.ReduceOp.SUM)
        if args.backend != "netreduce":
            epoch_loss /= size
        losses.append(epoch_loss.item())
        if rank == 0:
            print(f"epoch {epoch}: loss {losses[-1]:.4f}", flush=True)

    digests = [None] * size
    dist.all_gather_object(digests, weights_digest(model.module))
    identical = len(set(digests)) == 1
    fell = losses[-1] < losses[0]
    if rank == 0:
        how = args.backend + (" + allreduce_hook" if args.hook else "") + \
            (" + ddp_overlap" if args.overlap and not args.hook else "")
        print(f"[{how}] loss {losses[0]:.4f} -> {losses[-1]:.4f} "
              f"({'fell' if fell else 'DID NOT FALL'}); weights identical on all {size} ranks: "
              f"{identical} ({digests[0][:16]})", flush=True)
    dist.destroy_process_group()
    return 0 if identical and fell else 1


if __name__ == "__main__":
    sys.exit(main())
