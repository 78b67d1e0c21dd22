"""Atheris harness: the control port's decoder and dispatcher (the schema's
validating decoder, netreduce/protocol/messages.py, and netreduce/switch/dispatch.py
``answer``, with the negotiation handlers of netreduce/switch/coordinator.py and
the admission checks of protocol/auth.py).

One input is up to 8 request lines on one connection (a fresh Session), then the
connection closes: the disconnect hooks and release run as they do in the daemon,
so state left behind by one input (a job, a verifier, a negotiation run) would show
as a leak. The connection has said hello (a fresh one that has not is refused
before any handler runs). Every line must be answered with a JSON object carrying
``ok``, and a refusal must never carry the native binding's text (pybind11's
"incompatible function arguments"); any exception out of ``answer`` is a crash. After every input the harness checks that
nothing is left: no job record, no pool in the aggregator, no verifier, no
negotiation state.

Requests that would block the connection's thread by design (a watch that waits for
a failure, long-polls and payload waits) have their wait fields set to 0 first.

    python3 fuzz/control_fuzzer.py -runs=1000000 build/fuzz/control-corpus
"""
from __future__ import annotations

import hashlib
import json
import os
import sys

import atheris

from netreduce import _native
from netreduce.protocol import auth, codec, messages
from netreduce.protocol.auth import Guard
from netreduce.switch import coordinator, dispatch, payload, pending, server  # (handlers register)
from netreduce.switch.settings import aggregator_args

for _mod in (server, dispatch, pending, coordinator, auth, payload, messages):  # coverage feedback from these modules
    for _name, _fn in list(vars(_mod).items()):
        if getattr(_fn, "__module__", None) == _mod.__name__:
            if isinstance(_fn, type):
                for _k, _v in list(vars(_fn).items()):
                    if callable(_v) and hasattr(_v, "__code__"):
                        setattr(_fn, _k, atheris.instrument_func(_v))
            elif hasattr(_fn, "__code__"):
                setattr(_mod, _name, atheris.instrument_func(_fn))

_agg = _native.Aggregator(**aggregator_args(host="127.0.0.1", port=0, slots=4, payload_bytes=4096,
                                            max_jobs=4, memory_limit=1 << 22))
SRV = server.ControlServer("127.0.0.1", 0, _agg, guard=Guard(operator_secret=b"o" * 16))
SRV.socket.close()  # never served: the harness calls the parser directly


def _tame(line: bytes) -> bytes:
    """Zero the waits of requests that block by design; other lines pass as they are.
    Read with the daemon's own decoder (it skips unknown keys it need not read, so it
    takes lines a generic JSON parser refuses)."""
    try:
        msg = codec.decode_request(line)
    except Exception:
        return line
    if isinstance(msg, messages.NegotiateWatch):
        return b'{"cmd":"ping"}'
    tamed = False
    for field in ("wait", "wait_ms", "timeout"):
        if hasattr(msg, field):
            setattr(msg, field, 0.0)
            tamed = True
    return codec.encode_request(msg).rstrip(b"\n") if tamed else line


def _close(sess: server.Session) -> None:
    for hook in server.DISCONNECT_HOOKS:
        hook(SRV, sess)
    SRV.release(sess)
    SRV.guard.unbind(sess)


def test_one_input(data: bytes) -> None:
    sess = server.Session("127.0.0.1:4000")
    sess.version = messages.PROTOCOL_VERSION  # it said hello
    try:
        for line in data.split(b"\n")[:8]:
            out = dispatch.answer(SRV, sess, _tame(line))
            assert out.endswith(b"\n") and out.count(b"\n") == 1, out
            reply = json.loads(out)  # what the daemon writes back is one JSON object
            assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool), reply
            assert "incompatible function arguments" not in reply.get("error", ""), reply
    finally:
        _close(sess)
    assert not SRV.jobs, SRV.jobs
    assert _agg.counters()["jobs_active"] == 0
    assert not SRV.guard._verifiers and not SRV.guard._bound
    assert not getattr(SRV, "_nr_negotiation", {}), SRV._nr_negotiation


SEEDS = [
    b'{"cmd":"register","job":"a","rank":0,"size":1}\n{"cmd":"counters"}\n{"cmd":"release"}',
    b'{"cmd":"register","job":"a","rank":0,"size":2,"await_payload":true}\n{"cmd":"payload"}',
    b'{"cmd":"challenge"}\n{"cmd":"register","job":"a","rank":0,"size":1,"auth":{"pub":"00","sig":"00"}}',
    b'{"cmd":"negotiate_hello","job":"n","rank":0,"size":1,"role":"poll"}\n'
    b'{"cmd":"negotiate","reqs":[{"name":"t","kind":"allreduce","dtype":"float32","shape":[4],'
    b'"op":"sum"}],"ack":0}\n'
    b'{"cmd":"negotiate_submit","reqs":[0]}\n{"cmd":"negotiate_bye","done":1}',
    b'{"cmd":"register","job":"b","rank":0,"size":1e308}\n{"cmd":"hello","version":1}',
    b'{"cmd":"negotiate_hello","job":"n","rank":0,"size":1,"role":"submit"}\n{"cmd":"negotiate_abort"}',
    b'{"cmd":"challenge"}\n{"cmd":"counters","operator":"00"}',
    b'[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[',
]


def main() -> None:
    for seed in SEEDS:  # the seeds must pass before fuzzing starts
        test_one_input(seed)
    corpus = [a for a in sys.argv[1:] if not a.startswith("-")]
    if corpus and not os.path.isfile(corpus[0]):  # a corpus directory: start from the seeds
        os.makedirs(corpus[0], exist_ok=True)
        for seed in SEEDS:
            with open(os.path.join(corpus[0], hashlib.sha1(seed).hexdigest()), "wb") as f:
                f.write(seed)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
