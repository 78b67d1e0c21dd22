"""The control protocol's schema: every request and every reply, declared once, used
by the ranks (netreduce/protocol/connection.py) and by the aggregator's control port
(netreduce/switch/server.py) alike.

The wire is one JSON object per line each way, as before, now read and written by
msgspec against these types (netreduce/protocol/codec.py): a request is a tagged union on ``cmd`` (each class below
with a ``tag`` is one command), decoded and validated in one pass; a field with the
wrong type, a number out of range or a missing field is refused naming the field
(``malformed 'register' request: Expected `int`, got `float` - at `$.size```) before
any handler sees it. A reply is ``{"ok":true, "id":ID?, ...the reply's fields}`` or
``{"ok":false, "id":ID?, "error":TEXT}``; ``id`` is the request's own, when it had one
(requests with an id may be answered in any order: netreduce/switch/loop.py).

The first request on every connection is ``hello`` with the client's ``version``
(PROTOCOL_VERSION); the aggregator answers with its own, or refuses a client of
another version with a message naming both, and closes. Protocol 1 was the
schemaless JSON lines before this module: its clients send ``register`` (or any
other command) first, and are refused the same way.

Adding a field, a command or a reply: docs/protocol.md, "The schema" (and
/work/team/notes/proto.md). In short: a field with a default that an older peer may
ignore needs nothing else; a field the other side must understand, a removed field,
or a changed meaning bumps PROTOCOL_VERSION.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Type, Union

from msgspec import Meta, Struct

try:
    from typing import Annotated
except ImportError:  # pragma: no cover - Python < 3.9
    from typing_extensions import Annotated  # type: ignore[assignment]

from netreduce.protocol.signature import Signature

# 1: the schemaless JSON lines (no hello); 2: this schema.
PROTOCOL_VERSION = 2

# Numbers that reach the native aggregator are bounded here, so that an absurd value
# is refused naming its field instead of reaching the binding (whose own message,
# pybind11's signature text, must never go back to a client).
U8 = Annotated[int, Meta(ge=0, le=0xFF)]
U16 = Annotated[int, Meta(ge=0, le=0xFFFF)]
U32 = Annotated[int, Meta(ge=0, le=0xFFFFFFFF)]
U64 = Annotated[int, Meta(ge=0, le=(1 << 63) - 1)]  # msgspec bounds fit an int64
I32 = Annotated[int, Meta(ge=-(1 << 31), le=(1 << 31) - 1)]
# A rank or a world size: the wire's 12-bit rank field less the group rank
# (native/wire/roce.h) is the largest world, 4095; the handlers say why a value in
# range is wrong (a rank outside the world, a size unlike the job's).
Rank = Annotated[int, Meta(ge=-(1 << 31), le=(1 << 31) - 1)]
Seconds = Annotated[float, Meta(ge=-1e9, le=1e9)]
Text = Annotated[str, Meta(max_length=4096)]
Name = Annotated[str, Meta(max_length=1024)]


class Auth(Struct, forbid_unknown_fields=False):
    """A job-secret proof (protocol/auth.py): the job's Ed25519 public key and its
    signature over the connection's nonce, the job and the rank."""
    pub: Annotated[str, Meta(max_length=128)]
    sig: Annotated[str, Meta(max_length=256)]


class Request(Struct, tag_field="cmd", kw_only=True, omit_defaults=True):
    """Every request: ``id`` (optional) lets several be in flight on one connection."""
    id: Optional[int] = None


class Reply(Struct, kw_only=True):
    """Every reply's fields, less the envelope (ok, id, error) the encoder adds. All
    written, defaults too: a reply is read by tools and tests as well as by ranks."""


class Empty(Reply):
    pass


# --- the connection -----------------------------------------------------------------
class Hello(Request, tag="hello"):
    """The first request on every connection: the protocol the client speaks."""
    version: int
    software: Text = ""  # "netreduce 0.1.0": for the refusal's words


class HelloReply(Reply):
    version: int
    software: str = ""


class Ping(Request, tag="ping"):
    pass


class Challenge(Request, tag="challenge"):
    """A fresh nonce for one job-secret (or operator) proof on this connection."""


class ChallengeReply(Reply):
    nonce: str


# --- admission (netreduce/switch/server.py) -----------------------------------------
class Register(Request, tag="register"):
    job: Name
    rank: Rank
    size: Rank
    mtu: U32 = 0                       # the path MTU the rank sees toward the aggregator
    ipv6: bool = False
    host: Name = ""
    await_payload: bool = False        # this rank will ask ``payload`` for the final one
    deterministic: bool = False        # NETREDUCE_DETERMINISTIC
    window: Optional[I32] = None       # NETREDUCE_WINDOW (None: not said; 0: all slots)
    receive_buffer: U64 = 0            # SO_RCVBUF of a probe socket, read back
    receive_coalesced: bool = True     # the socket coalesces datagrams (UDP GRO)
    epoch: U32 = 0                     # an elastic job's membership (switch/epochs.py); 0: none
    # IP:PORT of the UDP socket the rank's data will come from (protocol/data_address.py):
    # the aggregator takes its contributions from there only. Required (None: refused).
    data_address: Optional[Name] = None
    rack: Name = ""                    # IP:PORT of its rack aggregator, when it has one
    verbs: bool = False                # on the verbs transport (--fanout segment: unicast)
    auth: Optional[Auth] = None


class RegisterReply(Reply):
    job_index: int
    key: int
    slots: int
    payload_bytes: int                 # 0 until every rank of the job has registered
    payload_reason: str = ""
    window_fit: int = 0
    missing: List[int] = []            # the first ranks not registered yet
    missing_count: int = 0
    data_port: int = 0
    threads: int = 1
    deterministic: bool = False
    group: str = ""
    group_port: int = 0
    group_optional: bool = False


class Payload(Request, tag="payload"):
    """Wait (at most ``wait`` s, 5 at most) for the job's final payload."""
    wait: Seconds = 0.0


class PayloadReply(Reply):
    payload_bytes: int                 # 0: not final yet
    payload_reason: str = ""
    missing: List[int] = []
    missing_count: int = 0
    slots: Optional[int] = None        # with the final payload
    window_fit: Optional[int] = None
    group: Optional[str] = None        # with the final payload (--fanout segment decides it)
    group_port: Optional[int] = None
    group_optional: Optional[bool] = None


class Release(Request, tag="release"):
    pass


class Counters(Request, tag="counters"):
    job: Optional[Name] = None         # read one job with its secret ...
    rank: Rank = -1
    auth: Optional[Auth] = None
    operator: Optional[Annotated[str, Meta(max_length=128)]] = None  # ... or all: the operator


class CountersReply(Reply, rename={"global_": "global"}):
    global_: Dict[str, Any] = {}
    jobs: Dict[str, Dict[str, Any]] = {}
    hidden_jobs: int = 0
    fanout: str = "unicast"
    transport: Optional[Dict[str, Any]] = None


class FellBack(Request, tag="fell_back"):
    """Rank 0 of a job refused here says it went on elsewhere (a count, no job name)."""
    reason: Name = "other"
    to: Name = "host"


# --- verbs peers (netreduce/switch/verbs.py) ----------------------------------------
class VerbsConnect(Request, tag="verbs_connect"):
    ip: Name
    qpn: U32
    ring_va: U64
    ring_rkey: U32
    ring_entries: U32
    ring_stride: U32
    rc: bool = False
    psn: U32 = 0


class VerbsConnectReply(Reply):
    qpn: int
    psn: int


# --- two levels (netreduce/switch/uplink.py) ----------------------------------------
class RackGrant(Request, tag="rack_grant"):
    rack: Name
    wait: Seconds = 30.0


class RackGrantReply(Reply):
    data_host: str
    job_index: int
    key: int
    slots: int
    data_port: int
    threads: int
    group: str = ""
    group_port: int = 0
    rack: int = 0
    racks: int = 1


class SpineJob(Struct, forbid_unknown_fields=False):
    host: Name
    port: U16
    threads: U16
    job_index: U32
    key: U32
    rank: U16
    racks: U16 = 1


class RackJob(Request, tag="rack_job"):
    job: Name
    size: Rank
    members: List[U16]
    payload_bytes: U32
    spine: SpineJob
    sources: Dict[str, Name] = {}      # member rank -> its data address, as it registered


class RackJobReply(Reply):
    job_index: int
    key: int
    slots: int
    data_port: int
    threads: int
    source: str = ""                   # the rack's address toward the spine (its partials' source)
    group: str = ""
    group_port: int = 0


# --- the job's own rendezvous (netreduce/switch/rendezvous.py) ----------------------
class RvGather(Request, tag="rv_gather"):
    job: Name
    rank: Rank
    size: Rank
    key: Name
    value: Any = None
    wait: Seconds = 30.0
    auth: Optional[Auth] = None


class RvGatherReply(Reply):
    values: List[Any]


class RvRequest(Request, tag="rv_request"):
    job: Name
    rank: Rank
    size: Rank
    gen: int                           # < 0: binds the connection only
    reason: Annotated[str, Meta(max_length=1 << 16)] = ""
    auth: Optional[Auth] = None


class RvWatch(Request, tag="rv_watch"):
    job: Name
    rank: Rank
    size: Rank
    gen: int
    wait: Seconds = 1.0
    auth: Optional[Auth] = None


class RvWatchReply(Reply):
    gen: int = -1                      # -1: no failover request for that generation yet
    reason: str = ""
    rank: int = -1


class JobStatus(Request, tag="job_status"):
    job: Name = ""
    rank: Rank = -1
    auth: Optional[Auth] = None


class JobStatusReply(Reply):
    status: Dict[str, Any]


# --- negotiation (netreduce/switch/coordinator.py) ----------------------------------
class TensorRequest(Struct, omit_defaults=True, forbid_unknown_fields=False):
    """A tensor submitted for negotiation: its name and its signature, field by
    field (netreduce/protocol/signature.py's Signature)."""
    name: Name
    kind: Name
    dtype: Name
    shape: List[int]
    op: Name = ""
    prescale: float = 1.0
    postscale: float = 1.0
    root: int = -1
    cacheable: bool = True

    @classmethod
    def of(cls, name: str, sig: Signature, cacheable: bool = True) -> "TensorRequest":
        return cls(name, sig.kind, sig.dtype, list(sig.shape), sig.op, sig.prescale,
                   sig.postscale, sig.root, cacheable)

    def signature(self) -> Signature:
        return Signature(self.kind, self.dtype, tuple(self.shape), self.op,
                         float(self.prescale), float(self.postscale), int(self.root))


class NegotiateHello(Request, tag="negotiate_hello"):
    job: Name
    rank: Rank
    size: Rank
    role: Name = "poll"                # "all": one multiplexed connection per rank
    threshold: int = 64 << 20          # NETREDUCE_FUSION_THRESHOLD
    capacity: int = 1024               # NETREDUCE_CACHE_CAPACITY
    agree: bool = False                # NETREDUCE_CACHE_AGREEMENT
    timeout: Seconds = 120.0           # NETREDUCE_START_TIMEOUT
    epoch: U32 = 0                     # an elastic job's membership (switch/epochs.py); 0: none
    auth: Optional[Auth] = None


class NegotiateHelloReply(Reply):
    """The job's settings as its first hello gave them: every rank runs the same
    agreement rounds."""
    size: int
    seq: int = 0
    agree: bool = False
    capacity: int = 0
    threshold: int = 0


class LogEntry(Struct, omit_defaults=True, forbid_unknown_fields=False):
    """One fusion group of the coordinator's log (or an error for one tensor)."""
    seq: int
    tensors: List[Union[int, str]]     # each a cache id, or a name (no id)
    assign: Dict[str, int] = {}        # cache ids given here: name -> id
    zeros: List[Optional[TensorRequest]] = []  # joined ranks: what to send zeros for
    last: int = -1                     # a join: the rank that joined last
    error: str = ""                    # a mismatch (Horovod's words), no group


class Stall(Struct, omit_defaults=True, forbid_unknown_fields=False):
    name: str
    missing: List[int]
    age: float = 0.0


class Failure(Struct, omit_defaults=True, forbid_unknown_fields=False):
    """The job failed: a rank died, shut down while needed, or aborted. Entries up
    to ``after`` (a rank that left cleanly) may still run."""
    message: str
    rank: int = -1
    after: Optional[int] = None


class Negotiate(Request, tag="negotiate"):
    """Submit and long-poll: answered once the log has entries past ``ack``, a
    stall to report, the job's failure, or ``wait_ms`` passed."""
    reqs: List[Union[int, TensorRequest]] = []
    ack: int = 0
    wait_ms: Seconds = 0.0
    stall_s: Seconds = 60.0


class NegotiateReply(Reply):
    entries: List[LogEntry] = []
    stalls: List[Stall] = []
    failure: Optional[Failure] = None


class NegotiateSubmit(Request, tag="negotiate_submit"):
    reqs: List[Union[int, TensorRequest]] = []


class NegotiateWatch(Request, tag="negotiate_watch"):
    """Answered only when the job fails (or this rank leaves)."""


class WatchReply(Reply):
    failure: Optional[Failure] = None


class NegotiateBye(Request, tag="negotiate_bye"):
    done: int = -1                     # the last log entry this rank ran


class NegotiateAbort(Request, tag="negotiate_abort"):
    reason: Annotated[str, Meta(max_length=1 << 16)] = "unknown error"


# --- an elastic job's driver (netreduce/launcher/elastic/server.py) -------------------
# The port of netreduce-run's elastic driver speaks this schema too (hello with the
# version first, challenge, then these), with each worker as the client
# (netreduce/worker/elastic_member.py). docs/elastic.md has the protocol.
class ElasticBind(Request, tag="elastic_bind"):
    """Bind the connection to worker HOST:SLOT of ``job``, proving the job's secret
    (for rank -1: a worker has no fixed rank)."""
    job: Name
    worker: Name
    auth: Optional[Auth] = None


class ElasticJoin(Request, tag="elastic_join"):
    """This worker's place in the first membership epoch after ``after`` (0: the
    current one); answered once the driver has formed it."""
    after: U32 = 0


class ElasticJoinReply(Reply):
    epoch: int = 0
    rank: int = -1
    size: int = 0
    local_rank: int = -1
    local_size: int = 0
    cross_rank: int = -1
    cross_size: int = 0
    updates: int = 0                   # host updates the epoch reflects
    removed: str = ""                  # why the epoch leaves this worker out (then no place)
    stop: str = ""                     # why the driver stopped the job (then no place)


class ElasticUpdates(Request, tag="elastic_updates"):
    """Wait (at most ``wait`` s, 30 at most) for a host update past ``seen``."""
    seen: U64 = 0
    wait: Seconds = 0.0


class ElasticUpdatesReply(Reply):
    update: int = 0                    # the driver's latest host update
    changes: List[Tuple[int, int]] = []  # (update, what: 1 removed, 2 added, 3 both)


class ElasticStatus(Request, tag="elastic_status"):
    """The current epoch, and whether it is ending (a worker checked in or failed)."""


class ElasticStatusReply(Reply):
    epoch: int = 0
    breaking: bool = True


# --- the table ------------------------------------------------------------------------
# command -> (request type, reply type). The one list of what the control port speaks.
COMMANDS: Dict[str, Tuple[Type[Request], Type[Reply]]] = {
    "hello": (Hello, HelloReply),
    "ping": (Ping, Empty),
    "challenge": (Challenge, ChallengeReply),
    "register": (Register, RegisterReply),
    "payload": (Payload, PayloadReply),
    "release": (Release, Empty),
    "counters": (Counters, CountersReply),
    "fell_back": (FellBack, Empty),
    "verbs_connect": (VerbsConnect, VerbsConnectReply),
    "rack_grant": (RackGrant, RackGrantReply),
    "rack_job": (RackJob, RackJobReply),
    "rv_gather": (RvGather, RvGatherReply),
    "rv_request": (RvRequest, Empty),
    "rv_watch": (RvWatch, RvWatchReply),
    "job_status": (JobStatus, JobStatusReply),
    "negotiate_hello": (NegotiateHello, NegotiateHelloReply),
    "negotiate": (Negotiate, NegotiateReply),
    "negotiate_submit": (NegotiateSubmit, Empty),
    "negotiate_watch": (NegotiateWatch, WatchReply),
    "negotiate_bye": (NegotiateBye, Empty),
    "negotiate_abort": (NegotiateAbort, Empty),
    "elastic_bind": (ElasticBind, Empty),
    "elastic_join": (ElasticJoin, ElasticJoinReply),
    "elastic_updates": (ElasticUpdates, ElasticUpdatesReply),
    "elastic_status": (ElasticStatus, ElasticStatusReply),
}
REPLY_OF: Dict[Type[Request], Type[Reply]] = {req: rep for req, rep in COMMANDS.values()}
AnyRequest = Union[tuple(req for req, _ in COMMANDS.values())]  # type: ignore[valid-type]


def command(request: Request) -> str:
    return type(request).__struct_config__.tag  # type: ignore[return-value]
