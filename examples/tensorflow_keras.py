"""Train a small Keras 3 CNN data-parallel on netreduce, both ways TensorFlow users
distribute:

    netreduce-run -np 4 python examples/tensorflow_keras.py

1. the Horovod way: ``DistributedOptimizer`` + ``BroadcastGlobalVariablesCallback`` +
   ``MetricAverageCallback`` under plain ``model.fit``, each rank on its own shard;
2. the tf.distribute way: ``netreduce.tensorflow.Strategy()`` and ``fit`` inside its
   scope, every rank given the same data set (the strategy splits each global batch).

The data is generated (no download): 16x16 grey images of four classes, a bright
square in one of the four quadrants, on noise. After each run the script checks that
the loss fell and that every rank holds exactly the same weights, and exits non-zero
otherwise.
"""
import argparse
import contextlib
import hashlib
import os
import re
import sys
import tempfile


@contextlib.contextmanager
def tensorflow_start_up_quieted():
    """TensorFlow's C++ side logs its start-up to stderr at INFO and WARNING (oneDNN,
    CPU features, dataset notes): most of an example's output, none of it news.
    TF_CPP_MIN_LOG_LEVEL (2 unless set: errors only) quiets those from here on; the
    oneDNN notice at import ignores it, so stderr is caught during the import and
    passed on but for TensorFlow's lines below that level. TF_CPP_MIN_LOG_LEVEL=0
    shows them all."""
    level = int(os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2") or 0)
    if level <= 0:
        yield
        return
    below = "I" if level == 1 else "IW"
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            for line in caught.read().decode(errors="replace").splitlines(keepends=True):
                if not re.match(rf"[{below}]\d{{4}} |WARNING: All log messages before absl::",
                                line):
                    sys.stderr.write(line)


with tensorflow_start_up_quieted():
    import keras
    import numpy as np

    import netreduce.tensorflow as nrtf
    import netreduce.tensorflow.keras as hvd  # <- was: import horovod.tensorflow.keras as hvd


def make_data(samples: int, seed: int = 0):
    """Images (samples, 16, 16, 1) and labels: label k = bright square in quadrant k."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, samples)
    images = rng.normal(size=(samples, 16, 16, 1)).astype("float32")
    offsets = rng.integers(0, 4, (samples, 2))
    for i, label in enumerate(labels):
        row, col = (label // 2) * 8 + offsets[i, 0], (label % 2) * 8 + offsets[i, 1]
        images[i, row:row + 4, col:col + 4, 0] += 0.8
    return images, labels


def make_model() -> keras.Model:
    return keras.Sequential([
        keras.Input((16, 16, 1)),
        keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(4),
    ])


def digest(model: keras.Model) -> str:
    h = hashlib.sha256()
    for w in model.weights:
        h.update(np.ascontiguousarray(w.numpy()).tobytes())
    return h.hexdigest()


def check(label: str, model: keras.Model, losses) -> bool:
    digests = hvd.allgather_object(digest(model))
    same, fell = len(set(digests)) == 1, losses[-1] < losses[0]
    if hvd.rank() == 0:
        print(f"{label}: loss {' -> '.join(f'{l:.3f}' for l in losses)}; "
              f"weights identical on all {hvd.size()} ranks: {same}", flush=True)
    return same and fell


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--samples", type=int, default=2048)
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x, y = make_data(args.samples)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    keras.utils.set_random_seed(rank)  # different initial weights: the callback syncs them

    # 1. Horovod way: wrap the optimizer, scale the learning rate by the world size.
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.02 * size,
                                                                          momentum=0.9)),
                  loss=loss, metrics=["accuracy"])
    history = model.fit(x[rank::size], y[rank::size], batch_size=args.batch_size,
                        epochs=args.epochs, verbose=0,
                        callbacks=[hvd.BroadcastGlobalVariablesCallback(0),
                                   hvd.MetricAverageCallback()])
    ok = check("DistributedOptimizer", model, history.history["loss"])

    # 2. tf.distribute way: the same model inside the strategy's scope.
    strategy = nrtf.Strategy()
    with strategy.scope():
        model = make_model()
        model.compile(optimizer=keras.optimizers.SGD(0.02 * size, momentum=0.9),
                      loss=loss, metrics=["accuracy"])
    nrtf.broadcast_variables(model.variables, root_rank=0)
    history = model.fit(x, y, batch_size=args.batch_size * size,  # the global batch
                        epochs=args.epochs, verbose=0)
    ok = check("Strategy", model, history.history["loss"]) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
