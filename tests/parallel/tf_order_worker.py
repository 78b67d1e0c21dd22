"""One rank of test_tensorflow_launch.test_collectives_never_wait_for_an_inter_op_thread.

TensorFlow gets one inter-op thread (set before its runtime starts, hence a process
of its own). Each graph holds more independent collectives than that, built in an
order that differs by rank (even ranks forwards, odd ranks backwards), with nothing
ordering them: TensorFlow may run them in any order on each rank. A kernel that held
its thread until its collective completed (a blocking tf.numpy_function) would wait
for a peer that waits on another collective: the job would stall until netreduce's
timeout. Both graphs must complete, with exact results, twice.
"""
import numpy as np
import tensorflow as tf

tf.config.threading.set_inter_op_parallelism_threads(1)
tf.config.threading.set_intra_op_parallelism_threads(1)

import netreduce.tensorflow as hvd  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()
K = 6  # collectives per graph, > 1 inter-op thread


def in_rank_order(items):
    return list(items) if rank % 2 == 0 else list(reversed(items))


def build(tag, values):
    """K collectives of several kinds over ``values`` (K tensors), added to the
    current graph in this rank's order; returns them by index."""
    out = [None] * K
    for i in in_rank_order(range(K)):
        x, name = values[i], f"{tag}.{i}"
        kind = i % 4
        if kind == 0:
            out[i] = hvd.allreduce(x, op=hvd.Sum, name=name)
        elif kind == 1:
            out[i] = hvd.allgather(x, name=name)
        elif kind == 2:
            out[i] = hvd.broadcast(x, root_rank=size - 1, name=name)
        else:
            out[i] = hvd.alltoall(tf.tile(x, [size]), name=name)
    return out


def check(results, where):
    for i, got in enumerate(results):
        mine = lambda r: np.full([2], float(10 * i + r + 1), np.float32)  # noqa: E731
        kind = i % 4
        if kind == 0:
            want = sum(mine(r) for r in range(size))
        elif kind == 1:
            want = np.concatenate([mine(r) for r in range(size)])
        elif kind == 2:
            want = mine(size - 1)
        else:
            want = np.concatenate([mine(r) for r in range(size)])
        assert np.array_equal(np.asarray(got), want), (where, i, got, want)


inputs = [tf.fill([2], float(10 * i + rank + 1)) for i in range(K)]


@tf.function
def step(*values):
    return build("order.function", values)


for _ in range(2):
    check([t.numpy() for t in step(*inputs)], "tf.function")

graph = tf.Graph()
with graph.as_default():
    placeholders = [tf.constant(v.numpy()) for v in inputs]
    fetches = build("order.session", placeholders)
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1,
                                      intra_op_parallelism_threads=1)
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        for _ in range(2):
            check(session.run(fetches), "session")

hvd.barrier()
print(f"order worker: ok (rank {rank} of {size}, {K} collectives per graph)", flush=True)
