"""What ``netreduce info`` says about an aggregator address: how it parses and
resolves, the path MTU from this host and the payload that path carries, and,
when the aggregator answers, each of its jobs' payload and why it was chosen."""
from __future__ import annotations

from typing import Any, Dict

from netreduce.protocol.address import format_address, parse_address, resolve
from netreduce.protocol.client import ControlClient
from netreduce.errors import ControlPlaneError


def probe(text: str, what: str = "NETREDUCE_SWITCH", timeout: float = 2.0) -> Dict[str, Any]:
    out: Dict[str, Any] = {"given": text}
    try:
        address = parse_address(text, what=what)
        out["address"] = format_address(address)
        address = resolve(address)
        out["resolved"] = address[0]
    except ValueError as exc:
        out["error"] = str(exc)
        return out
    try:
        from netreduce import _native
        mtu, ipv6 = _native.path_mtu(*address)
    except (ImportError, ValueError, RuntimeError) as exc:
        out["path_error"] = str(exc)
    else:
        payload = _native.payload_for_mtu(mtu, ipv6)
        out.update(path_mtu=mtu, ipv6=ipv6, payload_bytes=payload,
                   payload_reason=f"payload {payload} B: path MTU {mtu} from this host toward "
                                  f"{address[0]} (unless the aggregator's --payload-bytes or "
                                  "another rank's path is smaller)")
    try:
        with ControlClient(address, timeout=timeout) as client:
            counters = client.call("counters", timeout=timeout)
    except ControlPlaneError as exc:
        out["unreachable"] = str(exc)
        return out
    out["jobs"] = {name: {k: job.get(k) for k in ("size", "ranks", "payload_bytes",
                                                   "payload_reason")}
                   for name, job in counters.get("jobs", {}).items()}
    if counters.get("hidden_jobs"):  # jobs with a secret: the operator's to read
        out["hidden_jobs"] = counters["hidden_jobs"]
    return out
