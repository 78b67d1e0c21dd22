"""The "netreduce" torch.distributed backend.

``import netreduce.torch`` registers it, so ``dist.init_process_group("netreduce")``
(under netreduce-run, torchrun or any launcher netreduce reads) gives a process group
whose collectives go through the aggregator. Every collective is issued asynchronously
and returns a ``Work`` backed by a torch future, which DDP's reducer needs to overlap
gradient communication with backward.

Supported: allreduce (SUM, AVG, MIN, MAX, PRODUCT), allreduce_coalesced, broadcast, allgather,
all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor (the core's reduce-scatter),
all_to_all(_single) (relayed as all-gathers), reduce (as an allreduce), barrier; enough
for FSDP (examples/pytorch_fsdp.py). Everything else raises
NotImplementedError naming the collective; create a gloo group for those.

Without MASTER_ADDR/MASTER_PORT in the environment, pass ``init_method="netreduce://"``:
rank 0 opens a TCPStore and netreduce tells the other ranks where it is (the
aggregator must then be known already: netreduce-run or NETREDUCE_SWITCH). Under
torchrun without NETREDUCE_SWITCH, ``env://`` (the default): rank 0 starts an
aggregator and publishes its address in torch's store.
"""
from __future__ import annotations

import atexit
import datetime
import json
import os
import socket
import time
from typing import Any, Dict, List, Tuple

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

import netreduce as _nr
from netreduce import config, environment
from netreduce.worker import process_sets as _ps
from netreduce.protocol import auth
from netreduce.protocol.address import format_address, parse_address
from netreduce.errors import ControlPlaneError, InvalidArgumentError, UnsupportedError

from . import ddp_auto, mpi_ops, scatter_gather
from .futures import completer, cuda_devices

BACKEND_NAME = "netreduce"
# Names a collective signature cycles through (ProcessGroupNetReduce._recurring): as
# many of one signature may be in flight at once before the next waits.
RECURRING = 4
_GROUPS: Dict[tuple, int] = {}  # process groups made here per member list (their names' tag)


def _core_op(op: Any, collective: str):
    """torch ReduceOp -> netreduce op; anything else is refused by name."""
    op = getattr(op, "reduceOp", op)
    for torch_op, core_op in ((dist.ReduceOp.SUM, mpi_ops.Sum),
                              (dist.ReduceOp.AVG, mpi_ops.Average),
                              (dist.ReduceOp.MIN, mpi_ops.Min),
                              (dist.ReduceOp.MAX, mpi_ops.Max),
                              (dist.ReduceOp.PRODUCT, mpi_ops.Product)):
        if op == torch_op:
            return core_op
    name = str(getattr(op, "op", op)).rpartition(".")[2]  # ReduceOp.op is a RedOpType
    raise UnsupportedError(f"netreduce process group: {collective} with reduce op {name} is "
                              "not supported (SUM, AVG, MIN, MAX and PRODUCT are)")


class ProcessGroupNetReduce(dist.ProcessGroup):
    """A torch ProcessGroup whose collectives are netreduce operations."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta,
                 global_ranks: Any = None):
        super().__init__(rank, size)
        if not mpi_ops.is_initialized():
            mpi_ops.init()
        # A sub-group (new_group(ranks)) is a process set: a sub-job at the aggregator
        self._process_set = _ps.global_process_set
        if global_ranks and len(global_ranks) != mpi_ops.size():
            self._process_set = _ps.add_members_only(list(global_ranks))
        elif (rank, size) != (mpi_ops.rank(), mpi_ops.size()):
            raise InvalidArgumentError(
                f"netreduce process group: torch asked for rank {rank} of {size}, but netreduce "
                f"runs as rank {mpi_ops.rank()} of {mpi_ops.size()}")
        self._rank, self._size = rank, size
        self._store = store
        self._timeout = timeout
        # All-reduces and broadcasts are named by what they carry (the collective,
        # dtype, element count, op or root) and by their call count for that
        # signature, modulo RECURRING: every rank issues a group's collectives in the
        # same order, so the names agree across ranks, and a training step's (DDP's
        # buckets, its buffer broadcast) repeat step after step, so the response cache
        # serves them (a round instead of a coordinator round trip). A name is reused
        # only once its previous operation has completed here (_recurring waits).
        members = tuple(global_ranks or ())
        _GROUPS[members] = _GROUPS.get(members, -1) + 1
        self._tag = f"torch.pg{_GROUPS[members]}"
        self._calls: Dict[str, int] = {}
        self._last: Dict[str, Any] = {}  # name -> the future of its latest operation
        self._ddp_models = 0  # DDP modules given ddp_overlap on this group (ddp_label)

    def ddp_label(self) -> str:
        """A name for the next DDP module that ddp_auto overlaps on this group, the
        same on every rank: its gradients' names carry it (two models, two labels).
        Every rank reaches a DDP's first forward in the same order (DDP's forward and
        backward are collectives of the group)."""
        self._ddp_models += 1
        return f"{self._tag}.ddp{self._ddp_models - 1}"

    def _recurring(self, what: str, tensor: torch.Tensor) -> str:
        """The name of the next ``what`` (e.g. "allreduce.sum") of ``tensor``."""
        key = f"{what}.{str(tensor.dtype).replace('torch.', '')}.{tensor.numel()}"
        n = self._calls.get(key, 0)
        self._calls[key] = n + 1
        name = f"{self._tag}.{key}.{n % RECURRING}"
        previous = self._last.get(name)
        if previous is not None and not previous.done():
            previous.wait()   # RECURRING operations of one signature in flight
        return name

    def _named_work(self, names: List[str], handles: List[int], result: Any,
                    tensors: List[torch.Tensor]):
        future = completer.submit(handles, lambda _: result, cuda_devices(tensors))
        for name in names:
            self._last[name] = future
        return _create_work_from_future(future)

    def _work(self, handles: List[int], result: Any, tensors: List[torch.Tensor]):
        return _create_work_from_future(
            completer.submit(handles, lambda _: result, cuda_devices(tensors)))

    # --- identity -------------------------------------------------------------------
    # torch keeps a group's name on its backends, and this group registers none (it
    # is its own backend): keep the name here, where DeviceMesh (FSDP2) reads it.
    def _set_group_name(self, name: str) -> None:
        self._nr_group_name = name
        try:
            super()._set_group_name(name)
        except RuntimeError:
            pass

    @property
    def group_name(self) -> str:
        return getattr(self, "_nr_group_name", "")

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def getRank(self) -> int:
        return self._rank

    def getSize(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"ProcessGroupNetReduce(rank={self._rank}, size={self._size})"

    # --- collectives ------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        op = _core_op(opts if opts is not None else dist.ReduceOp.SUM, "allreduce")
        names = [self._recurring(f"allreduce.{getattr(op, 'value', op)}", t) for t in tensors]
        handles = [mpi_ops.allreduce_async_(t, op=op, name=n) for t, n in zip(tensors, names)]
        return self._named_work(names, handles, tensors, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        op = _core_op(opts if opts is not None else dist.ReduceOp.SUM, "allreduce_coalesced")
        handle = mpi_ops.grouped_allreduce_async_(list(tensors), op=op)
        return self._work([handle], tensors, tensors)

    def reduce(self, tensors, opts=None):
        # Every rank ends with the result; torch only promises it on the root.
        op = _core_op(opts if opts is not None else dist.ReduceOp.SUM, "reduce")
        names = [self._recurring(f"allreduce.{getattr(op, 'value', op)}", t) for t in tensors]
        handles = [mpi_ops.allreduce_async_(t, op=op, name=n) for t, n in zip(tensors, names)]
        return self._named_work(names, handles, tensors, tensors)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        names = [self._recurring(f"broadcast.{root}", t) for t in tensors]
        handles = [mpi_ops.broadcast_async_(t, root, name=n) for t, n in zip(tensors, names)]
        return self._named_work(names, handles, tensors, tensors)

    def _gather_into(self, flat_out: torch.Tensor, tensor: torch.Tensor) -> int:
        """Start an allgather of ``tensor`` into ``flat_out`` (size * numel elements):
        each rank writes its stretch of a zeroed buffer and the buffers are summed."""
        numel = tensor.numel()
        with torch.no_grad():
            # FSDP2 gathers in place: its input is this rank's stretch of the output
            mine = tensor.reshape(-1).clone()
            flat_out.zero_()
            flat_out[self._rank * numel:(self._rank + 1) * numel].copy_(mine)
        return mpi_ops._exact_sum_async_(flat_out, None)

    def allgather(self, output_tensors, input_tensors, opts=None):
        handles, flats = [], []
        for outputs, tensor in zip(output_tensors, input_tensors):
            if len(outputs) != self._size or any(o.numel() != tensor.numel() for o in outputs):
                raise InvalidArgumentError("netreduce allgather: need one output tensor per rank, each "
                                 f"with {tensor.numel()} elements")
            flat = torch.empty(self._size * tensor.numel(), dtype=tensor.dtype,
                               device=tensor.device)
            handles.append(self._gather_into(flat, tensor))
            flats.append(flat)

        def finish(_):
            with torch.no_grad():
                for outputs, flat in zip(output_tensors, flats):
                    for r, out in enumerate(outputs):
                        out.copy_(flat.view(self._size, -1)[r].view_as(out))
            return output_tensors
        future = completer.submit(handles, finish, cuda_devices(list(input_tensors)))
        return _create_work_from_future(future)

    def all_gather_single(self, output, input, opts=None):
        if output.numel() != self._size * input.numel() or not output.is_contiguous():
            raise InvalidArgumentError("netreduce all_gather_into_tensor: output must be contiguous with "
                             f"size * {input.numel()} elements")
        handle = self._gather_into(output.view(-1), input)
        return self._work([handle], [output], [output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for output, tensor in zip(outputs, inputs):
            if output.numel() != self._size * tensor.numel() or not output.is_contiguous():
                raise InvalidArgumentError("netreduce all_gather_into_tensor_coalesced: each output must "
                                 f"be contiguous with size * {tensor.numel()} elements")
        handles = [self._gather_into(o.view(-1), t) for o, t in zip(outputs, inputs)]
        return self._work(handles, list(outputs), list(outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _scatter_rows(self, flat_in: torch.Tensor, output: torch.Tensor, collective: str,
                      opts: Any) -> Any:
        """Reduce ``flat_in`` (size * output.numel() elements, the chunk for rank r at
        r) and land this rank's chunk in ``output``: the core's reduce-scatter of a
        (size, numel) matrix, whose split gives every rank exactly its row."""
        op = _core_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, collective)
        numel = output.numel()
        if flat_in.numel() != self._size * numel:
            raise InvalidArgumentError(f"netreduce {collective}: input must have size * {numel} "
                             f"elements, got {flat_in.numel()}")
        rows = flat_in.contiguous().view(self._size, numel)
        handle = scatter_gather.reducescatter_async(rows, op=op)

        def finish(results):
            with torch.no_grad():
                output.copy_(results[0].view_as(output))
            return [output]
        return _create_work_from_future(
            completer.submit([handle], finish, cuda_devices([output])))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        if len(output_tensors) != 1 or len(input_tensors[0]) != self._size:
            raise InvalidArgumentError("netreduce reduce_scatter: one output and size() inputs")
        flat = torch.cat([t.reshape(-1) for t in input_tensors[0]])
        return self._scatter_rows(flat, output_tensors[0], "reduce_scatter", opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self._scatter_rows(input.reshape(-1), output, "reduce_scatter_tensor", opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        works = [self._scatter_rows(i.reshape(-1), o, "reduce_scatter_tensor_coalesced", opts)
                 for o, i in zip(outputs, inputs)]
        return works[-1] if works else self._work([], [], [])  # completed in order

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """all_to_all_single: the Horovod API's alltoall (relayed through the
        aggregator as all-gathers; scatter_gather.alltoall_async says why)."""
        splits = torch.tensor(list(input_split_sizes), dtype=torch.int32) \
            if input_split_sizes else None
        handle = scatter_gather.alltoall_async(input.contiguous(), splits)

        def finish(results):
            with torch.no_grad():
                output.copy_(results[0][0].view_as(output))
            return [output]
        return _create_work_from_future(completer.submit([handle], finish, cuda_devices([output])))

    def alltoall(self, output_tensors, input_tensors, opts=None):
        flat = torch.cat([t.reshape(t.shape[0] if t.dim() else 1, -1) for t in input_tensors]) \
            if input_tensors[0].dim() else torch.stack(list(input_tensors))
        splits = torch.tensor([t.shape[0] if t.dim() else 1 for t in input_tensors],
                              dtype=torch.int32)
        handle = scatter_gather.alltoall_async(flat.contiguous(), splits)

        def finish(results):
            got, received = results[0]
            with torch.no_grad():
                start = 0
                for out, rows in zip(output_tensors, received.tolist()):
                    out.copy_(got[start:start + rows].reshape(out.shape))
                    start += rows
            return output_tensors
        return _create_work_from_future(
            completer.submit([handle], finish, cuda_devices(list(output_tensors))))

    def barrier(self, opts=None):
        # The core's barrier blocks its caller, so the completer thread calls it: the
        # Work completes when every rank has arrived, and dist.barrier() (which waits
        # on the Work) still blocks. Running it there also orders it after the
        # collectives issued before it and keeps two barriers from being in flight
        # at once (they share one name in the core).
        def arrive(_):
            with _ps.using(self._process_set):
                _nr.barrier()
        return _create_work_from_future(completer.submit([], arrive))

    def shutdown(self) -> None:
        pass  # netreduce outlives its process groups; hvd-style shutdown() ends it

    def abort(self) -> None:
        pass


def _unsupported(collective: str):
    def method(self, *args, **kwargs):
        raise UnsupportedError(
            f"the netreduce process group does not implement {collective}; it supports "
            "allreduce, allreduce_coalesced, broadcast, allgather, all_gather_into_tensor, "
            "reduce_scatter, reduce_scatter_tensor, all_to_all(_single), reduce and barrier. Use a gloo group for the rest: "
            "dist.new_group(backend='gloo')")
    method.__name__ = collective
    return method


for _collective in ("gather", "scatter", "send", "recv", "recv_anysource", "allgather_coalesced",
                    "monitored_barrier"):
    setattr(ProcessGroupNetReduce, _collective, _unsupported(_collective))


_embedded_switch = None


def _process_start() -> float:
    """When this process started (wall clock): its /proc entry's creation time, else
    the import of this module."""
    try:
        return os.stat(f"/proc/{os.getpid()}").st_ctime
    except OSError:
        return _IMPORTED


_IMPORTED = time.time()
# How much older than this process the aggregator record of its own round may look:
# clock skew between torchrun's nodes. A record of an earlier round is older by the
# whole restart (workers stopped, a new rendezvous, workers started): seconds.
RECORD_SKEW_S = 0.5


def _ensure_aggregator(store: Any, rank: int, size: int) -> None:
    """Under a launcher that starts no aggregator (torchrun) and without
    NETREDUCE_SWITCH, rank 0 starts one and tells the others its address through
    torch's own store, the rendezvous every rank already shares.

    torchrun --nnodes MIN:MAX restarts every worker at each membership change and
    (sharing its TCPStore across rounds) hands the new workers the same store, keys
    of the previous round included: so the record says when it was written and for
    how many ranks, and the other ranks wait for one written by this round's rank 0
    — after they started, for this world size — instead of dialing a gone aggregator."""
    global _embedded_switch
    if mpi_ops.is_initialized() or size == 1 or config.get("NETREDUCE_SWITCH"):
        return
    key = "netreduce/aggregator"
    if rank == 0:
        from netreduce.switch import spawn_for_job
        single_host = environment.discover().local_size == size
        # The job's secret (the user's, else a fresh one) travels with the address
        # through the store, and the aggregator admits only ranks that prove it: one
        # listening on every address must not take jobs by name alone.
        secret = auth.job_secret_or_new()
        host = "127.0.0.1" if single_host else (config.launcher_environment().get("MASTER_ADDR")
                                                 or socket.getfqdn())
        # An IPv6 MASTER_ADDR: listen on "::" (IPv4 and IPv6 ranks alike), else IPv4's.
        listen = "127.0.0.1" if single_host else ("::" if ":" in host else "0.0.0.0")
        # NETREDUCE_TLS_CERT: the job's own servers speak TLS (netreduce/protocol/tls.py).
        _embedded_switch = spawn_for_job(listen)
        atexit.register(_embedded_switch.stop)
        address = format_address((host, _embedded_switch.address[1]))
        store.set(key, json.dumps({"address": address, "secret": secret, "size": size,
                                   "written": time.time()}))
    else:
        address, secret = _published(store, key, size)
    parse_address(address, what="the aggregator address in torch's store")
    # netreduce.init() reads the aggregator address and job secret from its configuration
    config.set_for_process("NETREDUCE_SWITCH", address)
    config.set_for_process("NETREDUCE_JOB_SECRET", secret)


def _published(store: Any, key: str, size: int) -> Tuple[str, str]:
    """The aggregator record this round's rank 0 wrote (see _ensure_aggregator)."""
    started = _process_start() - RECORD_SKEW_S
    deadline = time.monotonic() + float(config.get("NETREDUCE_START_TIMEOUT"))
    while True:
        record = json.loads(store.get(key).decode())  # waits for the first one
        if record["written"] >= started and record["size"] == size:
            return record["address"], record["secret"]
        if time.monotonic() >= deadline:
            raise ControlPlaneError(
                f"rank of {size}: the aggregator record in torch's store was written at "
                f"{record['written']:.3f} for {record['size']} ranks, before this process "
                f"started ({started:.3f}); this round's rank 0 did not publish its aggregator "
                "within NETREDUCE_START_TIMEOUT (or the nodes' clocks differ by more than "
                f"{RECORD_SKEW_S} s: set NETREDUCE_SWITCH to an aggregator instead)")
        time.sleep(0.1)


def stop_embedded_aggregator() -> None:
    """Stop the aggregator this process started for the job (rank 0 without
    NETREDUCE_SWITCH), if any: for hosts whose workers outlive the job (Ray's)."""
    global _embedded_switch
    switch, _embedded_switch = _embedded_switch, None
    if switch is not None:
        switch.stop()


def _label_torchrun_node() -> None:
    """Under torchrun, LOCAL_RANK/LOCAL_WORLD_SIZE number the ranks of one agent (a
    node, GROUP_RANK): two agents on one machine are two nodes to torchrun, so they
    are two hosts to netreduce's layout check too (NETREDUCE_HOST_LABEL; a label
    only ever splits a machine, so one agent per machine changes nothing)."""
    env = config.launcher_environment()
    if config.get("NETREDUCE_HOST_LABEL") or not env.get("TORCHELASTIC_RUN_ID") or \
            env.get("GROUP_RANK") is None:
        return
    config.set_for_process("NETREDUCE_HOST_LABEL", f"torchrun-node-{env['GROUP_RANK']}")


def _create(opts, backend_options=None):
    """torch's extended creator API: it names the group's ranks in the job."""
    store, rank, size = opts.store, opts.group_rank, opts.group_size
    ranks = list(getattr(opts, "global_ranks_in_group", []) or [])
    if not ranks:  # the default group
        _label_torchrun_node()
        _ensure_aggregator(store, rank, size)
    group = ProcessGroupNetReduce(store, rank, size, opts.timeout, global_ranks=ranks)
    ddp_auto.install()  # DDP on this group overlaps by default (NETREDUCE_DDP_OVERLAP)
    return group


def _on_group_set(method):
    """Run a collective's core calls on the group's process set."""
    def wrapper(self, *args, **kwargs):
        with _ps.using(self._process_set):
            return method(self, *args, **kwargs)
    wrapper.__name__ = method.__name__
    return wrapper


for _method in ("allreduce", "allreduce_coalesced", "reduce", "broadcast", "allgather",
                "all_gather_single", "all_gather_single_coalesced", "reduce_scatter",
                "reduce_scatter_single", "reduce_scatter_single_coalesced", "alltoall_base",
                "alltoall"):
    setattr(ProcessGroupNetReduce, _method, _on_group_set(getattr(ProcessGroupNetReduce, _method)))
for _alias, _method in (("_allgather_base", "all_gather_single"),
                        ("allgather_into_tensor_coalesced", "all_gather_single_coalesced"),
                        ("_reduce_scatter_base", "reduce_scatter_single"),
                        ("reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced")):
    setattr(ProcessGroupNetReduce, _alias, getattr(ProcessGroupNetReduce, _method))


def _rendezvous(url: str, timeout: datetime.timedelta = datetime.timedelta(minutes=5),
                **kwargs):
    """init_method="netreduce://": rank and size from netreduce, a TCPStore on rank 0."""
    if not mpi_ops.is_initialized():
        topo = environment.discover()
        if topo.size > 1 and not config.get("NETREDUCE_SWITCH"):
            # The embedded aggregator's address travels through torch's store, and
            # this rendezvous is what creates that store: nothing to publish it in.
            raise _nr.NetReduceError(
                f"rank {topo.rank} of {topo.size} (from {topo.launcher}): "
                "init_method='netreduce://' needs an aggregator address in "
                "NETREDUCE_SWITCH (netreduce-run sets it); under torchrun either export "
                "NETREDUCE_SWITCH=host:port or use init_method='env://' (the default), "
                "with which rank 0 starts an aggregator itself")
        mpi_ops.init()
    rank, size = mpi_ops.rank(), mpi_ops.size()
    if rank == 0:
        store = dist.TCPStore("0.0.0.0", 0, size, True, timeout, wait_for_workers=False)
        host = "127.0.0.1"
        if mpi_ops.local_size() != size:  # ranks on other hosts must reach this one
            try:
                host = socket.gethostbyname(socket.getfqdn())
            except OSError:
                host = socket.gethostname()
        address = (host, store.port)
        _nr.broadcast_object(address, 0)
    else:
        host, port = _nr.broadcast_object(None, 0)
        store = dist.TCPStore(host, port, size, False, timeout)
    yield store, rank, size
    raise UnsupportedError("netreduce:// rendezvous does not support re-rendezvous")


def register() -> None:
    """Make "netreduce" a torch.distributed backend (idempotent)."""
    if not dist.is_available() or BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True,
                                  devices=["cpu", "cuda"])
    dist.register_rendezvous_handler("netreduce", _rendezvous)
