"""A request line to its reply, in process (netreduce/switch/dispatch.py on the schema
of netreduce/protocol/messages.py): the version exchange first, refusals that name
the command and the field, values a handler cannot use refused by their kind only,
and nothing of the daemon's internals in any reply."""
from __future__ import annotations

import json

import msgspec
import pytest

from netreduce.protocol import codec, messages
from netreduce.switch import dispatch, server
from netreduce.switch import daemon, rendezvous, service  # noqa: F401  (commands register)


@pytest.fixture
def srv():
    s = server.ControlServer("127.0.0.1", 0, aggregator=None)
    s.socket.close()  # never served: lines go straight to dispatch.answer
    return s


def _ask(srv, sess, line: bytes) -> dict:
    out = dispatch.answer(srv, sess, line)
    assert out.endswith(b"\n") and out.count(b"\n") == 1, out
    return json.loads(out)


def test_the_first_request_must_say_the_protocol_version(srv):
    sess = server.Session("127.0.0.1:1")
    reply = _ask(srv, sess, b'{"cmd":"ping"}')
    assert not reply["ok"] and "protocol 1" in reply["error"] and \
        f"control protocol {messages.PROTOCOL_VERSION}" in reply["error"], reply
    reply = _ask(srv, sess, b'{"cmd":"hello","version":99,"software":"netreduce 9"}')
    assert not reply["ok"] and "speaks control protocol 99" in reply["error"], reply
    reply = _ask(srv, sess, b'{"cmd":"hello","id":0,"version":%d}' % messages.PROTOCOL_VERSION)
    assert reply["ok"] and reply["id"] == 0 and reply["version"] == messages.PROTOCOL_VERSION
    assert _ask(srv, sess, b'{"cmd":"ping","id":3}') == {"ok": True, "id": 3}


def test_refusals_name_the_command_and_the_field(srv):
    sess = server.Session("127.0.0.1:1")
    sess.version = messages.PROTOCOL_VERSION
    reply = _ask(srv, sess, b'{"cmd":"register","id":5,"job":"j","rank":0,"size":1e308}')
    assert reply == {"ok": False, "id": 5, "error": "malformed 'register' request: Expected "
                                                     "`int`, got `float` - at `$.size`"}
    reply = _ask(srv, sess, b'{"cmd":"verbs_connect","ip":"x","qpn":1,"ring_va":-1,'
                            b'"ring_rkey":1,"ring_entries":1,"ring_stride":1}')
    assert "at `$.ring_va`" in reply["error"], reply
    assert _ask(srv, sess, b'{"cmd":7}')["error"] == \
        "malformed request: 'cmd' must name a command, got 7"
    assert "not a JSON object" in _ask(srv, sess, b"GET / HTTP/1.1")["error"]


def test_what_a_handler_cannot_use_is_refused_without_its_text(srv, monkeypatch):
    sess = server.Session("127.0.0.1:1")
    sess.version = messages.PROTOCOL_VERSION

    def binding_like(srv, sess, msg):
        raise TypeError("add_job(): incompatible function arguments. The following "
                        "argument types are supported: ...")

    def bug(srv, sess, msg):
        raise RuntimeError("a traceback's worth of internals")
    monkeypatch.setitem(dispatch.HANDLERS, messages.FellBack, binding_like)
    reply = _ask(srv, sess, b'{"cmd":"fell_back"}')
    assert reply["error"] == ("malformed 'fell_back' request: the aggregator cannot use its "
                              "values (TypeError)"), reply
    monkeypatch.setitem(dispatch.HANDLERS, messages.FellBack, bug)
    reply = _ask(srv, sess, b'{"cmd":"fell_back"}')
    assert "internal error" in reply["error"] and "internals" not in reply["error"], reply


def test_every_command_has_a_reply_type_and_round_trips():
    service.install()  # fell_back, as the daemon's main() does
    for cmd, (req, rep) in messages.COMMANDS.items():
        assert req.__struct_config__.tag == cmd and messages.REPLY_OF[req] is rep
        # every command is served somewhere (job_status by a job's rank 0, once published;
        # elastic_* by netreduce-run's elastic driver, launcher/elastic/server.py)
        assert req in dispatch.HANDLERS or cmd in ("hello", "job_status") or \
            cmd.startswith("elastic_"), cmd
    # each reply type decodes (the typed decoders are made on first use, not at import:
    # a type msgspec cannot decode fails here, not in a rank)
    for _, rep in messages.COMMANDS.values():
        try:
            assert isinstance(codec.decode_reply(b"{}", rep), rep)
        except msgspec.ValidationError:  # a required field missing: decoded all the same
            pass
    msg = messages.Negotiate(id=4, reqs=[3, messages.TensorRequest("t", "allreduce", "float32",
                                                                   [2, 3], "sum")], ack=1)
    back = codec.decode_request(codec.encode_request(msg))
    assert back == msg and back.reqs[1].signature().shape == (2, 3)
