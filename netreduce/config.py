"""The one place that reads the environment.

Each NETREDUCE_* knob is declared once: name, type, default, one line of help.
``netreduce info`` prints them all with their current values and where each came
from. Other launchers' variables (Open MPI, Slurm, torchrun, ...) are read here
too, as one read-only view that rank discovery interprets. Nothing else in
netreduce reads or writes the environment."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, Mapping, Optional

from netreduce.errors import ConfigError, NetReduceError, UnknownKnobError


@dataclasses.dataclass(frozen=True)
class Knob:
    name: str
    type: Callable[[str], Any]
    default: Any
    help: str
    secret: bool = False  # `netreduce info` says whether it is set, never its value


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"expected a boolean (1/0, true/false), got {text!r}")


def _choice(*values: str):
    """A parser for a knob that takes one of ``values`` (any case, spaces stripped)."""
    wanted = ", ".join(values[:-1]) + " or " + values[-1]

    def parse(text: str) -> str:
        low = text.strip().lower()
        if low not in values:
            raise ConfigError(f"expected {wanted}, got {text!r}")
        return low

    parse.__name__ = "|".join(values)
    return parse


KNOBS: Dict[str, Knob] = {}


def declare(name: str, type: Callable[[str], Any], default: Any, help: str,
            secret: bool = False) -> Knob:
    knob = Knob(name, type, default, help, secret)
    if name in KNOBS:
        raise NetReduceError(f"knob {name} declared twice")
    KNOBS[name] = knob
    return knob


# --- data plane -------------------------------------------------------------
declare("NETREDUCE_SWITCH", str, "",
        "aggregator control address HOST[:PORT] (port 4791 if omitted; [IPv6]:PORT; host "
        "names resolve), or several comma-separated: each buffer is spread over them, "
        "negotiation goes through the first; empty = the launcher's embedded one")
declare("NETREDUCE_TIMEOUT", float, 30.0,
        "seconds an operation may wait (aggregator silence, missing ranks) before failing")
declare("NETREDUCE_RETRANSMIT_MS", float, 0.5,
        "floor in ms of the retransmission timeout, which follows the measured round trip "
        "(srtt + 4 rttvar); doubles per retry, capped at 1 s")
declare("NETREDUCE_DROP_RATE", float, 0.0,
        "fraction [0,1) of outgoing data packets the engine drops on purpose (loss tests)")
declare("NETREDUCE_WINDOW", int, 0,
        "slots a worker keeps outstanding; 0 = all the slots the aggregator grants. The "
        "same on every rank of a job (a chunk's slot follows it): a rank that differs is "
        "refused at admission")


declare("NETREDUCE_UDP_OFFLOAD", _choice("auto", "off", "gso", "gro"), "auto",
        "kernel UDP offloads of the data sockets (ranks and netreduce-switch): auto = "
        "segmented sends (UDP_SEGMENT) and coalesced receives (UDP_GRO) where the kernel "
        "has them, off = one datagram per send and receive; gso / gro = only that one")
declare("NETREDUCE_ICRC_CHECK", _choice("auto", "always"), "auto",
        "which received packets' RoCEv2 ICRC is computed (ranks and netreduce-switch): "
        "auto = not those a kernel UDP socket delivered from a netreduce sender, whose UDP "
        "checksum the kernel verified (as TCP's); always = every one. Packets from RoCE "
        "NICs (UDP checksum 0) and from AF_XDP are checked either way; every sent packet "
        "carries its ICRC")


_transport = _choice("auto", "verbs", "udp")
declare("NETREDUCE_TRANSPORT", _transport, "auto",
        "how a worker's packets leave: verbs = an RDMA queue pair (NETREDUCE_VERBS_QP; RoCE NIC or "
        "Soft-RoCE), udp = a kernel UDP socket, auto = verbs when this build has it and a "
        "RoCEv2 device holds the address that routes to the aggregator, else udp")
_qp_type = _choice("rc", "uc")
declare("NETREDUCE_VERBS_QP", _qp_type, "rc",
        "queue pair type of the verbs transport: rc = the NIC repairs loss (the aggregator "
        "answers as an RC responder and requester: ACK/NAK, PSN/MSN per QP, go-back-N); "
        "uc = loss repaired by netreduce's own retransmission, as for UDP")
declare("NETREDUCE_VERBS_DEVICE", str, "",
        "RDMA device for the verbs transport (rxe0, mlx5_0, ...); empty = the one whose GID "
        "table holds the address that routes to the aggregator")
declare("NETREDUCE_PLACEMENT", str, "",
        "several aggregators: a JSON file from the planner (Placement.save_weights) giving "
        "each NETREDUCE_SWITCH address its share of every buffer; empty = equal shares")
declare("NETREDUCE_RACK_SWITCH", str, "",
        "two-level tree: HOST[:PORT] of this host's rack aggregator (netreduce-switch "
        "--spine SPINE); data goes through it while NETREDUCE_SWITCH names the spine, "
        "which admits the job and negotiates; set on every rank or none; empty = one level")
declare("NETREDUCE_DETERMINISTIC", _bool, False,
        "1 = bit-reproducible reductions: the aggregator folds each slot's contributions in "
        "rank order, not arrival order (costs staging memory, ranks x the slot pool); set "
        "the same on every rank, the job is refused otherwise")


_fallback = _choice("error", "host")
declare("NETREDUCE_FALLBACK", _fallback, "error",
        "when no aggregator admits the job at start (refused: full, memory limit; or "
        "unreachable) or the last one dies mid-job: error = fail with a clear error, host = "
        "all-reduce among the workers themselves (each hosts an in-process aggregator)")
declare("NETREDUCE_STANDBY_SWITCH", str, "",
        "standby aggregator(s) HOST[:PORT], comma-separated, tried in order when the "
        "NETREDUCE_SWITCH path refuses the job or dies mid-job; may name the primary itself "
        "(a restarted daemon is taken back); empty = no standby")
declare("NETREDUCE_RENDEZVOUS", str, "",
        "HOST:PORT where rank 0 serves the job's rendezvous and negotiation when failover is on "
        "(a standby or FALLBACK=host), independent of the aggregators; empty = MASTER_ADDR and "
        "MASTER_PORT+1 from the launcher")


declare("NETREDUCE_JOB_METRICS", str, "",
        "HOST:PORT where rank 0 of a job with failover serves Prometheus metrics of the "
        "job's data path (netreduce_job_degraded, _path_info, _failovers_total: "
        "docs/failover.md); empty = none")


def _bytes(text: str) -> int:
    """Byte count with an optional K/M/G suffix (powers of 1024): '64M', '1048576'."""
    low = text.strip().lower().rstrip("b").rstrip("i")
    scale = 1
    if low and low[-1] in "kmg":
        scale = 1024 ** ("kmg".index(low[-1]) + 1)
        low = low[:-1]
    return int(float(low) * scale)


_bytes.__name__ = "bytes"

# --- communicator -------------------------------------------------------------
declare("NETREDUCE_CYCLE_TIME", float, 1.0,
        "ms the background thread waits after a submission to batch more into one negotiation")
declare("NETREDUCE_FUSION_THRESHOLD", _bytes, 64 * 1024 * 1024,
        "bytes of the fusion buffer (allocated once); same-dtype tensors up to this size go as one")
declare("NETREDUCE_CACHE_CAPACITY", int, 1024,
        "tensor names the response cache remembers; a cached name costs an int per step, "
        "not a request")
declare("NETREDUCE_CACHE_AGREEMENT", _bool, True,
        "cached tensors are agreed on by the ranks through the data plane (a tiny MIN "
        "all-reduce of a bit vector), not the coordinator; 0 = every step asks it")
declare("NETREDUCE_STALL_TIMEOUT", float, 60.0,
        "seconds before a warning names a tensor and the ranks that have not submitted it")
declare("NETREDUCE_START_TIMEOUT", float, 120.0,
        "seconds init() waits for every rank of the job to join before failing")
declare("NETREDUCE_TIMELINE", str, "",
        "Chrome trace (chrome://tracing, Perfetto) of every tensor's phases, written by rank 0; "
        "a {rank} in the path gives one file per rank; empty = off")

# --- algorithm (netreduce/algorithms; docs/hierarchical.md) ---------------------
_algorithm = _choice("auto", "flat", "hierarchical")
declare("NETREDUCE_ALGORITHM", _algorithm, "auto",
        "auto = hierarchical (shared memory inside a host, one shard per local rank through "
        "the aggregator) when some host runs several ranks, else flat; or force one")
declare("NETREDUCE_SHM_CHUNK", _bytes, 0,
        "bytes of each local rank's shard per pipeline step of the hierarchical all-reduce; "
        "0 = 256K on one host, 1M across hosts")
declare("NETREDUCE_SHM_SPIN_US", float, 50.0,
        "longest busy-wait in µs for a local peer before sleeping on its futex, with no more "
        "local ranks than CPUs; shrinks by itself while peers come later than that; 0 = none")

# --- rank discovery (netreduce-run sets these; other launchers' variables also work) --
declare("NETREDUCE_JOB", str, "",
        "job name shared by all ranks at the aggregator; empty = derived from the launcher")
declare("NETREDUCE_JOB_SECRET", str, "",
        "secret shared by the job's ranks: each control connection proves it on a challenge "
        "(never sends it), so the job's name alone cannot join, abort or read the job; "
        "netreduce-run sets one per run; empty = an open job (refused by an aggregator "
        "started with --require-secret)", secret=True)
declare("NETREDUCE_JOB_SECRET_FILE", str, "",
        "file holding the job's secret (surrounding whitespace stripped), read by every rank "
        "instead of NETREDUCE_JOB_SECRET, so that the secret is in no process's environment "
        "(a file on a shared filesystem, mode 600); empty = none")
# --- control connections over TLS (docs/operations.md, Security) -------------------
declare("NETREDUCE_TLS_CA", str, "",
        "CA certificate file (PEM): a rank's control connections to its aggregators "
        "(NETREDUCE_SWITCH, NETREDUCE_STANDBY_SWITCH, NETREDUCE_RACK_SWITCH) use TLS and "
        "trust only a certificate it signed, for the address they were given; empty = "
        "plain TCP")
declare("NETREDUCE_TLS_CERT", str, "",
        "certificate (PEM, signed by NETREDUCE_TLS_CA's CA) with which the job's own servers "
        "serve TLS: rank 0's rendezvous and status, the torch backend's embedded aggregator, "
        "NETREDUCE_FALLBACK=host's aggregators; set on every rank (then all reach them with "
        "TLS); empty = those stay plain TCP")
declare("NETREDUCE_TLS_KEY", str, "",
        "private key of NETREDUCE_TLS_CERT (PEM); empty = in the NETREDUCE_TLS_CERT file")
declare("NETREDUCE_TLS_SERVER_NAME", str, "",
        "the name the aggregators' certificates must carry when it is not the address in "
        "NETREDUCE_SWITCH (a shared certificate for several addresses); empty = that address")
declare("NETREDUCE_RANK", int, -1, "this process's rank; -1 = discover from the launcher")
declare("NETREDUCE_SIZE", int, -1, "number of ranks; -1 = discover from the launcher")
declare("NETREDUCE_LOCAL_RANK", int, -1, "rank among the processes on this host; -1 = discover")
declare("NETREDUCE_LOCAL_SIZE", int, -1, "processes of the job on this host; -1 = discover")
declare("NETREDUCE_HOST_LABEL", str, "",
        "added to this rank's host identity (hostname and namespaces): ranks with different "
        "labels are different hosts even on one machine; netreduce-run -H sets it to the "
        "host name a rank was placed on (-H localhost:2,127.0.0.1:2 is two hosts)")

# --- elastic jobs (netreduce-run --min-np/--max-np/--host-discovery-script; docs/elastic.md)
declare("NETREDUCE_ELASTIC", str, "",
        "HOST:PORT of the elastic driver (netreduce-run's, with --min-np, --max-np or "
        "--host-discovery-script): init() asks it for this process's rank, size and "
        "membership epoch, at start and after each reset; empty = a job of fixed size")
declare("NETREDUCE_ELASTIC_WORKER", str, "",
        "this process's name at the elastic driver, HOST:SLOT (the driver sets it)")
declare("NETREDUCE_ELASTIC_AHEAD", float, 120.0,
        "seconds netreduce-run's elastic driver lets the job train on while the workers of "
        "hosts discovery added start (their update is announced once they all wait at the "
        "driver, or after this); 0 = announce at once and wait for them, as horovodrun does")
declare("NETREDUCE_EPOCH", int, 0,
        "membership epoch of an elastic job, named at admission so that the aggregator "
        "moves the job to each new membership (init() sets it from the driver); 0 = none")

# --- framework adapters ----------------------------------------------------------------
declare("NETREDUCE_TF_OP_CACHE", str, "",
        "folder of netreduce.tensorflow's graph ops, compiled once per TensorFlow version on "
        "first graph use; empty = ~/.cache/netreduce/tf-ops")
declare("NETREDUCE_DDP_OVERLAP", _bool, True,
        "DistributedDataParallel on a netreduce process group all-reduces each gradient as "
        "backward produces it (netreduce.torch.ddp_overlap) unless a comm hook is registered; "
        "0 = DDP's own bucket all-reduces")
declare("NETREDUCE_CXX", str, "c++",
        "C++17 compiler (and leading flags) that builds netreduce.tensorflow's graph ops")

def get(name: str) -> Any:
    """Current value of knob ``name``: the environment if set, else its default."""
    knob = KNOBS[name]
    raw = os.environ.get(name)
    if raw is None:
        return knob.default
    try:
        return knob.type(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}={raw!r} is not a valid {knob.type.__name__}: {exc}") from None


def source(name: str) -> str:
    return "environment" if name in os.environ else "default"


def snapshot(overrides: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    values = {name: get(name) for name in KNOBS}
    values.update(overrides or {})
    return values


def _declared(name: str) -> Knob:
    if name not in KNOBS:
        raise UnknownKnobError(f"{name} is not a netreduce knob (`netreduce info` lists them)")
    return KNOBS[name]


def set_for_process(name: str, value: Any) -> None:
    """Sets knob ``name`` for this process and the processes it starts (the torch
    backend hands rank 0's embedded aggregator address to init() this way)."""
    _declared(name)
    os.environ[name] = str(value)


def child_environment(**knobs: Any) -> Dict[str, str]:
    """This process's environment with the given knobs set: what a launcher gives
    the processes it starts."""
    env = dict(os.environ)
    for name, value in knobs.items():
        _declared(name)
        env[name] = str(value)
    return env


# Other launchers' variables that rank discovery understands (netreduce/environment.py).
LAUNCHER_PREFIXES = ("OMPI_COMM_WORLD_", "PMIX_", "PMI_", "MPI_LOCAL", "SLURM_",
                     "HOROVOD_", "TORCHELASTIC_")
LAUNCHER_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "MASTER_ADDR", "MASTER_PORT")


def launcher_environment() -> Mapping[str, str]:
    """The launcher variables of this process, as a read-only copy."""
    return {k: v for k, v in os.environ.items()
            if k in LAUNCHER_NAMES or k.startswith(LAUNCHER_PREFIXES)}
