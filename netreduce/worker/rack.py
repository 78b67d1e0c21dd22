"""A rank's side of a two-level tree (netreduce/switch/uplink.py has the daemons').

With NETREDUCE_RACK_SWITCH set, a rank registers at the spine (NETREDUCE_SWITCH) as
usual, then asks the spine for its rack's data-plane grant (``rack_grant``, naming
the rack aggregator it was given). The answer comes once every rank of the job has
asked and the spine has set the job up at each rack aggregator; the rank's engine
then sends its data to the rack aggregator, which sums the rack and talks to the
spine (native/aggregator/uplink.h)."""
from __future__ import annotations

from typing import Any, Optional, Tuple

from netreduce.errors import AdmissionError, ControlPlaneError
from netreduce.protocol import messages
from netreduce.protocol.address import format_address, parse_address, resolve


def parse(text: str) -> Optional[Tuple[str, int]]:
    """NETREDUCE_RACK_SWITCH's address, resolved (every rank of a rack names it alike)."""
    if not text:
        return None
    try:
        address = resolve(parse_address(text))
    except ValueError as exc:
        raise AdmissionError(f"NETREDUCE_RACK_SWITCH={text!r}: {exc}") from None
    if ":" in address[0]:
        raise AdmissionError(f"NETREDUCE_RACK_SWITCH={text!r}: the data plane speaks RoCEv2 "
                             "over IPv4 only; give an IPv4 address or a host name that has one")
    return address


def join(conn: Any) -> str:
    """Ask the spine for ``conn``'s rack grant; point the connection's data-plane
    fields at the rack aggregator and return its host."""
    # Every rank asks the moment the payload is fixed, so half the timeout is ample;
    # the other half lets the rank's first operation report the spine's answer.
    try:
        reply = conn._control.request(messages.RackGrant(rack=format_address(conn.rack),
                                                         wait=conn.timeout / 2),
                                      timeout=conn.timeout + 15.0)
    except ControlPlaneError as exc:
        raise AdmissionError(f"{conn._where()}: {exc}") from None
    conn.job_index = reply.job_index
    conn.key = reply.key
    conn.slots = reply.slots
    conn.data_port = reply.data_port
    conn.threads = reply.threads
    conn.rack_index, conn.racks = reply.rack, reply.racks
    conn._grant.group, conn._grant.group_port = reply.group, reply.group_port
    return reply.data_host
