"""The aggregator's ``verbs_connect`` command: a verbs worker's queue pair joins its
job (docs/protocol.md, "Verbs peers").

A worker on the verbs transport registers like any rank, then announces its UC
queue pair: its address (the IPv4 of its RoCEv2 GID), QPN and the registered result
ring (VA, R_Key, entries, stride). The aggregator answers with the QPN the worker
must address (the rank's netreduce QPN, (job index << 12) | rank) and the first PSN
of the results it will send (the worker's expected PSN). An RC queue pair also
sends its first PSN (``psn``), where the aggregator's responder starts."""
from __future__ import annotations

from typing import Any

from netreduce.protocol.messages import VerbsConnect, VerbsConnectReply
from netreduce.switch.commands import RequestError, register_handler


def verbs_connect(srv: Any, sess: Any, msg: VerbsConnect) -> VerbsConnectReply:
    job = sess.record
    if job is None:
        raise RequestError("'verbs_connect' before 'register' on this connection")
    attach = getattr(srv.aggregator, "attach_verbs_peer", None)
    if attach is None:
        raise RequestError(f"job '{job.name}' rank {sess.rank}: this aggregator has no verbs support")
    try:
        psn = attach(job.index, sess.rank, msg.ip, msg.qpn, msg.ring_va, msg.ring_rkey,
                     msg.ring_entries, msg.ring_stride, rc=msg.rc, worker_psn=msg.psn)
    except (ValueError, RuntimeError) as exc:
        raise RequestError(f"job '{job.name}' rank {sess.rank}: verbs queue pair refused: {exc}") from None
    return VerbsConnectReply(qpn=(job.index << 12) | sess.rank, psn=int(psn))


register_handler(VerbsConnect, verbs_connect)
