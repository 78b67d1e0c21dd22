"""Which ranks share a host: checked across every rank at init.

The launcher says each rank's local rank and local size (netreduce/environment.py);
this module adds what the launcher cannot know — whether two ranks really share
memory — and makes every rank agree on one layout:

* host identity = hostname + the inodes of the network and pid namespaces. Testbed
  hosts are network namespaces on one machine with one hostname; the inode tells
  them apart. The pid namespace is part of it because local ranks open each other's
  shared-memory segment through /proc/<pid>/fd.
* every rank contributes (host identity, local rank, local size, pid) to an
  all-gather carried by the flat data plane (an all-reduce of int64 rows in which
  each rank fills only its own row), so every rank sees every record.
* the launcher's local ranks must agree with the host identities: a host whose
  ranks do not number 0..L-1, or say different local sizes, or local ranks that the
  launcher places on one host but that sit on different hosts, is refused with a
  TopologyError naming the ranks and hosts. When the launcher did not say (local
  information missing), ranks are grouped by host identity and numbered by global
  rank.

Hosts are numbered by their lowest global rank; the layout is a pure function of
the records, so every rank derives the same one."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

from netreduce import config
from netreduce.errors import NetReduceError

LABEL_WORDS = 12  # int64 words of the host label in a record (96 bytes of UTF-8)
RECORD_WORDS = 5 + LABEL_WORDS  # host id, local rank, local size, local known, pid, label


class TopologyError(NetReduceError):
    """The ranks' host layout is inconsistent, or does not fit the requested algorithm."""


@dataclasses.dataclass(frozen=True)
class Record:
    rank: int
    host_id: int
    local_rank: int
    local_size: int
    local_known: bool
    pid: int
    label: str


@dataclasses.dataclass(frozen=True)
class Layout:
    """Every rank's view of the job's hosts (identical on every rank)."""

    rank: int
    hosts: List[List[int]]        # global ranks of each host, in local-rank order
    labels: List[str]             # a name for each host, for messages
    pids: Dict[int, int]          # global rank -> pid
    host_index: int               # this rank's host
    local_rank: int

    @property
    def num_hosts(self) -> int:
        return len(self.hosts)

    @property
    def local_ranks(self) -> List[int]:
        return self.hosts[self.host_index]

    @property
    def local_size(self) -> int:
        return len(self.local_ranks)

    @property
    def uniform(self) -> bool:
        return len({len(h) for h in self.hosts}) == 1

    def describe(self) -> str:
        return "; ".join(f"host {i} '{self.labels[i]}': ranks {h}" for i, h in enumerate(self.hosts))


def _ns_inode(kind: str) -> int:
    try:
        return os.stat(f"/proc/self/ns/{kind}").st_ino
    except OSError:
        return 0


def host_identity() -> Tuple[int, str]:
    """(a 63-bit id, a readable label) of the host this process runs on: hostname,
    network namespace and pid namespace (local ranks open each other's segment
    through /proc/<pid>/fd, so processes that cannot see each other's pids are not
    on one host for this purpose), and NETREDUCE_HOST_LABEL, the host the launcher
    placed the rank on (netreduce-run -H localhost:2,127.0.0.1:2 runs two hosts on
    one machine: a label can split a machine, never join two)."""
    name = socket.gethostname()
    netns, pidns = _ns_inode("net"), _ns_inode("pid")
    label = name + (f"/netns:{netns}" if netns else "") + (f"/pidns:{pidns}" if pidns else "")
    placed = config.get("NETREDUCE_HOST_LABEL")
    if placed:
        label = f"{placed}@{label}"
    digest = hashlib.blake2b(label.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF, label


def encode(rank: int, size: int, local_rank: int, local_size: int, local_known: bool,
           identity: Tuple[int, str], pid: int) -> np.ndarray:
    """The all-gather buffer with only this rank's row filled (zeros elsewhere)."""
    rows = np.zeros((size, RECORD_WORDS), dtype=np.int64)
    host_id, label = identity
    raw = label.encode()[: LABEL_WORDS * 8].ljust(LABEL_WORDS * 8, b"\0")
    rows[rank, :5] = (host_id, local_rank, local_size, int(local_known), pid)
    rows[rank, 5:] = np.frombuffer(raw, dtype=np.int64)
    return rows


def decode(rows: np.ndarray) -> List[Record]:
    out = []
    for r, row in enumerate(rows):
        label = row[5:].astype(np.int64).tobytes().rstrip(b"\0").decode(errors="replace")
        out.append(Record(r, int(row[0]), int(row[1]), int(row[2]), bool(row[3]), int(row[4]),
                          label or "?"))
    return out


def layout(records: Sequence[Record], rank: int) -> Layout:
    """The agreed layout, or TopologyError naming the ranks and hosts that disagree."""
    missing = [r.rank for r in records if r.host_id == 0]
    if missing:
        raise TopologyError(f"ranks {missing} sent no host record in the topology exchange")
    by_host: Dict[int, List[Record]] = {}
    for rec in records:
        by_host.setdefault(rec.host_id, []).append(rec)
    groups = sorted(by_host.values(), key=lambda g: min(r.rank for r in g))
    problems: List[str] = []
    hosts: List[List[int]] = []
    for group in groups:
        label = group[0].label
        ranks = sorted(r.rank for r in group)
        if all(r.local_known for r in group):
            sizes = sorted({r.local_size for r in group})
            locals_ = sorted(r.local_rank for r in group)
            if sizes != [len(group)] or locals_ != list(range(len(group))):
                detail = ", ".join(f"rank {r.rank}: local rank {r.local_rank} of {r.local_size}"
                                   for r in sorted(group, key=lambda r: r.rank))
                problems.append(f"host '{label}' runs ranks {ranks}, but the launcher says {detail}")
            ordered = [r.rank for r in sorted(group, key=lambda r: (r.local_rank, r.rank))]
        else:
            ordered = ranks  # the launcher did not say: number them by global rank
        hosts.append(ordered)
    # The same host seen from both sides: a launcher that puts ranks on one host which
    # in fact sit on different ones shows up above as too few local ranks per host.
    if problems:
        raise TopologyError("inconsistent host layout: " + "; ".join(problems) +
                            " (check the launcher's local rank/size variables, e.g. "
                            "NETREDUCE_LOCAL_RANK/NETREDUCE_LOCAL_SIZE)")
    labels = [g[0].label for g in groups]
    pids = {r.rank: r.pid for r in records}
    host_index = next(i for i, h in enumerate(hosts) if rank in h)
    return Layout(rank, hosts, labels, pids, host_index, hosts[host_index].index(rank))


def exchange(allreduce_int64: Callable[[np.ndarray], np.ndarray], rank: int, size: int,
             local_rank: int, local_size: int, local_known: bool) -> Layout:
    """All-gather every rank's record over ``allreduce_int64`` (a sum all-reduce in
    place, every rank calling it once) and derive the layout."""
    rows = encode(rank, size, local_rank, local_size, local_known, host_identity(), os.getpid())
    allreduce_int64(rows)
    return layout(decode(rows), rank)
