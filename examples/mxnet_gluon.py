"""Train a small gluon CNN data-parallel through kvstore="netreduce".

    netreduce-run -np 4 ~/.cache/netreduce/venv-mxnet/bin/python examples/mxnet_gluon.py

(mxnet 1.9.1 needs numpy < 1.24: scripts/env_mxnet.sh makes that venv; any python
with mxnet and netreduce installed will do.) The only netreduce lines are the import,
which registers the store, and ``kvstore="netreduce"``; a dist_sync script changes
its kvstore string and nothing else. The store sums gradients over workers, as
dist_sync does, so ``trainer.step`` gets the global batch.

``--trainer horovod`` runs the same model through ``netreduce.mxnet`` as a Horovod user
would (``DistributedTrainer``, which averages, so ``step`` gets the local batch).

The data is generated (no download): 16x16 grey images of four classes, a bright
square in one of the four quadrants, on noise. Every rank trains on its own shard; at
the end the script checks that the loss fell and that every rank holds exactly the
same weights, and exits non-zero otherwise.
"""
import argparse
import hashlib
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import netreduce.mxnet as hvd  # registers kvstore="netreduce"


def make_data(samples: int, seed: int = 0):
    """Images (samples, 1, 16, 16) and labels: label k = bright square in quadrant k."""
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, 4, samples)
    images = rng.randn(samples, 1, 16, 16).astype(np.float32)
    offsets = rng.randint(0, 4, (samples, 2))
    for i in range(samples):
        row = (labels[i] // 2) * 8 + offsets[i, 0]
        col = (labels[i] % 2) * 8 + offsets[i, 1]
        images[i, 0, row:row + 4, col:col + 4] += 0.8
    return images, labels.astype(np.float32)


def build_net() -> gluon.nn.HybridSequential:
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(8, 3, padding=1, activation="relu"), gluon.nn.MaxPool2D(2),
            gluon.nn.Conv2D(16, 3, padding=1, activation="relu"), gluon.nn.MaxPool2D(2),
            gluon.nn.Dense(64, activation="relu"), gluon.nn.Dense(4))
    return net


def weights_digest(net) -> str:
    h = hashlib.sha256()
    for name, param in sorted(net.collect_params().items()):
        h.update(param.data().asnumpy().tobytes())
    return h.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--samples", type=int, default=4096, help="whole data set")
    parser.add_argument("--trainer", choices=["kvstore", "horovod"], default="kvstore")
    args = parser.parse_args()

    if args.trainer == "kvstore":
        kv = mx.kv.create("netreduce")  # or pass the string kvstore="netreduce" below
        rank, size = kv.rank, kv.num_workers
    else:
        hvd.init()
        rank, size = hvd.rank(), hvd.size()

    images, labels = make_data(args.samples)
    images, labels = images[rank::size], labels[rank::size]

    mx.random.seed(1234 + rank)  # different initial weights: the trainer syncs them
    net = build_net()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, 1, 16, 16)))  # finish deferred initialisation
    opt = {"learning_rate": args.lr, "momentum": 0.9}
    if args.trainer == "kvstore":
        # The Trainer broadcasts rank 0's parameters through the store on its first step.
        trainer = gluon.Trainer(net.collect_params(), "sgd", opt, kvstore="netreduce")
        step_batch = args.batch_size * size  # the store sums: normalise by the global batch
    else:
        hvd.broadcast_parameters(net.collect_params(), root_rank=0)
        trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", opt)
        step_batch = args.batch_size  # DistributedTrainer averages

    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    losses = []
    for epoch in range(args.epochs):
        perm = np.random.RandomState(epoch).permutation(len(labels))
        total, batches = 0.0, 0
        for start in range(0, len(labels) - args.batch_size + 1, args.batch_size):
            idx = perm[start:start + args.batch_size]
            x, y = mx.nd.array(images[idx]), mx.nd.array(labels[idx])
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(step_batch)
            total, batches = total + float(loss.mean().asscalar()), batches + 1
        # the epoch's loss averaged over ranks (a metric: a named all-reduce)
        epoch_loss = float(hvd.allreduce(mx.nd.array([total / batches]),
                                         name="epoch_loss").asscalar())
        losses.append(epoch_loss)
        if rank == 0:
            print(f"epoch {epoch}: loss {epoch_loss:.4f}", flush=True)

    predictions = net(mx.nd.array(images)).argmax(axis=1).asnumpy()
    accuracy = float(hvd.allreduce(mx.nd.array([np.mean(predictions == labels)]),
                                   name="accuracy").asscalar())
    digests = hvd.allgather_object(weights_digest(net))
    identical = len(set(digests)) == 1
    fell = losses[-1] < losses[0]
    if rank == 0:
        print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} ({'fell' if fell else 'DID NOT FALL'}), "
              f"accuracy {accuracy:.3f}; weights identical on all {size} ranks: "
              f"{identical} ({digests[0][:16]})", flush=True)
    hvd.shutdown()
    return 0 if identical and fell else 1


if __name__ == "__main__":
    sys.exit(main())
