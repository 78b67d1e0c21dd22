"""A rank's connection to one aggregator job: admission over the control port, then
the native engine that streams buffers through the aggregator's slots.

This is the small, typed surface that the communicator, tests and benchmarks use;
the user-facing API lives in netreduce/__init__.py."""
from __future__ import annotations

import functools
import logging
import socket
import threading
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from netreduce import _native, config
from netreduce.algorithms.base import check_reduction
from netreduce.errors import AdmissionError, ControlPlaneError, DataPlaneError
from netreduce.protocol import auth, codec, data_address, messages
from netreduce.protocol.address import format_address, resolve
from netreduce.protocol.client import ControlConnection
from netreduce.protocol.socket_buffers import receive_buffer_note
from netreduce.worker import rack, verbs_transport

log = logging.getLogger("netreduce")
_buffer_warned = False  # once per process: every connection of a host gets the same cap


@functools.lru_cache(maxsize=4)
def _probe_receive_buffer(udp_offload: str) -> Tuple[int, bool]:
    """SO_RCVBUF a data socket gets on this host (read back; 0 when unknown), and
    whether it coalesces received datagrams (UDP_GRO under `udp_offload`). Once per
    process: the cap is the host's and the user's (1,000 ranks joined 7 % slower
    with a probe socket each)."""
    try:
        got, coalesced = _native.udp_receive_buffer(udp_offload)
        return int(got), bool(coalesced)
    except (AttributeError, ValueError, RuntimeError, _native.EngineError):
        return 0, True


def _warn_receive_buffer(engine: Any, where: str) -> None:
    global _buffer_warned
    if _buffer_warned or engine is None:
        return
    note = receive_buffer_note(int(engine.receive_buffer_bytes),
                               int(_native.engine_receive_buffer_asked), where)
    if note:
        _buffer_warned = True
        log.warning("%s", note)


def _translate(exc: Exception, where: str) -> Exception:
    if isinstance(exc, ValueError):
        return exc
    return DataPlaneError(f"{where}: {exc}")


def _fanout(grant: messages.RegisterReply) -> str:
    """The aggregator's --fanout as the grant tells it (the engine's ``fanout``): a
    group the rank may leave out is ``auto``'s."""
    if not grant.group:
        return "unicast"
    return "auto" if grant.group_optional else "multicast"


class Request:
    """An all-reduce in flight on the engine thread. ``where`` names the connection in
    an error: called only when the request fails (building the words per call was
    ~3.7 us of Python at load 20, per data message and round on the executor)."""

    def __init__(self, native_req: Any, result: np.ndarray, where: Callable[[], str]) -> None:
        self._req = native_req
        self._result = result
        self._where = where

    def done(self) -> bool:
        return bool(self._req.done())

    def wait(self) -> np.ndarray:
        try:
            self._req.wait()
        except _native.EngineError as exc:
            raise _translate(exc, self._where()) from None
        return self._result


class Connection:
    """Rank ``rank`` of ``size`` in job ``job`` on the aggregator at ``address``.

    The job's payload follows the path (docs/protocol.md, "Payload size"): this rank
    reports the path MTU it sees toward the aggregator when it registers, and the
    payload is fixed once every rank has. The last rank to register learns it in the
    answer; the others ask in the background, and their first operation (or stats())
    waits, at most ``timeout`` seconds, for the ranks that have not registered yet."""

    def __init__(self, address: Tuple[str, int], job: str, rank: int, size: int, *,
                 timeout: Optional[float] = None, retransmit_ms: Optional[float] = None,
                 drop_rate: Optional[float] = None, window: Optional[int] = None,
                 seed: int = 0, deterministic: Optional[bool] = None,
                 reach_for: float = 0.0) -> None:
        # Unset arguments take the NETREDUCE_* knobs (declared in netreduce.config).
        timeout = config.get("NETREDUCE_TIMEOUT") if timeout is None else timeout
        retransmit_ms = config.get("NETREDUCE_RETRANSMIT_MS") if retransmit_ms is None else retransmit_ms
        drop_rate = config.get("NETREDUCE_DROP_RATE") if drop_rate is None else drop_rate
        window = config.get("NETREDUCE_WINDOW") if window is None else window
        if deterministic is None:
            deterministic = config.get("NETREDUCE_DETERMINISTIC")
        self.job, self.rank, self.size = job, rank, size
        self.address = (address[0], int(address[1]))
        self.timeout = timeout
        # Two levels: data through this host's rack aggregator (worker/rack.py).
        self.rack = rack.parse(config.get("NETREDUCE_RACK_SWITCH"))
        self._engine_args = dict(window=window, retransmit_ms=retransmit_ms, timeout_s=timeout,
                                 drop_rate=drop_rate, seed=seed,
                                 udp_offload=config.get("NETREDUCE_UDP_OFFLOAD"),
                                 icrc_check=config.get("NETREDUCE_ICRC_CHECK"))
        self._engine: Any = None
        self._closed = False
        self._aborted: Optional[str] = None
        try:
            self.address = resolve(self.address)
        except ValueError as exc:
            raise AdmissionError(f"{self._where()}: {exc}") from None
        try:
            self.path_mtu, ipv6 = _native.path_mtu(self.address[0], self.address[1])
        except (ValueError, _native.EngineError) as exc:
            raise AdmissionError(f"{self._where()}: {exc}") from None
        # NETREDUCE_TRANSPORT: a verbs rank reports the MTU its result packets allow.
        self._verbs = verbs_transport.select(self.address[0], self.path_mtu, self._where)
        if self._verbs is not None:
            self.path_mtu = self._verbs.reported_mtu
        # The socket its data will leave from, bound now: its address is part of the
        # admission, and the aggregator answers that address only (protocol/data_address.py).
        try:
            self._data_socket = data_address.open_socket(*(self.rack or self.address))
        except OSError as exc:
            raise AdmissionError(f"{self._where()}: no data socket toward "
                                 f"{format_address(self.rack or self.address)}: {exc}") from None
        try:
            # reach_for > 0 (a rank's first connection, api.init): the aggregator may
            # not listen yet, so a refused connection is tried again (protocol/tls.py)
            self._control = ControlConnection(self.address, timeout=timeout, reach_for=reach_for)
        except ControlPlaneError as exc:  # unreachable, or TLS refused: say whose connection
            self._data_socket.close()
            raise ControlPlaneError(f"{self._where()}: {exc}") from None
        try:
            # NETREDUCE_JOB_SECRET: proved on a challenge, never sent (protocol/auth.py).
            proof = auth.prove_on(self._control, auth.job_secret(), job, rank)
            # What this host's UDP socket holds of a burst of results: the job's window
            # is held to the smallest rank's (protocol/socket_buffers.py).
            buffer, coalesced = (0, True) if self._verbs is not None else _probe_receive_buffer(
                str(config.get("NETREDUCE_UDP_OFFLOAD")))
            grant = self._control.request(messages.Register(
                job=job, rank=rank, size=size, mtu=self.path_mtu, ipv6=ipv6,
                host=socket.gethostname(), await_payload=True, deterministic=bool(deterministic),
                window=int(window), receive_buffer=buffer, receive_coalesced=coalesced,
                data_address=data_address.address_of(self._data_socket),
                rack=format_address(self.rack) if self.rack else "",
                # --fanout segment keeps a verbs rank's job on unicast
                verbs=self._verbs is not None,
                epoch=int(config.get("NETREDUCE_EPOCH") or 0), auth=proof))
        except ControlPlaneError as exc:
            self._control.close()
            self._data_socket.close()
            raise AdmissionError(str(exc)) from None
        self._grant: messages.RegisterReply = grant
        self.job_index = grant.job_index
        self.key = grant.key
        self.slots = grant.slots
        self.window_fit = grant.window_fit  # 0: all slots, or NETREDUCE_WINDOW
        self.window = 0  # the engine's, once it starts
        self.data_port = grant.data_port
        self.threads = grant.threads
        self.payload_bytes = grant.payload_bytes  # 0: not fixed yet
        self.payload_reason = grant.payload_reason
        # Slots fold contributions in rank order (NETREDUCE_DETERMINISTIC, agreed at admission).
        self.deterministic = grant.deterministic
        self._missing: list = list(grant.missing)  # the first few (MISSING_SHOWN)
        self._missing_count = grant.missing_count
        self._start_error: Optional[Exception] = None
        self._started = threading.Event()
        if self.payload_bytes:  # the last rank to register (or a job of one)
            try:
                self._start_engine()
            except Exception:
                self._control.close()
                raise
        else:  # learn the payload as soon as the last rank registers
            threading.Thread(target=self._await_then_start, daemon=True,
                             name=f"netreduce-payload-{job}-{rank}").start()

    def _where(self) -> str:
        via = f" via rack aggregator {format_address(self.rack)}" if self.rack else ""
        return (f"aggregator {format_address(self.address)}{via}, job '{self.job}', "
                f"rank {self.rank}/{self.size}")

    def _start_engine(self) -> None:
        try:
            host = rack.join(self) if self.rack else self.address[0]
        except Exception:
            self._started.set()
            raise
        grant = self._grant
        args = dict(self._engine_args)
        if not args.get("window") and self.window_fit:  # the job's, for the smallest buffer
            args["window"] = self.window_fit
        self.window = min(int(args.get("window") or 0) or self.slots, self.slots)  # in use
        try:
            transport = self._verbs.connect(self) if self._verbs is not None else None
            self._engine = _native.Engine(
                host, self.data_port, self.threads, self.job, self.job_index,
                self.rank, self.size, self.key, self.slots, self.payload_bytes,
                group=grant.group, group_port=grant.group_port, fanout=_fanout(grant),
                transport=transport, data_fd=self._data_socket.detach(), **args)
        except Exception as exc:
            raise _translate(exc, self._where()) from None
        finally:
            self._started.set()
        _warn_receive_buffer(self._engine, self._where())
        note = getattr(self._engine, "group_note", "")
        if note:  # --fanout auto: results come by unicast instead, at no loss of time
            log.info("%s: not joining the job's multicast group %s (%s); its results come "
                     "by unicast", self._where(), grant.group, note)
        if self._closed:  # close() came while it started: release it too
            self._engine = None
        elif self._aborted is not None:
            self._engine.abort(self._aborted)

    def _await_then_start(self) -> None:
        """Background: ask the aggregator (1 s per request) until every rank has
        registered and the payload is fixed, then start the engine."""
        try:
            while not self.payload_bytes and not self._closed:
                reply = self._control.request(messages.Payload(wait=1.0), timeout=15.0)
                self._missing = list(reply.missing)
                self._missing_count = reply.missing_count
                self.payload_reason = reply.payload_reason
                self.payload_bytes = reply.payload_bytes
                if self.payload_bytes:  # the job's slots follow its payload
                    self.slots = reply.slots if reply.slots is not None else self.slots
                    self.window_fit = reply.window_fit or 0
                    if reply.group is not None:  # --fanout segment decides it with the payload
                        g = self._grant
                        g.group, g.group_port, g.group_optional = \
                            reply.group, reply.group_port or 0, bool(reply.group_optional)
            if not self._closed:
                self._start_engine()
        except Exception as exc:  # handed to the first operation
            self._start_error = exc if isinstance(exc, DataPlaneError) else \
                DataPlaneError(f"{self._where()}: {exc}")
        finally:
            self._started.set()

    def _live(self) -> Any:
        """The native engine, or DataPlaneError once close() released it. Until every
        rank has registered, waits for that at most ``timeout`` seconds."""
        if self._closed:
            raise DataPlaneError(f"{self._where()}: this connection was closed; "
                                 "connect() again to reduce more")
        engine = self._engine
        if engine is not None:
            return engine
        if not self._started.wait(self.timeout):
            missing = ", ".join(map(str, self._missing)) or "?"
            if self._missing_count > len(self._missing):
                missing += f" and {self._missing_count - len(self._missing)} more"
            raise DataPlaneError(
                f"{self._where()}: rank(s) {missing} have not registered with the aggregator "
                f"within {self.timeout:g} s (the job's payload is fixed, and data flows, "
                "once every rank has)")
        if self._start_error is not None:
            raise self._start_error
        if self._engine is None:
            raise DataPlaneError(f"{self._where()}: this connection was closed; "
                                 "connect() again to reduce more")
        return self._engine

    def allreduce_async(self, src: np.ndarray, dst: Optional[np.ndarray] = None, op: str = "sum",
                        dtype: Optional[str] = None, owner: int = -1,
                        scale: float = 1.0) -> Request:
        """Start reducing ``src`` across the job's ranks into ``dst`` (``src`` itself
        when None). Both arrays must stay untouched until the request is done.
        ``owner`` >= 0: a reduce-scatter shard, whose sum only rank ``owner``
        receives (the aggregator sends the others completion notices; their ``dst``
        is left as it was). ``owner`` -2: chunk c's sum goes to rank c mod N (a
        chunk-interleaved reduce-scatter, netreduce/algorithms/flat.py). ``scale``
        (float32 and float64 sums, owner -1): ``dst`` receives the sum times
        ``scale``, as numpy multiplies it, in the engine's copy of each result into
        place (an Average's 1/N without a second pass over ``dst``)."""
        src, dst, name = check_reduction(src, dst, op, dtype, "the aggregator")
        engine = self._live()
        try:
            req = engine.submit(src, dst, _native.DTYPES[name], _native.OPS[op], owner, scale)
        except _native.EngineError as exc:
            raise _translate(exc, self._where()) from None
        return Request(req, dst, self._where)

    def chunk_elements(self, accum_width: int) -> int:
        """Elements per chunk (packet) of a dtype whose slot accumulator has
        ``accum_width`` bytes per element, as the engine cuts messages."""
        self._live()  # the payload is fixed once every rank has registered
        return self.payload_bytes // accum_width

    def allreduce(self, src: np.ndarray, dst: Optional[np.ndarray] = None, op: str = "sum",
                  dtype: Optional[str] = None, scale: float = 1.0) -> np.ndarray:
        """Reduce ``src`` across ranks; the result (times ``scale``, as in
        allreduce_async) lands in ``dst`` (or in place)."""
        return self.allreduce_async(src, dst, op, dtype, -1, scale).wait()

    @property
    def vote_step(self) -> Optional[Callable[..., int]]:
        """A steady step's whole message in one native call (Speculation.run_lone,
        native/algorithms/vote_step.h): 0 discarded, 1 complete, 2 complete with more
        to say. None with a native module built before it."""
        return self._vote_step if hasattr(_native.Engine, "vote_step") else None

    def _vote_step(self, src: np.ndarray, buf: np.ndarray, out: np.ndarray, factor: float,
                   ranks: int) -> int:
        engine = self._live()
        try:
            return int(engine.vote_step(src, buf, out, factor, ranks))
        except _native.EngineError as exc:
            raise _translate(exc, self._where()) from None

    def abort(self, reason: str) -> None:
        """Fail the pending and all later operations with DataPlaneError(reason)."""
        if self._closed:
            self._live()  # raises: closed
        self._aborted = reason
        if self._engine is not None:
            self._engine.abort(reason)

    @property
    def data_path(self) -> str:
        """The engine's packet path, e.g. 'udp gso+gro' (NETREDUCE_UDP_OFFLOAD), or
        'verbs' for a queue pair."""
        return self._live().data_path or "verbs"

    def stats(self) -> Dict[str, int]:
        """The engine's counters, and the job's payload_bytes (payload_reason says why)."""
        return dict(self._live().stats(), payload_bytes=self.payload_bytes)

    def control_socket(self) -> socket.socket:
        """The control connection's socket, for watching (never reading): the
        aggregator closing it means it stopped or died (netreduce/worker/failover.py)."""
        return self._control.sock

    def counters(self) -> Dict[str, Any]:
        """The aggregator's counters (global and per job)."""
        self._live()
        return codec.to_builtins(self._control.request(messages.Counters()))

    def close(self) -> None:
        """Release the engine and this rank's place in the job; closing twice is
        harmless."""
        if self._closed or not hasattr(self, "_control"):
            return
        self._closed = True
        engine, self._engine = self._engine, None
        del engine
        self._data_socket.close()  # unless the engine took it over (detached: a no-op)
        try:
            self._control.request(messages.Release(), timeout=2.0)
        except ControlPlaneError:
            pass
        self._control.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(address: Tuple[str, int], job: str, rank: int, size: int, **kw: Any) -> Connection:
    """Admit (job, rank, size) at the aggregator and open the data plane."""
    return Connection(address, job, rank, size, **kw)
