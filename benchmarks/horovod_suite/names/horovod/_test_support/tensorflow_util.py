"""horovod.tensorflow.util._executing_eagerly, which Horovod's TensorFlow tests import
to choose between eager evaluation and a Session (test plumbing, not API under test)."""
import tensorflow as tf


def _executing_eagerly() -> bool:
    return tf.executing_eagerly()
