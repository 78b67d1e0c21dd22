"""Hosts and slots as horovodrun takes them, ranks assigned to them, and which host
names are this machine.

    -H/--hosts      "h0:4,h1:4"             parse_hosts()
    --hostfile      "h0 slots=4" per line   parse_hostfile()
    discovery       "h0:4" (or "h0") lines  parse_discovery()

assign() places ranks host by host, as horovodrun does (Horovod's
get_host_assignments): host 0's slots first, so ranks 0..L0-1 share host 0, and each
rank gets Horovod's local and cross rank. A host name that resolves to an address of
this machine (localhost, 127.0.0.1, its own name) runs its ranks as local processes
(is_local()); every other host is reached over ssh (spawn.py). Two names for one
machine are still two hosts: the launcher's layout is what the ranks are told.

Pure parsing and a few socket calls: nothing here starts a process."""
from __future__ import annotations

import dataclasses
import ipaddress
import re
import socket
from typing import Dict, Iterable, List, Optional, Sequence

from netreduce.errors import NetReduceError

# A host name or IPv4 address, or an IPv6 address in brackets, then ":slots".
_HOST = r"(?:\[[0-9A-Fa-f:.%\w]+\]|[\w.-]+)"
_HOST_SLOTS = re.compile(rf"^\s*({_HOST})(?::(\d+))?\s*$")


class HostsError(NetReduceError, ValueError):
    """A host list, host file or discovery line that cannot be used; the message
    names the entry and the form expected."""


@dataclasses.dataclass(frozen=True)
class Host:
    name: str    # as the user wrote it (brackets of an IPv6 address removed)
    slots: int


@dataclasses.dataclass(frozen=True)
class Slot:
    """One rank's place, with the numbers horovodrun gives it (HOROVOD_*)."""

    host: str
    rank: int
    local_rank: int
    cross_rank: int   # this host's index among the hosts that have this local rank
    size: int
    local_size: int
    cross_size: int   # hosts that have this local rank


def _host(text: str, where: str, default_slots: Optional[int]) -> Host:
    m = _HOST_SLOTS.match(text)
    if not m or (m.group(2) is None and default_slots is None):
        raise HostsError(f"{where}: {text.strip()!r} is not host:slots "
                         f"(e.g. worker-0:4, 10.0.0.2:4, [fd00::2]:4)")
    name = m.group(1)
    if name.startswith("["):
        name = name[1:-1]
    slots = int(m.group(2)) if m.group(2) is not None else int(default_slots or 0)
    if slots < 1:
        raise HostsError(f"{where}: host {name!r} has {slots} slots; give it at least 1")
    return Host(name, slots)


def _unique(hosts: List[Host], where: str) -> List[Host]:
    seen: Dict[str, int] = {}
    for h in hosts:
        if h.name in seen:
            raise HostsError(f"{where}: host {h.name!r} is listed twice; give it once, "
                             f"with all its slots")
        seen[h.name] = h.slots
    return hosts


def parse_hosts(text: str, default_slots: Optional[int] = None) -> List[Host]:
    """-H/--hosts: 'h0:2,h1:2'. A name without ':slots' is refused unless
    ``default_slots`` is given (horovodrun refuses it too)."""
    entries = [e for e in text.split(",") if e.strip()]
    if not entries:
        raise HostsError(f"--hosts {text!r} names no host (e.g. -H worker-0:4,worker-1:4)")
    return _unique([_host(e, "--hosts", default_slots) for e in entries], "--hosts")


def parse_hostfile_text(text: str, where: str = "--hostfile") -> List[Host]:
    """Host file lines as horovodrun (and Open MPI) read them: 'host slots=N'; a
    line with only a host has 1 slot (Open MPI's rule), '#' starts a comment,
    other key=value fields (max_slots=...) are ignored."""
    hosts = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        name, slots = fields[0], 1
        for field in fields[1:]:
            key, eq, value = field.partition("=")
            if not eq:
                raise HostsError(f"{where} line {number}: {line.strip()!r} is not "
                                 f"'host slots=N'")
            if key == "slots":
                if not value.isdigit() or int(value) < 1:
                    raise HostsError(f"{where} line {number}: slots={value!r} is not a "
                                     f"positive number")
                slots = int(value)
        if not re.fullmatch(_HOST, name):
            raise HostsError(f"{where} line {number}: {name!r} is not a host name or address")
        hosts.append(Host(name[1:-1] if name.startswith("[") else name, slots))
    if not hosts:
        raise HostsError(f"{where} names no host (one 'host slots=N' per line)")
    return _unique(hosts, where)


def parse_hostfile(path: str) -> List[Host]:
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise HostsError(f"--hostfile {path}: {exc.strerror}") from None
    return parse_hostfile_text(text, f"--hostfile {path}")


def parse_discovery(text: str, default_slots: Optional[int] = None,
                    where: str = "host discovery script") -> List[Host]:
    """What a --host-discovery-script prints: one 'host:slots' (or 'host', which
    then has ``default_slots``, horovodrun's --slots-per-host) per line. An empty
    output is an empty list: no host is available right now."""
    hosts = [_host(line, f"{where} line {n}", default_slots)
             for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    return _unique(hosts, where)


def format_hosts(hosts: Iterable[Host]) -> str:
    return ",".join(f"[{h.name}]:{h.slots}" if ":" in h.name else f"{h.name}:{h.slots}"
                    for h in hosts)


def assign(hosts: Sequence[Host], np_: int) -> List[Slot]:
    """Ranks 0..np_-1 placed host by host, filling each host's slots in order
    (horovodrun's placement); hosts left without a rank are left out."""
    total = sum(h.slots for h in hosts)
    if np_ > total:
        raise HostsError(f"-np {np_} asks for more ranks than the {total} slots of "
                         f"{format_hosts(hosts)}")
    placed = []  # (host, [ranks])
    rank = 0
    for h in hosts:
        take = min(h.slots, np_ - rank)
        if take <= 0:
            break
        placed.append((h.name, list(range(rank, rank + take))))
        rank += take
    cross: Dict[int, List[str]] = {}
    for name, ranks in placed:
        for local_rank in range(len(ranks)):
            cross.setdefault(local_rank, []).append(name)
    return [Slot(name, r, lr, cross[lr].index(name), np_, len(ranks), len(cross[lr]))
            for name, ranks in placed for lr, r in enumerate(ranks)]


def resolve(name: str) -> List[str]:
    """The addresses ``name`` resolves to (IPv4 first, as ssh tries them), or []."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    out: List[str] = []
    for family in (socket.AF_INET, socket.AF_INET6):
        for fam, _, _, _, sockaddr in infos:
            if fam == family and sockaddr[0] not in out:
                out.append(sockaddr[0])
    return out


def is_local_address(address: str) -> bool:
    """True for a loopback address or one held by an interface of this machine (in
    this network namespace): binding to it works only then."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if ip.is_loopback:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False


def is_local(name: str) -> bool:
    """Whether host ``name`` is this machine: it resolves to an address of it
    (horovodrun's test, with every loopback address counted). A name that does not
    resolve here is remote: ssh may still know it (its own config)."""
    addresses = resolve(name)
    return bool(addresses) and is_local_address(addresses[0])


def route_source(address: str) -> str:
    """The address of this machine that packets to ``address`` leave from (the
    kernel's route choice; no packet is sent): where a process on that host should
    dial back to reach one on this machine."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((address, 9))
        except OSError as exc:
            raise HostsError(f"no route from this machine to {address}: {exc.strerror}") from None
        return s.getsockname()[0]
