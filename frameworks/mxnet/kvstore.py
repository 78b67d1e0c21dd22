"""``kvstore="netreduce"``: MXNet's KVStore plug-in interface over netreduce.

Importing netreduce.mxnet registers :class:`NetReduce` with
``mxnet.kvstore.KVStoreBase.register`` (the registry key is the class name, lower
case), so ``mx.kv.create("netreduce")`` returns one, and ``gluon.Trainer(...,
kvstore="netreduce")`` uses one — see :func:`patch_create_kvstore` for why the string
form needs help.

Semantics: ``pushpull`` **sums** over workers, like ``dist_sync``; a Trainer step
therefore wants the global batch (``trainer.step(batch_size * kv.num_workers)``) to
average — docs/mxnet.md. ``pushpull`` hands the arrays to the core and returns; the
wait for the result runs in MXNet's engine (engine.py), so later MXNet operations on
the results are ordered after it and the Trainer's per-parameter calls reach the
core as one burst that it negotiates and fuses together. ``broadcast`` waits.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import threading

import mxnet as mx
from mxnet import optimizer as mx_optimizer
from mxnet.kvstore import KVStoreBase

import netreduce as _nr
from netreduce.errors import InvalidArgumentError, InvalidTypeError, UnsupportedError

from . import engine
from .buffers import HostBuffer
from .mpi_ops import broadcast_many, reduce_in_place

TYPE = "netreduce"


def _as_list(x: Any) -> List[Any]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _pairs(key: Any, value: Any, out: Any) -> List[Tuple[Any, List[Any], Optional[List[Any]]]]:
    """(key, [values of that key, one per device], [outs] or None) per key."""
    if isinstance(key, (list, tuple)):
        values = _as_list(value)
        outs = _as_list(out) if out is not None else [None] * len(key)
        if not len(key) == len(values) == len(outs):
            raise InvalidArgumentError(f"pushpull/broadcast: {len(key)} keys but {len(values)} values "
                             f"and {len(outs)} outs")
        return [(k, _as_list(v), None if o is None else _as_list(o))
                for k, v, o in zip(key, values, outs)]
    return [(key, _as_list(value), None if out is None else _as_list(out))]


def _name(key: Any) -> str:
    if not isinstance(key, (int, str)) or isinstance(key, bool):
        raise InvalidTypeError(f"KVStore keys are int or str, got {type(key).__name__}")
    return f"kvstore.{key}"


@KVStoreBase.register
class NetReduce(KVStoreBase):
    """A KVStore whose push-pull is a netreduce all-reduce (sum) over every worker.

    Creating one joins the job (``netreduce.init()``, a no-op when already joined).
    With :meth:`set_optimizer` (the Trainer calls it for ``update_on_kvstore=True``)
    a ``pushpull(key, grad, out=weight)`` sums the gradients and then applies the
    optimizer to ``weight`` on every worker alike, as MXNet's ``local`` store does on
    one machine; the optimizer's state lives here and save/load_optimizer_states work.
    """

    def __init__(self) -> None:
        _nr.init()
        self._updater: Any = None
        self._reduced: Dict[Any, mx.nd.NDArray] = {}  # per key, for update-on-kvstore
        self._inflight: Dict[str, Any] = {}  # tensor name -> core handle, until done
        self._failures: List[BaseException] = []  # from reductions finished in the engine
        self._lock = threading.Lock()

    # --- errors of reductions that finished inside MXNet's engine ----------------------
    def _raise_failure(self) -> None:
        with self._lock:
            failure = self._failures.pop(0) if self._failures else None
            self._failures.clear()
        if failure is not None:
            raise failure

    def synchronize(self) -> None:
        """Wait for every pushpull issued so far; raise the first error among them
        (otherwise the store's next call raises it)."""
        mx.nd.waitall()
        self._raise_failure()

    # --- identity ---------------------------------------------------------------------
    @property
    def type(self) -> str:
        return TYPE

    @property
    def rank(self) -> int:
        return _nr.rank()

    @property
    def num_workers(self) -> int:
        return _nr.size()

    @staticmethod
    def is_capable(capability: str) -> bool:
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return True
        raise InvalidArgumentError(f"Unknown capability: {capability}")

    # --- data -------------------------------------------------------------------------
    def broadcast(self, key, value, out, priority=0) -> None:
        """Every worker's ``out`` (one NDArray or a list, per key) = rank 0's
        ``value``; ``value`` itself is only changed where it is also an ``out``."""
        self._raise_failure()
        items = _pairs(key, value, out)
        targets, names = [], []
        for k, values, outs in items:
            if len(values) != 1:
                raise InvalidArgumentError(f"broadcast: key {k!r} has {len(values)} values; give one")
            if not outs:
                raise InvalidArgumentError(f"broadcast: key {k!r} has no out")
            if outs[0] is not values[0]:
                values[0].copyto(outs[0])
            targets.append(outs[0])
            names.append(_name(k) + ".broadcast")
        broadcast_many(targets, names, 0, what="KVStore.broadcast")
        for (k, values, outs), target in zip(items, targets):
            for o in outs[1:]:
                target.copyto(o)

    def pushpull(self, key, value, out=None, priority=0) -> None:
        """Sum ``value`` over workers (and over its devices when a key has several
        values) into ``out``, or into every ``value`` when ``out`` is None. With an
        optimizer set and ``out`` given, ``out`` is the weight the optimizer updates
        with the summed gradient."""
        self._raise_failure()
        items = _pairs(key, value, out)
        update = self._updater is not None
        targets, names = [], []
        for k, values, outs in items:
            if update and outs is not None:
                target = self._reduced.get(k)
                if target is None or target.shape != values[0].shape or \
                        target.dtype != values[0].dtype:
                    target = self._reduced[k] = mx.nd.empty(values[0].shape, mx.cpu(),
                                                            values[0].dtype)
                values[0].copyto(target)
            elif outs is not None and outs[0] is not values[0]:
                target = outs[0]
                values[0].copyto(target)
            else:
                target = values[0]
            for v in values[1:]:  # several devices of this worker: their sum first
                target += v.as_in_context(target.context)
            targets.append(target)
            names.append(_name(k))
        self._reduce(targets, names, priority)
        for (k, values, outs), target in zip(items, targets):
            if update and outs is not None:
                for o in outs:
                    self._updater(k, target.as_in_context(o.context), o)
                continue
            for dest in (outs if outs is not None else values):
                if dest is not target:
                    target.copyto(dest)

    def _reduce(self, targets: List[Any], names: List[str], priority: int) -> None:
        """Sum ``targets`` in place across workers: submitted now, finished by an
        engine operation that writes them (synchronously for non-CPU arrays, whose
        host copies must be copied back)."""
        for name in names:  # the same key again before MXNet needed the last result
            with self._lock:
                earlier = self._inflight.pop(name, None)
            if earlier is not None:
                self._finish([earlier])
        self._raise_failure()
        bufs = [HostBuffer(t, "KVStore.pushpull", n, write=True) for t, n in zip(targets, names)]
        if any(b.host is not b.nd for b in bufs):
            reduce_in_place(targets, names, _nr.Sum, what="KVStore.pushpull")
            return
        handles = []
        try:
            for buf, name in zip(bufs, names):
                handles.append(_nr.allreduce_async(buf.array, op=_nr.Sum, name=name,
                                                   inplace=True))
        finally:
            if len(handles) < len(bufs):  # a submission failed: nothing may stay in flight
                self._finish(handles)
        with self._lock:
            self._inflight.update(zip(names, handles))

        def finish() -> None:  # in an engine thread, once MXNet is done with targets
            self._finish(handles)
            with self._lock:
                for name, handle in zip(names, handles):
                    if self._inflight.get(name) is handle:
                        del self._inflight[name]
            del bufs[:]  # the NDArrays stay alive until here
        engine.push(finish, targets, priority)

    def _finish(self, handles: List[Any]) -> None:
        for handle in handles:
            try:
                handle.wait()
            except BaseException as exc:  # raised by the store's next call
                with self._lock:
                    self._failures.append(exc)

    # --- optimizer --------------------------------------------------------------------
    def set_optimizer(self, optimizer) -> None:
        """Run ``optimizer`` here: pushpull(key, grad, out=weight) then updates weight
        with the summed gradient, identically on every worker."""
        self._updater = mx_optimizer.get_updater(optimizer)

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        if self._updater is None:
            raise _nr.NetReduceError(
                "save_optimizer_states: this netreduce KVStore has no optimizer (the "
                "Trainer updates locally unless update_on_kvstore=True); save the "
                "optimizer with trainer.save_states(fname)")
        with open(fname, "wb") as f:
            f.write(self._updater.get_states(dump_optimizer))

    def load_optimizer_states(self, fname: str) -> None:
        if self._updater is None:
            raise _nr.NetReduceError(
                "load_optimizer_states: this netreduce KVStore has no optimizer; call "
                "set_optimizer first (or trainer.load_states(fname) without "
                "update_on_kvstore)")
        with open(fname, "rb") as f:
            self._updater.set_states(f.read())

    def set_gradient_compression(self, compression_params) -> None:
        raise UnsupportedError(
            "kvstore='netreduce' does not compress gradients (its aggregator sums "
            "full-precision values); leave compression_params unset, or use "
            "netreduce.mxnet.DistributedTrainer(compression=Compression.fp16)")

    # --- MXNet's push/pull split is a server's API -------------------------------------
    def push(self, key, value, priority=0) -> None:
        raise UnsupportedError("kvstore='netreduce' has no server to push to: use "
                                  "pushpull (what gluon.Trainer calls for dense gradients)")

    def pull(self, key, out=None, priority=0, ignore_sparse=True) -> None:
        raise UnsupportedError("kvstore='netreduce' has no server to pull from: use "
                                  "pushpull or broadcast")


def patch_create_kvstore() -> None:
    """Make the string ``kvstore="netreduce"`` create the store.

    ``mxnet.model._create_kvstore`` (used by gluon.Trainer and Module) returns *no*
    kvstore for a string without "dist" when the process has one device: a single-
    machine store would have nothing to reduce. netreduce's store spans machines, so
    that shortcut would silently train every worker alone. The wrapper only turns our
    registered name into an instance — exactly what ``kvstore=mx.kv.create(
    "netreduce")`` passes — and leaves every other argument to MXNet's function.
    Idempotent; patches the modules that imported the function by name."""
    import mxnet.gluon.trainer as trainer_mod
    import mxnet.model as model_mod
    import mxnet.module.module as module_mod

    original = getattr(model_mod._create_kvstore, "__wrapped__", model_mod._create_kvstore)

    def _create_kvstore(kvstore, num_device, arg_params):
        if isinstance(kvstore, str) and kvstore.lower() == TYPE:
            kvstore = mx.kv.create(kvstore)
        return original(kvstore, num_device, arg_params)

    _create_kvstore.__wrapped__ = original
    _create_kvstore.__doc__ = original.__doc__
    for mod in (model_mod, trainer_mod, module_mod):
        mod._create_kvstore = _create_kvstore
