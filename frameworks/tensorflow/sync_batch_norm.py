"""SyncBatchNormalization (horovod.tensorflow.SyncBatchNormalization) on Keras 3: batch
statistics over the global batch, every rank's samples together."""
from __future__ import annotations

import keras
import tensorflow as tf

from .mpi_ops import Sum, global_process_set, grouped_allreduce


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """BatchNormalization whose training-time mean and variance are those of the
    global batch: each rank's sum, sum of squares and count along the reduced axes
    are all-reduced as one group (differentiable: the gradient flows back through the
    all-reduce to every rank's samples). Inference uses the moving statistics, which
    therefore agree on every rank."""

    def __init__(self, *args, process_set=global_process_set, **kwargs):
        super().__init__(*args, **kwargs)
        self._nr_process_set = process_set

    def _moments(self, inputs, mask):
        x = tf.convert_to_tensor(inputs)  # call() has cast 16-bit inputs to float32
        axes = self._reduction_axes
        if mask is None:
            weights = tf.ones_like(x)
        else:
            weights = tf.broadcast_to(tf.cast(tf.expand_dims(mask, -1), x.dtype), tf.shape(x))
        total, squares, count = grouped_allreduce(
            [tf.reduce_sum(x * weights, axes, keepdims=True),
             tf.reduce_sum(tf.square(x) * weights, axes, keepdims=True),
             tf.reduce_sum(weights, axes, keepdims=True)],
            op=Sum, process_set=self._nr_process_set)
        count = tf.maximum(count, keras.backend.epsilon())
        mean = total / count
        variance = tf.maximum(squares / count - tf.square(mean), 0.0)
        return tf.squeeze(mean, axes), tf.squeeze(variance, axes)
