"""tf.distribute.CrossDeviceOps that reduces across worker processes through netreduce.

Each worker process runs its own MirroredStrategy over its local devices (one CPU or
GPU per process, as launchers start them). A reduction first sums the local replicas'
values on the first local device, then all-reduces the local sums of a whole batch
(a step's gradients) across processes as one grouped netreduce submission, then
mirrors the result onto the destinations.

SUM and MEAN keep the meaning they have for the strategy in use. With R the strategy's
``num_replicas_in_sync``, L the local replicas and N the processes:
MEAN is the mean over all N·L replicas, and SUM is R times that mean. Under
netreduce.tensorflow.Strategy() R = N·L, so SUM is the plain global sum (what
MultiWorkerMirroredStrategy gives). Under a plain MirroredStrategy R = L (it counts
only local replicas, and Keras divides the loss by that), so SUM averages over the
processes: Keras's summed gradient is then the single-process gradient of the global
batch, not N times it. Min and Max have no tf.distribute ReduceOp.

TF's CrossDeviceOps.reduce/batch_reduce skip the implementation when they believe
there is one worker and one value; ``_num_between_graph_workers`` reports N so that a
one-device process still reduces across processes.
"""
from __future__ import annotations

from typing import Any, List, Optional

import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops as _cdo
from tensorflow.python.distribute import reduce_util

import netreduce as _nr
from netreduce.errors import InvalidArgumentError

from .gradient_tape import buckets, fusion_limit
from .mpi_ops import Sum, _reduce, global_process_set, size


def _local_sum(per_replica: Any, device: str) -> tf.Tensor:
    parts = []
    for v in per_replica.values:
        if isinstance(v, tf.IndexedSlices):
            v = tf.convert_to_tensor(v)  # cross-process: dense (see docs/tensorflow.md)
        parts.append(tf.convert_to_tensor(v))
    with tf.device(device):
        return parts[0] if len(parts) == 1 else tf.math.add_n(parts)


class CrossDeviceOps(tf.distribute.CrossDeviceOps):
    """Cross-process reductions for tf.distribute.MirroredStrategy over netreduce.
    Creating one joins the netreduce job (netreduce.init(); a no-op if done)."""

    def __init__(self, name: Optional[str] = None) -> None:
        super().__init__()
        _nr.init()
        self._nr_name = name
        self._nr_owner = None  # the netreduce Strategy using these ops, if any

    @property
    def _num_between_graph_workers(self) -> int:
        return size()

    def _replicas_counted(self, local: int) -> int:
        strategy = self._nr_owner or tf.distribute.get_strategy()
        return int(getattr(strategy, "num_replicas_in_sync", local) or local)

    def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
        return self.batch_reduce_implementation(
            reduce_op, [(per_replica_value, destinations)], options)[0]

    def batch_reduce_implementation(self, reduce_op, value_destination_pairs,
                                    options) -> List[Any]:
        if not value_destination_pairs:
            return []
        pairs = [(_cdo._make_tensor_into_per_replica(v), d) for v, d in value_destination_pairs]
        local = len(pairs[0][0].values)
        devices = [_cdo.get_devices_from(d if _cdo.check_destinations(d) else v,
                                         self._canonicalize_devices)[0] for v, d in pairs]
        sums = [_local_sum(v, dev) for (v, _), dev in zip(pairs, devices)]
        n = size()
        if reduce_op == reduce_util.ReduceOp.MEAN:
            factor = 1.0 / (n * local)
        elif reduce_op == reduce_util.ReduceOp.SUM:
            factor = self._replicas_counted(local) / float(n * local)
        else:
            raise InvalidArgumentError(f"netreduce CrossDeviceOps: unsupported reduce op {reduce_op}")
        reduced: List[Any] = [None] * len(sums)
        # fusion-buffer-sized groups in backprop order, as for DistributedGradientTape
        for k, bucket in enumerate(buckets(dict(enumerate(sums)), fusion_limit())):
            part = [sums[i] for i in bucket]
            name = None if self._nr_name is None else f"{self._nr_name}.b{k}"
            with tf.device(devices[0]):
                out = _reduce(part, name, Sum, 1.0, factor, "cross_device", global_process_set)
            for i, r in zip(bucket, out):
                reduced[i] = r
        return [self.broadcast(r, d) for r, (_, d) in zip(reduced, pairs)]
