"""netreduce/protocol/auth.py in process: proofs verify only on their own nonce and
job, the verifier follows the first binding connection, the operator's HMAC, and the
secret never shown by `netreduce info`."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from netreduce.protocol import auth


class Sess:
    def __init__(self) -> None:
        self.state: dict = {}
        self.peer = "127.0.0.1:1"


def _bind(guard, job, rank, secret):
    s = Sess()
    nonce = guard.challenge(s).nonce
    guard.admit(s, job, rank, auth.job_proof(secret, job, rank, nonce) if secret else None)
    return s


def test_same_secret_same_key_other_job_or_secret_other_key():
    a = auth.job_proof("k", "job", 0, "00" * 32).pub
    assert a == auth.job_proof("k", "job", 1, "11" * 32).pub
    assert a != auth.job_proof("k", "job2", 0, "00" * 32).pub
    assert a != auth.job_proof("k2", "job", 0, "00" * 32).pub


def test_verifier_is_the_first_connections_and_dies_with_the_last():
    g = auth.Guard()
    s0 = _bind(g, "j", 0, "right")
    s1 = _bind(g, "j", 1, "right")
    with pytest.raises(auth.AuthError, match="wrong job secret"):
        _bind(g, "j", 2, "wrong")
    with pytest.raises(auth.AuthError, match="sent none"):
        _bind(g, "j", 2, "")
    assert not g.may_read(Sess(), "j") and g.may_read(s0, "j")
    g.unbind(s0)
    g.unbind(s1)
    _bind(g, "j", 0, "another")  # the name is free again: a new run, a new secret


def test_a_proof_is_good_for_its_nonce_job_and_rank_only():
    g = auth.Guard()
    s = Sess()
    nonce = g.challenge(s).nonce
    proof = auth.job_proof("k", "j", 0, nonce)
    for job, rank in (("other", 0), ("j", 1)):
        s2 = Sess()
        s2.state["nonce"] = bytes.fromhex(nonce)
        with pytest.raises(auth.AuthError, match="does not verify"):
            g.admit(s2, job, rank, proof)
    g.admit(s, "j", 0, proof)
    with pytest.raises(auth.AuthError, match="challenge"):  # the nonce was used up
        g.admit(Sess(), "j", 0, proof)


def test_require_secret_and_operator():
    g = auth.Guard(require_secret=True, operator_secret=b"o" * 16)
    with pytest.raises(auth.AuthError, match="requires a job secret"):
        _bind(g, "open", 0, "")
    s = Sess()
    nonce = g.challenge(s).nonce
    with pytest.raises(auth.AuthError, match="wrong operator secret"):
        g.operator(s, auth.operator_proof(b"x" * 16, nonce))
    nonce = g.challenge(s).nonce
    assert g.operator(s, auth.operator_proof(b"o" * 16, nonce))
    assert g.may_read(s, "anything")


def test_operator_secret_file_must_be_long_enough(tmp_path):
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(ValueError, match="at least 16"):
        auth.read_operator_secret(str(short))


def test_info_never_shows_the_job_secret():
    env = dict(os.environ, NETREDUCE_JOB_SECRET="do-not-print-me-0123456789")
    out = subprocess.run([sys.executable, "-m", "netreduce.cli", "info", "--json"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "do-not-print-me" not in out.stdout + out.stderr
    knob = json.loads(out.stdout)["knobs"]["NETREDUCE_JOB_SECRET"]
    assert knob["value"] == "<set, hidden>" and knob["source"] == "environment"
