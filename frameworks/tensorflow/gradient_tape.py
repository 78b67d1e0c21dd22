"""DistributedGradientTape and the gradient all-reduce shared with the Keras optimizer.

A whole step's gradients leave as grouped all-reduces of up to one fusion buffer each
(NETREDUCE_FUSION_THRESHOLD, 64 MiB by default) — the most the core fuses into one
transfer anyway — formed in backprop order (last layer first). Inside tf.function each
group is one graph node that runs as soon as its gradients exist, so the all-reduce of
the last layers overlaps the backprop of the first ones; a model whose gradients fit
one buffer leaves as a single group.

tf.IndexedSlices gradients (embedding lookups) are all-gathered by default, as in
Horovod: each rank sends only the rows it touched (k rows instead of the whole table),
which wins while N·k stays well below the table's row count; ``sparse_as_dense=True``
densifies them first so they join the fused dense group (better when most rows are
touched, and the only choice for Min/Max).
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf

import netreduce as _nr
from netreduce import config
from netreduce.errors import InvalidArgumentError

from .compression import Compression
from .mpi_ops import (Average, _check_process_set, as_op, global_process_set,
                      grouped_allreduce, size)


def _key(source: Any) -> Any:
    # Keras 3 variables have no .ref() (the Horovod-on-Keras-3 crash, horovod #4290)
    return source.ref() if hasattr(source, "ref") else id(source)


def check_predivide(op: Any, gradient_predivide_factor: float) -> None:
    if gradient_predivide_factor != 1.0 and as_op(op) is not Average:
        raise InvalidArgumentError("gradient_predivide_factor not supported with op != Average")


def allreduce_gradients(grads: Sequence[Any], *, op: Any, compression: Any,
                        sparse_as_dense: bool, gradient_predivide_factor: float = 1.0,
                        name: Optional[str] = None,
                        process_set: Any = global_process_set) -> List[Any]:
    """The all-reduced gradients (None stays None), as one grouped submission."""
    grads = list(grads)
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:
        return grads
    todo = {}
    for i in present:
        g = grads[i]
        if sparse_as_dense and isinstance(g, tf.IndexedSlices):
            g = tf.convert_to_tensor(g)
        todo[i] = g
    # Average splits its 1/size around the sum: 1/f before, f/size after (Horovod).
    f = float(gradient_predivide_factor)
    out = list(grads)
    for k, bucket in enumerate(buckets(todo, fusion_limit())):
        label = None if name is None else (f"{name}.b{k}" if k else name)
        reduced = grouped_allreduce([todo[i] for i in bucket], op=op, compression=compression,
                                    prescale_factor=1.0 / f, postscale_factor=f, name=label,
                                    process_set=process_set)
        for i, r in zip(bucket, reduced):
            out[i] = r
    return out


def fusion_limit() -> int:
    """Bytes the core fuses into one transfer (its fusion buffer)."""
    if _nr.is_initialized():
        return int(_nr.api._communicator().fusion.capacity)
    return int(config.get("NETREDUCE_FUSION_THRESHOLD"))


def _nbytes(g: Any) -> int:
    if isinstance(g, tf.IndexedSlices):
        return 0  # all-gathered on its own
    n = g.shape.num_elements()
    return 0 if n is None else n * g.dtype.size


def buckets(grads: Dict[int, Any], limit: int) -> List[List[int]]:
    """Indices of ``grads`` in groups of up to ``limit`` bytes, last index first (the
    order in which backprop produces them); one group when they all fit."""
    groups: List[List[int]] = [[]]
    filled = 0
    for i in sorted(grads, reverse=True):
        size_i = _nbytes(grads[i])
        if groups[-1] and filled + size_i > limit:
            groups.append([])
            filled = 0
        groups[-1].append(i)
        filled += size_i
    return groups


class _DistributedGradientTape(tf.GradientTape):
    """A GradientTape whose gradient() returns gradients all-reduced across ranks."""

    def _nr_setup(self, op, compression, sparse_as_dense, gradient_predivide_factor,
                  scale_local_gradients, process_set):
        self._nr_op, self._nr_compression = op, compression
        self._nr_process_set = process_set
        self._nr_sparse_as_dense = sparse_as_dense
        self._nr_predivide = gradient_predivide_factor
        self._nr_scale_local = scale_local_gradients
        self._local_sources = set()

    def register_local_source(self, source):
        """Gradients of ``source`` stay local (scaled by 1/size when
        scale_local_gradients, as in Horovod)."""
        self._local_sources.add(_key(source))

    def get_local_and_global_gradients(self, target, sources, output_gradients=None):
        """Horovod's split of gradient(): ([(local source, its gradient)], [(shared
        source, its all-reduced gradient)])."""
        grads = self.gradient(target, sources, output_gradients)
        flat_sources, flat_grads = tf.nest.flatten(sources), tf.nest.flatten(grads)
        local = [(s, g) for s, g in zip(flat_sources, flat_grads)
                 if _key(s) in self._local_sources]
        shared = [(s, g) for s, g in zip(flat_sources, flat_grads)
                  if _key(s) not in self._local_sources]
        return local, shared

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE, use_generic_names=False):
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        shared = [i for i, s in enumerate(flat_sources) if _key(s) not in self._local_sources]
        reduced = allreduce_gradients([flat_grads[i] for i in shared], op=self._nr_op,
                                      compression=self._nr_compression,
                                      sparse_as_dense=self._nr_sparse_as_dense,
                                      gradient_predivide_factor=self._nr_predivide,
                                      process_set=self._nr_process_set)
        out = list(flat_grads)
        for i, g in zip(shared, reduced):
            out[i] = g
        if self._nr_scale_local and self._local_sources:
            n = float(size())
            for i, s in enumerate(flat_sources):
                g = out[i]
                if _key(s) in self._local_sources and g is not None:
                    out[i] = (tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
                              if isinstance(g, tf.IndexedSlices) else g / n)
        return tf.nest.pack_sequence_as(sources, out)


def DistributedGradientTape(gradtape, device_dense='', device_sparse='',
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=global_process_set, scale_local_gradients=True):
    """Wrap ``gradtape`` (already recorded, or to be entered) so that gradient()
    all-reduces. ``groups``/``num_groups`` are accepted for Horovod's signature: the
    core fuses the whole group by size (NETREDUCE_FUSION_THRESHOLD) instead."""
    _check_process_set(process_set)
    check_predivide(op, gradient_predivide_factor)
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be "
                      "removed in v0.23.0.", DeprecationWarning)
    if groups is not None and not (isinstance(groups, list) or groups > 0):
        raise InvalidArgumentError("groups should be a non-negative integer or a list of list of "
                         "tf.Variable.")
    cls = type(gradtape.__class__.__name__, (_DistributedGradientTape, gradtape.__class__), {})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)  # the recorded tape, persistent, watch flags
    tape._nr_setup(op, compression, sparse_as_dense, gradient_predivide_factor,
                   scale_local_gradients, process_set)
    return tape


def PartialDistributedGradientTape(gradtape, device_dense='', device_sparse='',
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set,
                                   local_layers=None, scale_local_gradients=True):
    """DistributedGradientTape whose ``local_layers``' trainable variables keep their
    own gradients (scaled by 1/size with scale_local_gradients, as in Horovod)."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    for layer in local_layers or []:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
