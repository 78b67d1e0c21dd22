"""Types of netreduce._native, the pybind11 module built from native/ (bindings in
native/python/bindings.cc). Buffers cross by the buffer protocol without copies and
must be C-contiguous; every wait releases the GIL. Users go through
netreduce.worker.dataplane (connect(address, job, rank, size) -> Connection) instead.

A default is written ``= ...``: its value is the binding's (from engine.h), never
repeated here. Settings the Python side declares (knobs, netreduce-switch's flags)
have none: callers pass them (netreduce/switch/settings.py: aggregator_args).
tests/unit/test_native_surface.py checks this file against the binding."""
from typing import Any, Dict, List, Mapping, Optional, Tuple

DTYPES: Dict[str, int]  # float32, float64, float16, bfloat16, int32, int64 -> wire code
OPS: Dict[str, int]     # sum, min, max, product -> wire code
DEFAULT_PORT: int
MAX_PAYLOAD: int
ROCE_MAX_PAYLOAD: int
HEADER_BYTES: int
MAX_RANKS: int


class EngineError(RuntimeError): ...
class TimeoutError(EngineError): ...   # no result within the engine's total time
class AbortedError(EngineError): ...   # Engine.abort() was called
class RefusedError(EngineError): ...   # the aggregator refused (limits, bad job)


def build_info() -> Dict[str, Any]: ...


# The native configs' defaults, what C++ callers get (aggregator.h, engine.h).
AGGREGATOR_DEFAULTS: Dict[str, Any]
ENGINE_DEFAULTS: Dict[str, Any]


class Aggregator:
    def __init__(self, host: str, port: int, *, udp_offload: str, icrc_check: str,
                 slots: int, payload_bytes: int, max_jobs: int, threads: int,
                 memory_limit: int, fanout: str, group_base: str, transport: str,
                 xdp_device: str, xdp_mode: str, xdp_fallback: bool, data_nice: int) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    @property
    def port(self) -> int: ...
    @property
    def slots(self) -> int: ...
    @property
    def payload_bytes(self) -> int: ...
    @property
    def threads(self) -> int: ...
    @property
    def data_nice(self) -> int: ...  # the data threads' nice as set (data_nice, or inherited)
    @property
    def fanout(self) -> str: ...  # "unicast", "multicast", "auto" or "segment" (--fanout)
    @property
    def data_path(self) -> str: ...  # e.g. "udp gso+gro" (NETREDUCE_UDP_OFFLOAD)
    def add_job(self, size: int, key: int, payload_bytes: int = ...) -> int: ...
    def set_job_payload(self, index: int, payload_bytes: int) -> None: ...
    def remove_job(self, index: int) -> None: ...
    # The data address (job, rank) registered: contributions from host, UDP ports
    # port..port+span-1 only (span 0: any port); others are dropped (drop_bad_source).
    def bind_rank(self, index: int, rank: int, host: str, port: int, span: int = ...) -> None: ...
    def rank_source(self, index: int, rank: int) -> str: ...  # in words; "no address"
    def set_job_ordered(self, index: int) -> None: ...  # NETREDUCE_DETERMINISTIC
    def set_job_group(self, index: int, on: bool) -> None: ...  # --fanout segment
    # Two levels: members, and on a rack aggregator the uplink to the spine's job
    # (spine_host, spine_port, spine_threads, job_index, rank, key, local_host,
    # rto_floor_us, drop_rate, drop_results); native/aggregator/uplink.h.
    def set_job_tree(self, index: int, members: List[int],
                     uplink: Optional[Mapping[str, Any]] = ...) -> None: ...
    def group(self, index: int) -> Tuple[str, int]: ...
    def transport_info(self) -> Dict[str, Any]: ...  # transport, ports, notes, fallback[, device, mode]
    def transport_stats(self) -> Dict[str, Any]: ...  # ports: per port by path; program: XDP counters
    def counters(self) -> Dict[str, int]: ...
    def job_counters(self, index: int) -> Dict[str, int]: ...
    # A verbs rank's UC queue pair and result ring; returns the results' first PSN.
    def attach_verbs_peer(self, index: int, rank: int, ip: str, qpn: int, ring_va: int,
                          rkey: int, entries: int, stride: int, rc: bool = ...,
                          worker_psn: int = ...) -> int: ...
    # The per-packet path by hand, for tests: steps ("datagram", receive, thread, packet,
    # from_host, from_port, local_host), ("bind", index, rank, host, port, span),
    # ("remove", index); each step's queued results' destinations, "host:port".
    def receive_script(self, steps: List[Tuple[Any, ...]]) -> List[List[str]]: ...


def path_mtu(host: str, port: int = ...) -> Tuple[int, bool]: ...  # (mtu, is IPv6)
def payload_for_mtu(mtu: int, ipv6: bool = ...) -> int: ...
# The packet path a data socket gets here with NETREDUCE_UDP_OFFLOAD's value.
def udp_data_path(udp_offload: str) -> str: ...
# SO_RCVBUF a rank's data socket gets here (read back: twice the bytes) and whether it
# coalesces received datagrams (UDP_GRO); engine_receive_buffer_asked: what it asks.
def udp_receive_buffer(udp_offload: str) -> Tuple[int, bool]: ...
engine_receive_buffer_asked: int
# XOR into an ICRC computed for IPv4 ID 0 to get the one for ID `id` (UDP GSO).
def icrc_ip_id_delta(datagram_bytes: int, id: int) -> int: ...
# A RoCEv2 datagram's UDP payload: 32-byte header, padded payload, ICRC.
def datagram_bytes(payload_bytes: int) -> int: ...
# engine/nap.h's NapRest over scripted message verdicts ("off", "kept", "-"): which napped.
def nap_rest_script(verdicts: List[str]) -> List[bool]: ...
# engine/nap.h's NapClock over scripted (time us, datagrams, outstanding) drains: each
# drain's nap (0: none) and whether the message's naps ended Off.
def nap_clock_script(skip: int, coalesced: int, drains: List[Tuple[int, int, int]]) -> Tuple[List[int], bool]: ...
# The slot arithmetic alone: `inputs` (wire-type buffers) folded in order on a kernel
# set ("auto", "generic", "avx2+f16c"); the result's bytes, in the wire type.
def reduce_kernel(dtype: int, op: int, inputs: List[Any], simd: str = ...) -> bytes: ...


class Request:
    def done(self) -> bool: ...
    def wait(self) -> None: ...


class Engine:
    def __init__(self, host: str, port: int, threads: int, job: str, job_index: int,
                 rank: int, size: int, key: int, slots: int, payload_bytes: int, *,
                 window: int, retransmit_ms: float, timeout_s: float, drop_rate: float,
                 udp_offload: str, icrc_check: str, seed: int = ..., group: str = ...,
                 group_port: int = ..., fanout: str = ...,  # the aggregator's --fanout
                 transport: Optional["VerbsTransport"] = ...,
                 data_fd: int = ...) -> None: ...  # a bound UDP socket to take over
    def submit(self, src: Any, dst: Any, dtype: int, op: int,
               owner: int = ...,  # owner >= 0: reduce-scatter shard
               scale: float = ...) -> Request: ...  # results times scale (f32/f64 sum)
    def allreduce(self, src: Any, dst: Any, dtype: int, op: int) -> None: ...
    def vote_step(self, src: Any, buf: Any, out: Any, factor: float,
                  ranks: int) -> int: ...  # as Hierarchical.vote_step
    def abort(self, reason: str) -> None: ...
    def stats(self) -> Dict[str, int]: ...
    @property
    def aggregator_address(self) -> str: ...
    @property
    def data_path(self) -> str: ...
    @property
    def receive_buffer_bytes(self) -> int: ...  # SO_RCVBUF read back; 0 on verbs
    @property
    def group_note(self) -> str: ...  # why fanout auto's group was left out ("" = none)


class ShmSegment:  # native/shm/segment.h: one memfd per host job
    @staticmethod
    def create(local_size: int, chunk_bytes: int, depth: int) -> "ShmSegment": ...
    @staticmethod
    def attach(pid: int, fd: int, nonce: int, local_rank: int) -> "ShmSegment": ...
    @property
    def fd(self) -> int: ...
    @property
    def nonce(self) -> int: ...
    @property
    def size(self) -> int: ...


class Hierarchical:  # native/algorithms/hierarchical.h; takes the segment over
    def __init__(self, segment: ShmSegment, engine: Optional[Engine], ranks: List[int],
                 host: str, timeout_s: float, spin_us: float = ...) -> None: ...
    def start(self, attach_timeout_s: float) -> None: ...
    def allreduce(self, src: Any, dst: Any, dtype: int, op: int) -> None: ...
    # Speculation.run_lone's message (native/algorithms/vote_step.h): 0 discarded,
    # 1 complete, 2 complete and a rank has more to say
    def vote_step(self, src: Any, buf: Any, out: Any, factor: float, ranks: int) -> int: ...
    def abort(self, reason: str) -> None: ...
    def stats(self) -> Dict[str, int]: ...
    @property
    def failed_rank(self) -> int: ...


def encode_header(fields: Mapping[str, int]) -> bytes: ...
def decode_header(packet: bytes) -> Dict[str, int]: ...
def compute_icrc(src_ip_be: int, dst_ip_be: int, src_port_be: int, dst_port_be: int,
                 header: bytes, payload: bytes, pad: int) -> int: ...
def compute_icrc_for(src: str, dst: str, src_port: int, dst_port: int,
                     header: bytes, payload: bytes, pad: int,
                     shared_payload_crc: bool = ...) -> int: ...  # IPv4 or IPv6 text


# The verbs transport (native/transport/verbs): only in builds that found libibverbs'
# headers (HAVE_VERBS); `netreduce info` lists it among the transports.
HAVE_VERBS: bool


# device, gid_index, ip, mtu_bytes, max_payload
def probe_verbs(aggregator: str, device: str = ...) -> Dict[str, Any]: ...


class VerbsTransport:
    def __init__(self, aggregator: str, payload_bytes: int, window: int,
                 device: str = ..., rc: bool = ...) -> None: ...
    def info(self) -> Dict[str, Any]: ...  # qpn, psn, ring_va, ring_rkey, ring_entries, ring_stride, ...
    def connect(self, qpn: int, psn: int) -> None: ...
    def counters(self) -> Dict[str, int]: ...  # the port's hw_counters


# The AF_XDP transport (native/transport/xdp), compiled in where libxdp's and libbpf's
# headers and clang were found at build time (HAVE_XDP). XdpPorts opens data ports as
# the aggregator does -- the XDP program on the device, one AF_XDP socket per queue --
# and moves raw datagrams (tests, diagnostics); refusals raise RefusedError.
HAVE_XDP: bool


class XdpPorts:
    def __init__(self, host: str, port: int, device: str = ..., threads: int = ...,
                 mode: str = ..., zero_copy: bool = ...) -> None: ...
    def describe(self) -> List[str]: ...  # per port: "AF_XDP on queue 0 of eth0 (...)"
    def port(self, index: int = ...) -> int: ...
    def send(self, index: int, dst: str, dst_port: int, data: bytes, src: str = ...) -> None: ...
    def recv(self, index: int = ..., timeout_ms: float = ...,
             max: int = ...) -> List[Tuple[bytes, Tuple[str, int], str]]: ...
    def stats(self, index: int = ...) -> Dict[str, int]: ...  # rx_xsk, rx_kernel, tx_xsk, tx_kernel_*, xsk_*
    def info(self) -> Dict[str, Any]: ...  # device, mode, program_id, zero_copy, multi_buffer, notes
    def program_counters(self) -> Dict[str, int]: ...  # steered, passed_other_queue, ...
    def close(self) -> None: ...
