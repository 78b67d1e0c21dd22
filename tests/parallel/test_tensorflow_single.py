"""netreduce.tensorflow in one process (size 1, the embedded aggregator): a TF1 graph
may be built before hvd.init(), as with Horovod, and runs once init() has been called."""
import importlib.util
import os
import subprocess
import sys

import pytest

from netreduce.environment import discover

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                       reason="tensorflow is not importable"),
    pytest.mark.skipif(discover().size > 1, reason="already running under a launcher"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = """
import numpy as np
import tensorflow as tf
import netreduce.tensorflow as hvd

graph = tf.Graph()
with graph.as_default():
    v = tf.Variable(np.full([2], 3.0, np.float32))
    x = tf.constant(np.arange(4, dtype=np.float32).reshape(2, 2))
    ops = [hvd.broadcast_global_variables(0), hvd.allreduce(x, op=hvd.Sum), hvd.allgather(x),
           hvd.alltoall(x), hvd.reducescatter(x, op=hvd.Sum), hvd.broadcast(x, 0)]
    hvd.init()
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        _, *values = session.run(ops)
for value in values:
    assert np.array_equal(value, np.arange(4).reshape(2, 2)), value
print("SINGLE OK")
"""


def test_graph_built_before_init_runs_after_it():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "SINGLE OK" in proc.stdout, proc.stdout[-3000:]
