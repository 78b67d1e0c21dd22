"""One worker of test_elastic_frameworks.py's MXNet case (run with MXNet's own venv):
a Gluon net trained with DistributedTrainer (SGD with momentum) inside
``hvd.elastic.run``, its MXNetState committed every step.

Writes $ELASTIC_OUT/<host>_<slot>.jsonl: {"pid"} at start, one line per step {epoch,
rank, size, step, t}, and {"final"} with the parameters' and the trainer's momentum's
bytes (equal on every survivor if the state was synced and every step averaged)."""
import os
import time

import mxnet as mx
import numpy as np
from elastic_log import start_record

import netreduce.mxnet as hvd
from netreduce import config

STEPS = int(os.environ.get("ELASTIC_STEPS", "40"))
write = start_record()
hvd.init()
mx.random.seed(hvd.rank())  # different starts: the sync must make them equal
net = mx.gluon.nn.Dense(3, in_units=4)
net.initialize(mx.init.Normal(1.0))
trainer = hvd.DistributedTrainer(net.collect_params(), "sgd",
                                 {"learning_rate": 0.05, "momentum": 0.9})
loss_fn = mx.gluon.loss.L2Loss()
state = hvd.elastic.MXNetState(net, trainer, step=0)


@hvd.elastic.run
def train(state):
    while state.step < STEPS:
        rng = np.random.default_rng(1000 * state.step + hvd.rank())
        x = mx.nd.array(rng.standard_normal((8, 4)))
        y = mx.nd.array(rng.standard_normal((8, 3)))
        with mx.autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(8)
        state.step += 1
        write({"epoch": config.get("NETREDUCE_EPOCH"), "rank": hvd.rank(), "size": hvd.size(),
               "step": state.step, "t": time.time()})
        time.sleep(float(os.environ.get("ELASTIC_PAUSE", "0.05")))
        state.commit()


train(state)
params = b"".join(p.data().asnumpy().tobytes() for _, p in sorted(net.collect_params().items()))
momentum = b"".join(s.asnumpy().tobytes() for _, s in sorted(trainer._updaters[0].states.items()))
write({"final": {"w": params.hex(), "momentum": momentum.hex(), "rank": hvd.rank(),
                 "size": hvd.size(), "step": state.step}})
