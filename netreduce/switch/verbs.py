"""The aggregator's ``verbs_connect`` command: a verbs worker's queue pair joins its
job (docs/protocol.md, "Verbs peers").

A worker on the verbs transport registers like any rank, then announces its UC
queue pair: its address (the IPv4 of its RoCEv2 GID), QPN and the registered result
ring (VA, R_Key, entries, stride). The aggregator answers with the QPN the worker
must address (the rank's netreduce QPN, (job index << 12) | rank) and the first PSN
of the results it will send (the worker's expected PSN). An RC queue pair also
sends its first PSN (``psn``), where the aggregator's responder starts."""
from __future__ import annotations

from typing import Any, Dict

from netreduce.switch.commands import RequestError, register_handler

_FIELDS = ("ip", "qpn", "ring_va", "ring_rkey", "ring_entries", "ring_stride")


def verbs_connect(srv: Any, sess: Any, msg: Dict[str, Any]) -> Dict[str, Any]:
    job = sess.record
    if job is None:
        raise RequestError("'verbs_connect' before 'register' on this connection")
    missing = [f for f in _FIELDS if f not in msg]
    if missing:
        raise RequestError(f"job '{job.name}' rank {sess.rank}: verbs_connect lacks {missing}")
    attach = getattr(srv.aggregator, "attach_verbs_peer", None)
    if attach is None:
        raise RequestError(f"job '{job.name}' rank {sess.rank}: this aggregator has no verbs support")
    try:
        psn = attach(job.index, sess.rank, str(msg["ip"]), int(msg["qpn"]), int(msg["ring_va"]),
                     int(msg["ring_rkey"]), int(msg["ring_entries"]), int(msg["ring_stride"]),
                     rc=bool(msg.get("rc", False)), worker_psn=int(msg.get("psn", 0)))
    except (ValueError, RuntimeError) as exc:
        raise RequestError(f"job '{job.name}' rank {sess.rank}: verbs queue pair refused: {exc}") from None
    return {"qpn": (job.index << 12) | sess.rank, "psn": int(psn)}


register_handler("verbs_connect", verbs_connect)
