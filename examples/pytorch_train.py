"""Train a small CNN data-parallel with netreduce's Horovod-compatible API.

    netreduce-run -np 4 python examples/pytorch_train.py

The same script runs on Horovod when the import line below is swapped:

    import horovod.torch as hvd
    horovodrun -np 4 -H localhost:4 --gloo python examples/pytorch_train.py

The data is generated (no download): 16x16 grey images of four classes, a bright
square in one of the four quadrants, on noise. Every rank trains on its own shard;
at the end the script checks that the loss fell and that every rank holds exactly
the same weights, and exits non-zero otherwise.
"""
import argparse
import hashlib
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import netreduce.torch as hvd  # <- the one line a Horovod user changes


class Net(nn.Module):
    def __init__(self, classes: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def make_data(samples: int, seed: int = 0):
    """Images (samples, 1, 16, 16) and labels: label k = bright square in quadrant k."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (samples,), generator=gen)
    images = torch.randn(samples, 1, 16, 16, generator=gen)
    offsets = torch.randint(0, 4, (samples, 2), generator=gen)
    for i in range(samples):
        row = (labels[i] // 2) * 8 + offsets[i, 0]
        col = (labels[i] % 2) * 8 + offsets[i, 1]
        images[i, 0, row:row + 4, col:col + 4] += 0.8
    return images, labels


def weights_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for tensor in model.state_dict().values():
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.01, help="per rank; scaled by size")
    parser.add_argument("--samples", type=int, default=4096, help="whole data set")
    parser.add_argument("--fp16-allreduce", action="store_true")
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(1234 + hvd.rank())  # different initial weights: broadcast fixes them

    images, labels = make_data(args.samples)
    shard = slice(hvd.rank(), None, hvd.size())
    images, labels = images[shard], labels[shard]

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

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
        # average the epoch's loss over ranks (a metric, so a named all-reduce)
        epoch_loss = hvd.allreduce(torch.tensor(total / batches), name="epoch_loss").item()
        losses.append(epoch_loss)
        if hvd.rank() == 0:
            print(f"epoch {epoch}: loss {epoch_loss:.4f}", flush=True)

    with torch.no_grad():
        accuracy = (model(images).argmax(1) == labels).float().mean()
    accuracy = hvd.allreduce(accuracy, name="accuracy").item()
    digests = hvd.allgather_object(weights_digest(model))
    identical = len(set(digests)) == 1
    fell = losses[-1] < losses[0]
    if hvd.rank() == 0:
        print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} ({'fell' if fell else 'DID NOT FALL'}), "
              f"accuracy {accuracy:.3f}; weights identical on all {hvd.size()} ranks: "
              f"{identical} ({digests[0][:16]})", flush=True)
    hvd.shutdown()
    return 0 if identical and fell else 1


if __name__ == "__main__":
    sys.exit(main())
