"""The public, Horovod-shaped API (re-exported by ``netreduce``): one communicator
per process, created by init(), used by every call, released by shutdown()."""
from __future__ import annotations

import atexit
import itertools
import pickle
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from netreduce import config, environment
from netreduce.algorithms.base import connect_settings
from netreduce.algorithms.scatter_gather import shard_rows
from netreduce.errors import InvalidArgumentError, NetReduceError
from netreduce.ops import ReduceOp, as_op, check_array, dtype_name
from netreduce.protocol.address import parse_addresses
from netreduce.protocol.signature import Signature
from netreduce.switch import spawn_for_job
from netreduce.worker import context, elastic_member, job_paths, process_sets, timeline
from netreduce.worker.communicator import Communicator
from netreduce.worker.handle import Handle, Tensor
from netreduce.worker.context import comm as _comm

_g = context.state  # init() and shutdown() keep the process's communicator here


# Seams for tests that run without the native module: replaced by fakes there.
_connect: Optional[Callable[..., Any]] = None
_spawn_switch: Optional[Callable[..., Any]] = None


def _parse_address(text: str) -> Tuple[str, int]:
    # Several aggregators: the communicator negotiates through the first; the
    # algorithm (algorithms/select.py) joins the others.
    return parse_addresses(text, what="NETREDUCE_SWITCH")[0]


def init() -> None:
    """Join the job: discover rank and size from the launcher's environment, connect to
    the aggregator (NETREDUCE_SWITCH, else an embedded local one for a single process),
    and wait until every rank has joined. Calling it again is a no-op.

    In an elastic job (NETREDUCE_ELASTIC: netreduce-run's elastic driver) rank and size
    come from the driver, for the next membership epoch; a start that fails because
    the membership broke or the aggregator is away is retried (worker/elastic_member.py)."""
    member = elastic_member.member()
    if member is None:
        return _init()
    while True:
        with _g.lock:
            if _g.comm is not None:
                return
        member.join()
        try:
            _init()
            member.started()
            return
        except elastic_member.RETRIED as exc:
            try:
                shutdown()
            except NetReduceError:
                pass
            member.failed_start(exc)


def _init() -> None:
    with _g.lock:
        if _g.comm is not None:
            return
        knobs = config.snapshot()
        topo = environment.discover()
        environment.require_job(topo)  # ranks that cannot agree on a job name: say so now
        switch_proc = None
        if knobs["NETREDUCE_SWITCH"]:
            address = _parse_address(knobs["NETREDUCE_SWITCH"])
        elif topo.size == 1:
            spawn = _spawn_switch or spawn_for_job
            switch_proc = spawn(fanout="multicast", secret=False, tls_args=())  # as it always was
            address = tuple(switch_proc.address)
        else:
            raise NetReduceError(
                f"rank {topo.rank} of {topo.size} (from {topo.launcher}) has no aggregator: "
                "start one (netreduce-switch --host H --port P) and export "
                "NETREDUCE_SWITCH=H:P on every rank, or launch with netreduce-run")
        connect = _connect
        if connect is None:  # here: the data plane loads the native module (_source_tree.py)
            from netreduce.worker.dataplane import connect
        _g.connect = connect  # process sets' sub-jobs connect alike (worker/context.py)
        if topo.size > 1 and job_paths.enabled(knobs):
            # A standby or FALLBACK=host: rank 0 serves negotiation and the job's
            # rendezvous; the data path may change under the communicator (worker/failover.py).
            # (Only such a job hosts an aggregator: the daemon's modules load here.)
            from netreduce.switch.in_process import LocalAggregator
            started = job_paths.start(topo, knobs, connect, serve=LocalAggregator)
            try:
                comm = Communicator(rank=topo.rank, size=topo.size, job=topo.job,
                                    address=started.address, dataplane=started.algorithm,
                                    knobs=knobs)
            except BaseException:
                started.algorithm.close()
                started.stop()
                raise
            _publish(comm, topo, started)
            return
        dp = None
        try:
            # The first connection waits for an aggregator that is still starting
            # (netreduce-run starts it beside the ranks) up to NETREDUCE_START_TIMEOUT;
            # an elastic worker's failed start goes back to its driver instead
            # (elastic_member.failed_start: the epoch may have moved on).
            reach_for = 0.0 if knobs["NETREDUCE_ELASTIC"] else float(knobs["NETREDUCE_START_TIMEOUT"])
            dp = connect(address, job=topo.job, rank=topo.rank, size=topo.size,
                         reach_for=reach_for, **connect_settings(knobs))
            comm = Communicator(rank=topo.rank, size=topo.size, job=topo.job, address=address,
                                dataplane=dp, knobs=knobs)
            # Every rank has joined (the hello): exchange the host layout and choose the
            # algorithm the communicator hands its buffers to (netreduce/algorithms).
            try:  # (imported here: select loads the native module, as the data plane)
                from netreduce.algorithms.select import build as build_algorithm
                comm.dp = build_algorithm(dp, topo, knobs, address, connect=connect)
            except BaseException:
                comm.shutdown(timeout=5.0)
                raise
        except BaseException:
            if dp is not None:
                dp.close()
            if switch_proc is not None:
                switch_proc.stop()
            raise
        _publish(comm, topo, switch_proc)


def _publish(comm: Any, topo: Any, switch: Any) -> None:
    """init's last step, on either path: the joined job is this process's, and is left
    at exit. A script that never calls shutdown() must still say goodbye (else the
    other ranks see a crash) and must not leave its embedded aggregator."""
    comm.topology = topo
    _g.comm, _g.topology, _g.switch = comm, topo, switch
    if not _g.atexit_registered:
        atexit.register(shutdown)
        _g.atexit_registered = True


def shutdown() -> None:
    """Leave the job. Operations still being negotiated fail with ShutdownError; the
    other ranks' operations that needed this rank fail with an error naming it."""
    with _g.lock:
        comm, switch_proc = _g.comm, _g.switch
        _g.comm, _g.switch = None, None
    if comm is None:
        return
    try:
        process_sets.remove_all()  # their sub-jobs first: members wait for each other there
    except NetReduceError:
        pass
    try:
        comm.shutdown()
    finally:
        try:
            comm.dp.close()
        finally:
            if switch_proc is not None:
                switch_proc.stop()


def is_initialized() -> bool:
    return _g.comm is not None


def rank() -> int:
    return _comm().rank


def size() -> int:
    return _comm().size


def local_rank() -> int:
    return _comm().topology.local_rank


def local_size() -> int:
    return _comm().topology.local_size


def _auto_name(kind: str) -> str:
    # Every rank calls in the same program order, so counters agree across ranks.
    counters = _comm().name_counters
    n = counters.get(kind, 0)
    counters[kind] = n + 1
    return f"{kind}.noname.{n}"


# Signatures already built, by everything they are built from: a training loop
# submits the same few every step, and building one (dtype_name reads
# numpy's dtype.name, a few µs) is most of a small all-reduce's Python. The key
# holds the numpy dtype and shape themselves, so a changed shape or dtype under the
# same name builds (and negotiates) a new signature; the factors' types are in it so
# that only values float() reads alike share an entry. Only signatures that built
# without error are kept: bad input goes the checking way every time.
_SIGS: dict = {}
_SIGS_MAX = 4096
# name -> (its last steady call's dtype, shape, op, factors as passed; the ReduceOp;
# the Signature): _steady's memo, bounded as _SIGS is
_STEADY: dict = {}


def _sig(kind: str, array: np.ndarray, op: Optional[ReduceOp], pre: Any, post: Any,
         root: int, dtype: Optional[str]) -> Signature:
    key = (kind, array.dtype, array.shape, dtype, op, type(pre), pre, type(post), post, root)
    try:
        return _SIGS[key]
    except KeyError:
        pass
    except TypeError:          # an unhashable factor: build it, do not keep it
        key = None
    sig = Signature(kind, dtype_name(array, dtype), tuple(int(d) for d in array.shape),
                    op.value if op else "", float(pre), float(post), int(root))
    if key is not None:
        if len(_SIGS) >= _SIGS_MAX:
            _SIGS.clear()      # a program of ever-new shapes: start over
        _SIGS[key] = sig
    return sig


def _submit(kind: str, arrays: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
            names: Sequence[str], op: Optional[ReduceOp], pre: float, post: float,
            root: int, dtype: Optional[str], cacheable: bool, grouped: bool) -> Handle:
    comm = _comm()
    handle = Handle(list(outputs), grouped)
    tensors = [Tensor(name, _sig(kind, array, op, pre, post, root, dtype), cacheable, op,
                      array, output, handle)
               for array, output, name in zip(arrays, outputs, names)]
    comm.submit(tensors)
    return handle


def _names(name: Optional[str], count: int, kind: str, grouped: bool) -> Tuple[List[str], bool]:
    if name is None:
        base = _auto_name(kind)
        # auto names are unique per call: caching them would only fill the cache
        return ([f"{base}.{i}" for i in range(count)] if grouped else [base]), False
    return ([f"{name}.{i}" for i in range(count)] if grouped else [name]), True


def _allreduce_async(arrays: Sequence[np.ndarray], op: Any, name: Optional[str],
                     prescale_factor: float, postscale_factor: float, inplace: bool,
                     grouped: bool, dtype: Optional[str]) -> Handle:
    op = as_op(op)
    arrays = [check_array(a) for a in arrays]
    outputs = arrays if inplace else [np.empty_like(a) for a in arrays]
    names, cacheable = _names(name, len(arrays), "allreduce", grouped)
    return _submit("allreduce", arrays, outputs, names, op, prescale_factor, postscale_factor,
                   -1, dtype, cacheable, grouped)


def allreduce_async(array: np.ndarray, op: ReduceOp = ReduceOp.Average,
                    name: Optional[str] = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, *, inplace: bool = False,
                    dtype: Optional[str] = None) -> Handle:
    """Start an all-reduce; ``synchronize(handle)`` returns the result (a new array, or
    ``array`` itself with inplace=True). ``dtype='bfloat16'`` marks a uint16 array
    holding bfloat16 bit patterns."""
    # one array checked without _allreduce_async's per-array lists (a framework's
    # gradient hook calls this once per gradient, inside backward), submitted as
    # broadcast_async does
    op = as_op(op)
    array = check_array(array)
    output = array if inplace else np.empty_like(array)
    names, cacheable = _names(name, 1, "allreduce", False)
    return _submit("allreduce", (array,), (output,), names, op, prescale_factor,
                   postscale_factor, -1, dtype, cacheable, False)


def _steady(array: np.ndarray, op: Any, name: str, pre: Any, post: Any,
            dtype: Optional[str], inplace: bool) -> Optional[np.ndarray]:
    """A named synchronous all-reduce in the steady state (a cached tensor that every
    rank submits step after step): its speculative message on this thread, in one
    call (Agreement.steady), with no Tensor, Handle or hand-off. None when this call
    is not that (the usual path then runs it)."""
    agreement = _comm().agreement
    if agreement is None or agreement.spec.lone != name:
        return None
    array = check_array(array)
    # The name's last call, as the caller passed it: the same again (every step of a
    # training loop) reuses its op and signature, with no as_op or _sig call (whose key
    # hashes the ReduceOp in Python). Types are compared too, as _sig's key does.
    given = (array.dtype, array.shape, op.__class__, op, pre.__class__, pre,
             post.__class__, post, dtype)
    last = _STEADY.get(name)
    if last is not None and last[0] == given:
        op, sig = last[1], last[2]
    else:
        op = as_op(op)
        sig = _sig("allreduce", array, op, pre, post, -1, dtype)
        try:            # (a factor that is unhashable may be mutable: not kept)
            hash((pre, post))
        except TypeError:
            pass
        else:
            if len(_STEADY) >= _SIGS_MAX:
                _STEADY.clear()
            _STEADY[name] = (given, op, sig)
    if inplace and not array.flags.writeable:
        return None
    output = array if inplace else np.empty_like(array)
    return output if agreement.steady(name, sig, op, array, output) else None


def _allreduce_now(array: np.ndarray, op: Any, name: Optional[str], pre: Any, post: Any,
                   dtype: Optional[str], inplace: bool) -> np.ndarray:
    """allreduce and allreduce_: a named call in the steady state in one call on this
    thread (_steady), any other submitted and waited for."""
    if name is not None:
        out = _steady(array, op, name, pre, post, dtype, inplace)
        if out is not None:
            return out
    return allreduce_async(array, op, name, pre, post, inplace=inplace, dtype=dtype).wait()


def allreduce(array: np.ndarray, op: ReduceOp = ReduceOp.Average, name: Optional[str] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, *,
              dtype: Optional[str] = None) -> np.ndarray:
    """All-reduce ``array`` across ranks; returns a new array."""
    return _allreduce_now(array, op, name, prescale_factor, postscale_factor, dtype, False)


def allreduce_(array: np.ndarray, op: ReduceOp = ReduceOp.Average, name: Optional[str] = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0, *,
               dtype: Optional[str] = None) -> np.ndarray:
    """All-reduce ``array`` in place; returns it."""
    return _allreduce_now(array, op, name, prescale_factor, postscale_factor, dtype, True)


def grouped_allreduce_async(arrays: Sequence[np.ndarray], op: ReduceOp = ReduceOp.Average,
                            name: Optional[str] = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, *, inplace: bool = False,
                            dtype: Optional[str] = None) -> Handle:
    """Start all-reduces of several arrays submitted together (so negotiated and
    fused together); synchronize returns the list of results."""
    return _allreduce_async(list(arrays), op, name, prescale_factor, postscale_factor,
                            inplace, True, dtype)


def grouped_allreduce(arrays: Sequence[np.ndarray], op: ReduceOp = ReduceOp.Average,
                      name: Optional[str] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, *, inplace: bool = False,
                      dtype: Optional[str] = None) -> List[np.ndarray]:
    return grouped_allreduce_async(arrays, op, name, prescale_factor, postscale_factor,
                                   inplace=inplace, dtype=dtype).wait()


def grouped_allreduce_(arrays: Sequence[np.ndarray], op: ReduceOp = ReduceOp.Average,
                       name: Optional[str] = None, prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0, *,
                       dtype: Optional[str] = None) -> List[np.ndarray]:
    return grouped_allreduce(arrays, op, name, prescale_factor, postscale_factor,
                             inplace=True, dtype=dtype)


def broadcast_async(array: np.ndarray, root_rank: int, name: Optional[str] = None, *,
                    inplace: bool = False, dtype: Optional[str] = None) -> Handle:
    """Start a broadcast of root_rank's ``array``; it travels through the aggregator as
    a sum to which the other ranks contribute zeros."""
    array = check_array(array)
    if not 0 <= root_rank < size():
        raise InvalidArgumentError(f"root_rank {root_rank} is outside [0, {size()})")
    output = array if inplace else np.empty_like(array)
    names, cacheable = _names(name, 1, "broadcast", False)
    return _submit("broadcast", [array], [output], names, None, 1.0, 1.0, root_rank,
                   dtype, cacheable, False)


def broadcast(array: np.ndarray, root_rank: int, name: Optional[str] = None, *,
              dtype: Optional[str] = None) -> np.ndarray:
    return broadcast_async(array, root_rank, name, dtype=dtype).wait()


def broadcast_(array: np.ndarray, root_rank: int, name: Optional[str] = None, *,
               dtype: Optional[str] = None) -> np.ndarray:
    return broadcast_async(array, root_rank, name, inplace=True, dtype=dtype).wait()


def _reducescatter_async(arrays: Sequence[np.ndarray], op: Any, name: Optional[str],
                         prescale_factor: float, postscale_factor: float, grouped: bool,
                         dtype: Optional[str]) -> Handle:
    op = as_op(op)
    arrays = [check_array(a) for a in arrays]
    for a in arrays:
        if a.ndim == 0:
            raise InvalidArgumentError("Reducescatter does not support scalar inputs")
    n, r = size(), rank()
    outputs = [np.empty((shard_rows(a.shape[0], n, r)[1],) + a.shape[1:], dtype=a.dtype)
               for a in arrays]
    names, cacheable = _names(name, len(arrays), "reducescatter", grouped)
    return _submit("reducescatter", arrays, outputs, names, op, prescale_factor,
                   postscale_factor, -1, dtype, cacheable, grouped)


def reducescatter_async(array: np.ndarray, op: ReduceOp = ReduceOp.Average,
                        name: Optional[str] = None, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0, *,
                        dtype: Optional[str] = None) -> Handle:
    """Start a reduce-scatter: every rank passes the same shape; synchronize returns
    this rank's rows of the reduction (first dimension split as Horovod does)."""
    return _reducescatter_async([array], op, name, prescale_factor, postscale_factor,
                                False, dtype)


def grouped_reducescatter_async(arrays: Sequence[np.ndarray], op: ReduceOp = ReduceOp.Average,
                                name: Optional[str] = None, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0, *,
                                dtype: Optional[str] = None) -> Handle:
    return _reducescatter_async(list(arrays), op, name, prescale_factor, postscale_factor,
                                True, dtype)


def _allgather_async(arrays: Sequence[np.ndarray], name: Optional[str], grouped: bool,
                     dtype: Optional[str]) -> Handle:
    """Concatenation along the first dimension, whose length may differ by rank: the
    signature carries the other dimensions only; the executor learns every rank's
    row count in the same data-plane round as the rest (communicator)."""
    arrays = [check_array(a).reshape(-1) if a.ndim == 0 else check_array(a) for a in arrays]
    # placeholders: the result's first dimension is known once every rank's is
    outputs = [np.empty((0,) + a.shape[1:], dtype=a.dtype) for a in arrays]
    names, cacheable = _names(name, len(arrays), "allgather", grouped)
    comm = _comm()
    handle = Handle(list(outputs), grouped)
    tensors = []
    for array, output, tname in zip(arrays, outputs, names):
        sig = Signature("allgatherv", dtype_name(array, dtype),
                        tuple(int(d) for d in array.shape[1:]), "")
        tensors.append(Tensor(tname, sig, cacheable, None, array, output, handle))
    comm.submit(tensors)
    return handle


def allgather_async(array: np.ndarray, name: Optional[str] = None, *,
                    dtype: Optional[str] = None) -> Handle:
    """Start an all-gather: every rank's ``array`` concatenated along the first
    dimension, in rank order (the first dimensions may differ)."""
    return _allgather_async([array], name, False, dtype)


def grouped_allgather_async(arrays: Sequence[np.ndarray], name: Optional[str] = None, *,
                            dtype: Optional[str] = None) -> Handle:
    return _allgather_async(list(arrays), name, True, dtype)


def poll(handle: Handle) -> bool:
    """True once the operation behind ``handle`` has finished (or failed)."""
    return handle.done()


def synchronize(handle: Handle) -> Any:
    """Wait for ``handle``; return its result or raise its error."""
    return handle.wait()


def barrier() -> None:
    """Return once every rank has called barrier() (negotiation only, no data)."""
    _submit("barrier", [np.empty(0, np.float32)], [np.empty(0, np.float32)],
            ["__barrier__"], None, 1.0, 1.0, -1, None, True, False).wait()


def join() -> int:
    """Horovod's ``join``: this rank has no more data. Until every rank has joined it
    keeps taking part in the other ranks' all-reduces (grouped ones too) by
    contributing zeros of the right dtype and shape — Average still divides by the
    full size(), as in Horovod — and barriers. A broadcast, broadcast_object or
    allgather_object that other ranks start meanwhile fails on those ranks with
    "... is not supported with Join at this time" (Horovod's error). Returns the rank
    that joined last, the same on every rank. join() may be called again later (say,
    every epoch)."""
    out = np.full(1, -1, dtype=np.int64)
    handle = _submit("join", [out], [out], ["__join__"], None, 1.0, 1.0, -1, None,
                     False, False)
    return int(handle.wait()[0])


def _bytes_as_int32(payload: bytes, total: int) -> np.ndarray:
    # int32 because the data plane sums integers exactly: only one rank writes each
    # word, so the sum is that rank's bytes.
    words = np.zeros((total + 3) // 4, dtype=np.int32)
    words.view(np.uint8)[:len(payload)] = np.frombuffer(payload, dtype=np.uint8)
    return words


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None) -> Any:
    """Pickle ``obj`` on root_rank and return it on every rank."""
    base, cacheable = name or _auto_name("broadcast_object"), name is not None
    payload = pickle.dumps(obj) if rank() == root_rank else b""
    length = np.array([len(payload)], dtype=np.int64)
    _submit("broadcast", [length], [length], [f"{base}.len"], None, 1.0, 1.0, root_rank,
            None, cacheable, False).wait()
    words = _bytes_as_int32(payload, int(length[0]))
    _submit("broadcast", [words], [words], [f"{base}.data"], None, 1.0, 1.0, root_rank,
            None, False, False).wait()
    return obj if rank() == root_rank else pickle.loads(words.view(np.uint8)[:int(length[0])])


def allgather_object(obj: Any, name: Optional[str] = None) -> List[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    base, cacheable = name or _auto_name("allgather_object"), name is not None
    payload = pickle.dumps(obj)
    lengths = np.zeros(size(), dtype=np.int64)
    lengths[rank()] = len(payload)
    _submit("allgather", [lengths], [lengths], [f"{base}.len"], ReduceOp.Sum, 1.0, 1.0, -1,
            None, cacheable, False).wait()
    starts = [0] + list(itertools.accumulate(int((n + 3) // 4) * 4 for n in lengths))
    mine = np.zeros(starts[-1] // 4, dtype=np.int32)
    mine.view(np.uint8)[starts[rank()]:starts[rank()] + len(payload)] = \
        np.frombuffer(payload, dtype=np.uint8)
    # payload sizes change from call to call: never cache the data tensor's name
    _submit("allgather", [mine], [mine], [f"{base}.data"], ReduceOp.Sum, 1.0, 1.0, -1,
            None, False, False).wait()
    everything = mine.view(np.uint8)
    return [pickle.loads(everything[starts[r]:starts[r] + int(lengths[r])])
            for r in range(size())]


def _communicator() -> Communicator:
    """The live communicator (tests and adapters read its counters)."""
    return _comm()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Horovod's ``start_timeline``: record this job's timeline (NETREDUCE_TIMELINE's
    Chrome trace, netreduce/worker/timeline.py) into ``file_path`` from now on, on rank 0
    (every rank with a ``{rank}`` in the path); a timeline already being written is
    closed first. ``mark_cycles`` is accepted for Horovod's signature: netreduce's
    trace has no cycle markers."""
    comm = _comm()
    new = timeline.Timeline.from_config(file_path, comm.rank)
    old, comm.timeline = comm.timeline, new
    if old is not None:
        old.close()


def stop_timeline() -> None:
    """Horovod's ``stop_timeline``: close the timeline file (a complete JSON array);
    spans of operations still in flight are dropped."""
    comm = _comm()
    if comm.timeline is not None:
        comm.timeline.close()  # kept, closed: a span racing with this is a no-op
