"""One worker of test_elastic_frameworks.py's Keras case: Horovod's elastic Keras
pattern (horovod's test/integration/data/elastic_tensorflow_keras_main.py) on Keras 3
under netreduce-run's elastic driver: a KerasState, the three elastic callbacks, the
learning rate rescaled on reset, ``model.fit`` inside ``hvd.elastic.run``.

Each rank writes $ELASTIC_OUT/<host>_<slot>.jsonl: {"pid"} at start, one line per
epoch end {epoch, rank, size, w: the weights' bytes, lr}, and {"final"} at the end.
ELASTIC_HOLD=2,5: after those epochs, wait until the driver's host update has reached
this worker (elastic_worker.py says why)."""
import os
import time

import keras
import numpy as np
import tensorflow as tf
from elastic_log import hold_for_update, start_record

import netreduce.tensorflow.keras as hvd

EPOCHS, BATCHES = int(os.environ.get("ELASTIC_EPOCHS", "8")), 5
HOLDS = {int(e) for e in os.environ.get("ELASTIC_HOLD", "").split(",") if e}
write = start_record()
hvd.init()
lr = 0.01
keras.utils.set_random_seed(hvd.rank())  # different starts: the sync must make them equal
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
model.compile(loss="sparse_categorical_crossentropy",
              optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr * hvd.size())))
rng = np.random.default_rng(7)
x = rng.standard_normal((32, 4)).astype(np.float32)
y = rng.integers(0, 3, 32)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8)

state = hvd.elastic.KerasState(model, batch=0, epoch=0)
state.register_reset_callbacks([lambda: model.optimizer.learning_rate.assign(lr * hvd.size())])


class Record(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        weights = b"".join(w.numpy().tobytes() for w in self.model.weights)
        write({"epoch": state.epoch, "rank": hvd.rank(), "size": hvd.size(),
               "w": weights.hex(), "lr": float(self.model.optimizer.learning_rate.numpy()),
               "t": time.time()})
        if state.epoch in HOLDS:
            hold_for_update()


callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
             hvd.elastic.CommitStateCallback(state), Record()]


@hvd.elastic.run
def train(state):
    state.model.fit(dataset, steps_per_epoch=BATCHES, epochs=EPOCHS - state.epoch,
                    callbacks=callbacks, verbose=0)


train(state)
write({"final": {"epoch": state.epoch, "rank": hvd.rank(), "size": hvd.size()}})
