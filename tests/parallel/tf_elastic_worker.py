"""One rank of test_tensorflow_launch.test_elastic_run_survives_an_aggregator_restart.

A training loop under ``hvd.elastic.run``: every step all-reduces a gradient inside
a tf.function (the graph op), updates the weights and commits. After the commit of
step BREAK_AT rank 0 creates the marker file; the test then kills the aggregator
(SIGKILL), starts a new one on the same port and creates the second marker, which
the ranks wait for before their next step. That step fails on every rank, the
state rolls back to the last commit, the ranks rejoin the new aggregator, sync from
rank 0 and go on. The end result must be the uninterrupted run's, exactly.
"""
import os
import sys
import time

import numpy as np
import tensorflow as tf

import netreduce.tensorflow as hvd

STEPS, BREAK_AT = 12, 5
marker, restarted = sys.argv[1], sys.argv[2]

hvd.init()
rank, size = hvd.rank(), hvd.size()
weights = tf.Variable(np.zeros(8, np.float32))
resets = []


@tf.function
def gradient(step):
    # the same on every rank once averaged: rank r contributes (r + 1) * (step + 1)
    local = tf.fill([8], tf.cast((rank + 1) * (step + 1), tf.float32))
    return hvd.allreduce(local, name="elastic.grad")


@hvd.elastic.run
def train(state):
    while state.step < STEPS:
        g = gradient(tf.constant(state.step))
        weights.assign_sub(0.5 * g)
        state.step += 1
        state.commit()
        if state.step == BREAK_AT and rank == 0 and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write("committed\n")
        if state.step == BREAK_AT and not resets:
            deadline = time.monotonic() + 120
            while not os.path.exists(restarted) and time.monotonic() < deadline:
                time.sleep(0.1)
    return state.step


state = hvd.elastic.TensorFlowState([weights], step=0)
state.register_reset_callbacks([lambda: resets.append(time.monotonic())])
assert train(state) == STEPS
mean = sum(r + 1 for r in range(size)) / size
want = -0.5 * mean * sum(s + 1 for s in range(STEPS))
assert np.allclose(weights.numpy(), want), (weights.numpy(), want)
assert len(resets) == 1, resets
print(f"elastic worker: ok (rank {rank}, {len(resets)} reset, weights {weights.numpy()[0]})",
      flush=True)
