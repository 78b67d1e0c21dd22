"""Two levels (rack + spine): the control side of netreduce-switch's tree.

The data path is native (native/aggregator/uplink.h); this module sets it up.

* On the **spine** (any netreduce-switch): the job's ranks register there as usual
  (NETREDUCE_SWITCH names the spine: admission, job secret, payload, negotiation all
  stay there). A rank that has a rack aggregator (NETREDUCE_RACK_SWITCH) then asks
  ``rack_grant`` with that address. Once every rank of the job has asked, the racks
  are known: the distinct rack addresses, numbered by their lowest rank. The number
  of racks R is the spine job's completion count: the spine job becomes a job of R
  members (one rank per rack, ``set_job_tree``) and the spine opens one control
  connection per rack aggregator and asks it (``rack_job``) to take the rack's part
  of the job. Each rank's answer is its rack's data-plane grant (job index, key,
  data port). The rack connections stay open while any rank of the tree is
  connected; closing them ends the racks' parts.
* On a **rack aggregator** (``netreduce-switch --spine SPINE``): ``rack_job`` is
  accepted only from the spine's address; it admits a job of the whole world size
  whose members are the rack's ranks and whose uplink is the spine's job, and frees
  it when the spine's connection closes.

docs/protocol.md ("Two levels") has the messages and the rules."""
from __future__ import annotations

import dataclasses
import logging
import secrets
import select
import socket
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

from netreduce.errors import NetReduceError
from netreduce.protocol import messages
from netreduce.protocol import data_address
from netreduce.protocol.address import format_address, parse_address, resolve
from netreduce.protocol.client import ControlConnection
from netreduce.switch import coordinator
from netreduce.switch.commands import RequestError, register_disconnect_hook, register_handler
from netreduce.switch.server import JobRecord

log = logging.getLogger("netreduce.switch")
MAX_WAIT_S = 300.0


@dataclasses.dataclass
class UplinkSettings:
    """A rack aggregator's view of its spine(s): from --spine and friends."""
    spines: List[str]
    spine_ips: List[str]
    rto_floor_ms: float = 1.0
    drop_rate: float = 0.0  # testing only: loss on the rack-spine hop
    drop_results: int = 0   # testing only: each rack job's first this many spine results lost


def configure(srv: Any, spines: Optional[Sequence[str]], rto_floor_ms: float = 1.0,
              drop_rate: float = 0.0, drop_results: int = 0) -> None:
    """Make ``srv`` a rack aggregator of the spines named (host or host:port)."""
    spines = list(spines or [])
    ips = []
    for text in spines:
        host = parse_address(text)[0]
        try:
            ips.append(resolve((host, 0))[0])
        except ValueError as exc:
            raise NetReduceError(f"--spine {text}: {exc}") from None
    srv.uplink = UplinkSettings(spines, ips, rto_floor_ms, drop_rate, drop_results)


# -- the spine -----------------------------------------------------------------
class Tree:
    """One job run's tree, kept by the spine."""

    def __init__(self, record: Any) -> None:
        self.record = record
        self.racks: Dict[int, str] = {}  # rank -> rack aggregator address
        self.sources: Dict[int, Any] = {}  # rank -> its data address (IP, port), for its rack
        self.users: set = set()          # sessions that asked; the last one out ends it
        self.building = False
        self.done = False
        self.error = ""
        self.grants: Dict[str, messages.RackGrantReply] = {}
        self.clients: List[ControlConnection] = []
        self.where: List[str] = []  # each client's rack, for messages
        self.closed = False


_lock = threading.Lock()
_changed = threading.Condition(_lock)
_trees: Dict[int, Tree] = {}


def _rack_grant(srv: Any, sess: Any, msg: messages.RackGrant) -> messages.RackGrantReply:
    job = sess.record
    if job is None:
        raise RequestError("'rack_grant' before 'register' on this connection")
    if not job.payload_final:
        raise RequestError(f"job '{job.name}' (rank {sess.rank}): 'rack_grant' before every "
                           "rank has registered")
    rack = msg.rack
    if getattr(job, "deterministic", False):
        # A rack sums its members in arrival order, so rank-order folding would hold
        # at the spine only: refuse rather than promise bits the tree cannot keep.
        raise RequestError(f"job '{job.name}' (rank {sess.rank}): NETREDUCE_DETERMINISTIC=1 "
                           "is not available through rack aggregators (NETREDUCE_RACK_SWITCH); "
                           "unset one of the two")
    wait = max(0.0, min(msg.wait, MAX_WAIT_S))
    deadline = time.monotonic() + wait
    with _changed:
        tree = _trees.setdefault(id(job), Tree(job))
        if tree.racks.get(sess.rank, rack) != rack:
            raise RequestError(f"job '{job.name}': rank {sess.rank} already asked with rack "
                               f"aggregator {tree.racks[sess.rank]}")
        tree.racks[sess.rank] = rack
        tree.sources[sess.rank] = sess.state.get("data_address")
        tree.users.add(sess)
        sess.state["rack_tree"] = tree
        _changed.notify_all()
        builder = False
        while not tree.done:
            if len(tree.racks) == job.size and not tree.building:
                tree.building = builder = True
                break
            left = deadline - time.monotonic()
            if (job.closing or left <= 0) and not tree.building:
                missing = sorted(set(range(job.size)) - set(tree.racks))
                why = "and a rank has left the job" if job.closing else f"within {wait:g} s"
                raise RequestError(
                    f"job '{job.name}' (rank {sess.rank}): rank(s) {_short(missing)} have not "
                    f"asked for their rack aggregator {why}; NETREDUCE_RACK_SWITCH must be set "
                    "on every rank of a job or on none")
            _changed.wait(1.0 if tree.building else left)
    if builder:
        try:
            _build(srv, job, tree)
        except Exception as exc:  # named in every rank's answer
            tree.error = str(exc)
            log.warning("%s", exc)
        with _changed:
            tree.done = True
            _changed.notify_all()
    if tree.error:
        raise RequestError(tree.error)
    return tree.grants[rack]


def _short(ranks: List[int], limit: int = 8) -> str:
    shown = ", ".join(map(str, ranks[:limit]))
    return shown + (f" (+{len(ranks) - limit} more)" if len(ranks) > limit else "")


def _build(srv: Any, job: Any, tree: Tree) -> None:
    """Number the racks, make the spine's job one of R members, admit each rack's
    part at its rack aggregator. Runs once per tree, outside the locks."""
    agg = srv.aggregator
    racks: List[str] = []
    for r in sorted(tree.racks):
        if tree.racks[r] not in racks:
            racks.append(tree.racks[r])
    members = {a: [r for r in sorted(tree.racks) if tree.racks[r] == a] for a in racks}
    try:
        agg.set_job_tree(job.index, list(range(len(racks))))
    except Exception as exc:
        raise NetReduceError(f"job '{job.name}': the spine cannot take {len(racks)} racks: {exc}") from None
    for i, address in enumerate(racks):
        where = (f"job '{job.name}': rack aggregator {address} (rack {i} of {len(racks)}, "
                 f"ranks {_short(members[address])})")
        try:
            host, port = parse_address(address)
            # a rack aggregator: TLS when this daemon has NETREDUCE_TLS_CA
            client = ControlConnection((host, port), timeout=10.0, aggregator=True)
        except (ValueError, NetReduceError) as exc:
            raise NetReduceError(f"{where}: {exc}") from None
        tree.clients.append(client)
        tree.where.append(where)
        spine_host = client.sock.getsockname()[0]  # this spine, as the rack reaches it
        try:
            # Each member's data address, as it registered here: the rack takes that
            # member's contributions from there only.
            sources = {str(r): format_address(tree.sources[r]) for r in members[address]
                       if tree.sources.get(r)}
            reply = client.request(messages.RackJob(
                job=job.name, size=job.size, members=members[address],
                payload_bytes=job.payload_bytes, sources=sources,
                spine=messages.SpineJob(host=spine_host, port=agg.port, threads=agg.threads,
                                        job_index=job.index, key=job.key, rank=i,
                                        racks=len(racks))))
            # The rack's partials come from its data ports, at its address toward here.
            agg.bind_rank(job.index, i, reply.source, reply.data_port, reply.threads)
        except (NetReduceError, ValueError) as exc:
            raise NetReduceError(f"{where}: {exc}") from None
        tree.grants[address] = messages.RackGrantReply(
            data_host=host, job_index=reply.job_index, key=reply.key,
            slots=min(reply.slots, int(agg.job_counters(job.index)["slots"])),
            data_port=reply.data_port, threads=reply.threads, group=reply.group,
            group_port=reply.group_port, rack=i, racks=len(racks))
    log.info("job '%s': tree of %d racks: %s", job.name, len(racks),
             "; ".join(f"{a} ranks {_short(members[a])}" for a in racks))
    threading.Thread(target=_watch, args=(srv, tree), daemon=True,
                     name=f"netreduce-tree-{job.name}").start()


def _watch(srv: Any, tree: Tree) -> None:
    """A rack aggregator's control connection closing while the job runs means it
    stopped or died: fail the job's negotiation (every rank's watch wakes with a
    message naming it) rather than let each rank time out on its own."""
    socks = {c.fileno(): i for i, c in enumerate(tree.clients)}
    while not tree.closed:
        try:
            ready, _, _ = select.select(list(socks), [], [], 0.5)
        except (OSError, ValueError):
            return  # closed by the teardown
        for fd in ready:
            if tree.closed:
                return
            try:
                data = tree.clients[socks[fd]].sock.recv(1, socket.MSG_PEEK)
            except OSError:
                data = b""
            if data:
                continue  # nothing is ever sent unasked; ignore
            message = (f"{tree.where[socks[fd]]} is gone: its control connection to the "
                       "spine closed (it stopped or died); restart the job once it is back")
            log.warning("%s", message)
            _fail_negotiation(srv, tree.record.name, message)
            return


def _fail_negotiation(srv: Any, job: str, message: str) -> None:
    state = coordinator._jobs(srv).get(job)
    if state is not None:
        with state.cond:
            state.fail(message, -1, None)


def _spine_disconnect(srv: Any, sess: Any) -> None:
    tree = sess.state.pop("rack_tree", None)
    if tree is None:
        return
    with _changed:
        tree.users.discard(sess)
        if tree.users:
            return
        if _trees.get(id(tree.record)) is tree:
            del _trees[id(tree.record)]
        tree.closed = True
        _changed.notify_all()
    for client in tree.clients:  # the racks free their parts
        client.close()


# -- a rack aggregator -----------------------------------------------------------
def _rack_job(srv: Any, sess: Any, msg: messages.RackJob) -> messages.RackJobReply:
    from netreduce import _native
    settings: Optional[UplinkSettings] = getattr(srv, "uplink", None)
    peer_ip = sess.peer.rsplit(":", 1)[0]
    if settings is None or not settings.spines:
        raise RequestError("this aggregator takes no rack jobs: start it with --spine HOST "
                           "(the spine aggregator whose jobs it serves)")
    if peer_ip not in settings.spine_ips:
        raise RequestError(f"rack jobs are taken from the spine {', '.join(settings.spines)} "
                           f"only, not from {peer_ip}")
    srv.pending.settle(sess)
    name, size, payload = msg.job, msg.size, msg.payload_bytes
    members = list(msg.members)
    spine = msg.spine
    spine_where = format_address((spine.host, spine.port))
    agg = srv.aggregator
    try:
        mtu, ipv6 = _native.path_mtu(spine.host, spine.port)
    except (ValueError, _native.EngineError) as exc:
        raise RequestError(f"job '{name}': no route to the spine {spine_where}: {exc}") from None
    fits = int(_native.payload_for_mtu(mtu, ipv6))
    if payload > fits:
        raise RequestError(f"job '{name}': payload {payload} B does not fit this rack "
                           f"aggregator's path MTU {mtu} toward the spine {spine_where} "
                           f"({fits} B would); start the spine with --payload-bytes {fits}")
    key = secrets.randbits(32) or 1
    with srv.lock:
        srv.room_for_admitted(name)  # a rack's part is admitted whole: --max-jobs counts it
    try:
        index = agg.add_job(size, key, payload)
    except Exception as exc:
        raise RequestError(f"job '{name}' (rack {spine.rank}) refused: {exc}") from None
    try:
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.connect((spine.host, spine.port))
            local = probe.getsockname()[0]
        finally:
            probe.close()
        agg.set_job_tree(index, members, dict(
            spine_host=spine.host, spine_port=spine.port, spine_threads=spine.threads,
            job_index=spine.job_index, rank=spine.rank, key=spine.key, local_host=local,
            rto_floor_us=int(settings.rto_floor_ms * 1000), drop_rate=float(settings.drop_rate),
            drop_results=int(settings.drop_results)))
        sources = msg.sources
        for r in members:  # each member's data address, as it registered at the spine
            host, port = data_address.parse(sources.get(str(r)), f"job '{name}' (rank {r})")
            agg.bind_rank(index, r, host, port)
    except Exception as exc:
        agg.remove_job(index)
        raise RequestError(f"job '{name}': cannot set up the uplink to {spine_where}: {exc}") from None
    record = JobRecord(name, size, index, key, payload_bytes=payload, payload_final=True,
                               payload_reason=f"payload {payload} B: set by the spine {spine_where}")
    with srv.lock:
        label = name if name not in srv.jobs else f"{name}#{index}"
        srv.jobs[label] = record
        srv.admitted[id(record)] = record
    sess.state.setdefault("rack_jobs", []).append((label, record))
    log.info("job '%s': rack %s of %s, ranks %s, index %d, uplink to %s", name, spine.rank,
             spine.racks, _short(members), index, spine_where)
    group, group_port = agg.group(index)
    return messages.RackJobReply(job_index=index, key=key,
                                 slots=int(agg.job_counters(index)["slots"]),
                                 data_port=agg.port, source=local, threads=agg.threads,
                                 group=group, group_port=group_port)


def _rack_disconnect(srv: Any, sess: Any) -> None:
    for label, record in sess.state.pop("rack_jobs", []):
        with srv.lock:
            if srv.jobs.get(label) is record:
                del srv.jobs[label]
            srv.admitted.pop(id(record), None)
        try:
            srv.aggregator.remove_job(record.index)
        except Exception:  # already gone
            pass
        log.info("job '%s': rack part freed (the spine's connection closed)", record.name)


def _disconnect(srv: Any, sess: Any) -> None:
    _spine_disconnect(srv, sess)
    _rack_disconnect(srv, sess)


register_handler(messages.RackGrant, _rack_grant)
register_handler(messages.RackJob, _rack_job)
register_disconnect_hook(_disconnect)
