"""netreduce.tensorflow.Strategy: a MirroredStrategy that spans every worker process.

A plain ``MirroredStrategy(cross_device_ops=CrossDeviceOps())`` only sends some of its
reductions to the given ops: TF 2.21 reduces int32 values with ReductionToOneDevice
whatever ops it was given, and ``strategy.reduce`` to a CPU destination (every value on a
CPU-only host) goes to ReductionToOneDevice too — both stay inside the process. It also
counts only local replicas, so datasets are not split between processes.

This strategy fixes those in the one place they are decided (the strategy's extended
object), the way MultiWorkerMirroredStrategy does for its collectives:

* ``num_replicas_in_sync`` counts every process's replicas (N·L), so Keras divides the
  loss by the global replica count and a SUM of gradients is their global sum;
* every reduction (``strategy.reduce``, ``ReplicaContext.all_reduce``, Keras's
  gradient, metric and variable aggregation), int32 included, goes through netreduce;
* ``experimental_distribute_dataset`` gives process r the r-th of N shards of each
  global batch (tf.data auto-sharding with an InputContext of N pipelines), and
  replica ids run over the whole job.

The process's devices default to its own accelerator (GPU number local_rank) or the CPU.
"""
from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf
from tensorflow.python.distribute import (distribute_lib, distribute_utils, input_util,
                                          mirrored_strategy, reduce_util, values)
from tensorflow.python.distribute import cross_device_ops as _cdo

import netreduce as _nr

from .cross_device_ops import CrossDeviceOps
from .mpi_ops import local_rank, rank, size


def _own_devices() -> list:
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return [gpus[local_rank() % len(gpus)].name]
    return ["/cpu:0"]


class _Extended(mirrored_strategy.MirroredExtended):
    @property
    def _local_replicas(self) -> int:
        return len(self._devices)

    @property
    def _num_replicas_in_sync(self) -> int:
        return self._local_replicas * size()

    def _get_cross_device_ops(self, value):
        return self._cross_device_ops  # int32 too: never ReductionToOneDevice

    def _reduce_to(self, reduce_op, value, destinations, options):
        if distribute_utils.is_mirrored(value) and reduce_op == reduce_util.ReduceOp.MEAN:
            return value
        if size() == 1:
            return super()._reduce_to(reduce_op, value, destinations, options)

        def one(v):
            if not isinstance(v, values.DistributedValues) and not tf.is_tensor(v):
                # a Python number or array, the same on every replica (TF's rule)
                return _cdo.reduce_non_distributed_value(reduce_op, v, destinations,
                                                         self._num_replicas_in_sync)
            return self._cross_device_ops.reduce(
                reduce_op, v, destinations=destinations,
                options=self._communication_options.merge(options))
        return tf.nest.map_structure(one, value)

    def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
        return self._cross_device_ops.batch_reduce(
            reduce_op, value_destination_pairs,
            options=self._communication_options.merge(options))

    def _input_context(self) -> distribute_lib.InputContext:
        return distribute_lib.InputContext(num_input_pipelines=size(), input_pipeline_id=rank(),
                                           num_replicas_in_sync=self._num_replicas_in_sync)

    def _experimental_distribute_dataset(self, dataset, options):
        return input_util.get_distributed_dataset(
            dataset, self._input_workers_with_options(options), self._container_strategy(),
            num_replicas_in_sync=self._num_replicas_in_sync,
            input_context=self._input_context(), options=options)

    def _distribute_datasets_from_function(self, dataset_fn, options):
        return input_util.get_distributed_datasets_from_function(
            dataset_fn, self._input_workers_with_options(options), [self._input_context()],
            self._container_strategy(), options)

    def _experimental_distribute_values_from_function(self, value_fn):
        first = rank() * self._local_replicas
        per_replica = [value_fn(distribute_lib.ValueContext(first + i,
                                                            self._num_replicas_in_sync))
                       for i in range(self._local_replicas)]
        return distribute_utils.regroup(per_replica, always_wrap=True)

    def _get_replica_id_in_sync_group(self, replica_id):
        return rank() * self._local_replicas + replica_id

    def _get_local_replica_id(self, replica_id_in_sync_group):
        return replica_id_in_sync_group - rank() * self._local_replicas


class Strategy(tf.distribute.MirroredStrategy):
    """MirroredStrategy over this process's devices whose reductions span the whole
    netreduce job (creating it joins the job: netreduce.init())."""

    def __init__(self, devices: Optional[Sequence[str]] = None,
                 cross_device_ops: Optional[CrossDeviceOps] = None) -> None:
        _nr.init()
        ops = cross_device_ops or CrossDeviceOps()
        extended = _Extended(self, devices=list(devices or _own_devices()), cross_device_ops=ops)
        tf.distribute.Strategy.__init__(self, extended)
        ops._nr_owner = self  # SUM is the global sum: see cross_device_ops.py
