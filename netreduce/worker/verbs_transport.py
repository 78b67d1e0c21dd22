"""Choosing and connecting the verbs transport for one rank (NETREDUCE_TRANSPORT).

The native side (native/transport/verbs) owns the device, queue pair, registered
rings and completions; this module only decides whether to use it and runs the
control-plane exchange: the rank reports a path MTU small enough for one verbs
result packet (so the job's payload fits the NIC's MTU), and once the payload is
fixed it opens the queue pair, sends ``verbs_connect`` (its QPN, GID address and
result ring) and moves the QP to RTS toward the QPN and PSN the aggregator gives."""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from netreduce import _native, config
from netreduce.errors import AdmissionError, ControlPlaneError, DataPlaneError
from netreduce.protocol import messages

log = logging.getLogger("netreduce.verbs")


def available() -> bool:
    """Whether this build has the verbs transport (libibverbs headers at build time)."""
    return bool(getattr(_native, "HAVE_VERBS", False))


class VerbsChoice:
    """A rank that will speak verbs: what the probe found, and the MTU to report."""

    def __init__(self, aggregator_ip: str, probe: dict, path_mtu: int, mode: str) -> None:
        self.aggregator_ip = aggregator_ip
        self.probe = probe
        self.mode = mode
        self.transport: Any = None
        # The largest MTU whose payload (payload_for_mtu) fits one verbs result packet.
        limit = int(probe["max_payload"])
        mtu = min(path_mtu, limit + 64)
        while mtu > 64 and _native.payload_for_mtu(mtu, False) > limit:
            mtu -= 8
        self.reported_mtu = mtu

    def connect(self, conn: Any) -> Optional[Any]:
        """Open and connect the queue pair for ``conn`` (a dataplane.Connection whose
        payload is fixed); None when auto mode falls back to UDP."""
        window = int(conn.window)  # the engine's: NETREDUCE_WINDOW, the job's fit, or all slots
        device = config.get("NETREDUCE_VERBS_DEVICE")
        try:
            t = _native.VerbsTransport(self.aggregator_ip, conn.payload_bytes, window, device,
                                       rc=config.get("NETREDUCE_VERBS_QP") == "rc")
            info = t.info()
            reply = conn._control.request(messages.VerbsConnect(
                ip=str(info["ip"]), qpn=int(info["qpn"]), ring_va=int(info["ring_va"]),
                ring_rkey=int(info["ring_rkey"]), ring_entries=int(info["ring_entries"]),
                ring_stride=int(info["ring_stride"]), rc=bool(info["rc"]),
                psn=int(info["psn"])))
            t.connect(reply.qpn, reply.psn)
        except (ValueError, _native.EngineError, ControlPlaneError) as exc:
            if self.mode == "auto":
                log.warning("%s: verbs transport unavailable (%s); using UDP", conn._where(), exc)
                return None
            raise DataPlaneError(f"{conn._where()}: NETREDUCE_TRANSPORT=verbs: {exc}") from None
        log.info("%s: verbs transport on %s (GID index %d, %s QPN %d)", conn._where(),
                 info["device"], info["gid_index"], "RC" if info["rc"] else "UC", info["qpn"])
        self.transport = t
        return t


def select(aggregator_ip: str, path_mtu: int, where: Callable[[], str]) -> Optional[VerbsChoice]:
    """The verbs choice for a rank reaching the aggregator at ``aggregator_ip``, or
    None for UDP. NETREDUCE_TRANSPORT=verbs fails with AdmissionError when no RoCEv2
    device holds the address that routes there (or the build has no verbs)."""
    mode = config.get("NETREDUCE_TRANSPORT")
    if mode == "udp":
        return None
    if not available():
        if mode == "verbs":
            raise AdmissionError(f"{where()}: NETREDUCE_TRANSPORT=verbs, but this build has no "
                                 "verbs transport (install libibverbs-dev and rebuild; "
                                 "`netreduce info` lists the transports)")
        return None
    try:
        probe = dict(_native.probe_verbs(aggregator_ip, config.get("NETREDUCE_VERBS_DEVICE")))
    except (ValueError, _native.EngineError) as exc:
        if mode == "verbs":
            raise AdmissionError(f"{where()}: NETREDUCE_TRANSPORT=verbs: {exc}") from None
        return None
    return VerbsChoice(aggregator_ip, probe, path_mtu, mode)
