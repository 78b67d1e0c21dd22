"""Admission and isolation against a real netreduce-switch on loopback: job secrets
proved on a challenge (netreduce/protocol/auth.py), refusals that name the problem,
counters hidden from other jobs, the operator's secret, --require-secret, and
wrong-key data packets dropped, counted and never added."""
from __future__ import annotations

import json
import os
import socket
import time
import uuid

import numpy as np
import pytest

from netreduce import _native
from netreduce.worker import dataplane
from netreduce.protocol import auth, codec
from netreduce.protocol.client import ControlClient
from netreduce.errors import AdmissionError, ControlPlaneError
from netreduce.switch import spawn
from tests.parallel.ranks import run_ranks
from tests.raw_register import data_socket, register

SECRET = "s3cret-" + uuid.uuid4().hex
OPERATOR = b"operator-" + uuid.uuid4().hex.encode()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    path = tmp_path_factory.mktemp("op") / "operator.secret"
    path.write_bytes(OPERATOR + b"\n")
    proc = spawn(host="127.0.0.1", port=0, extra_args=["--operator-secret-file", str(path)])
    yield proc
    proc.stop()


def _job() -> str:
    return "sec-" + uuid.uuid4().hex[:8]


def _register(client: ControlClient, job: str, rank: int, size: int, secret: str = "",
              sock=None, **kw):
    return register(client, job, rank, size, sock, **auth.prove(client.call, secret, job, rank),
                    **kw)


def _refused(client: ControlClient, *args, **kw) -> str:
    with pytest.raises(ControlPlaneError) as err:
        _register(client, *args, **kw)
    return str(err.value)


def test_secret_job_admits_only_ranks_that_prove_its_secret(daemon):
    job = _job()
    with ControlClient(daemon.address) as r0, ControlClient(daemon.address) as other:
        _register(r0, job, 0, 3, SECRET)
        msg = _refused(other, job, 1, 3, "not-" + SECRET)
        assert f"job '{job}'" in msg and "rank 1" in msg and "wrong job secret" in msg
        msg = _refused(other, job, 1, 3)  # no secret at all
        assert "admitted with a job secret and this rank sent none" in msg
        # The same connection, after its refusals, still joins with the right secret.
        grant = _register(other, job, 1, 3, SECRET)
        assert grant["job_index"] > 0


def test_refusals_name_the_problem(daemon):
    job = _job()
    with ControlClient(daemon.address) as r0:
        _register(r0, job, 0, 2, SECRET)
        with ControlClient(daemon.address) as c:
            msg = _refused(c, job, 0, 2, SECRET)
            assert "rank 0 is already registered" in msg
        with ControlClient(daemon.address) as c:
            msg = _refused(c, job, 2, 2, SECRET)
            assert "rank 2 out of range for world size 2" in msg
        with ControlClient(daemon.address) as c:
            msg = _refused(c, job, 1, 3, SECRET)
            assert "rank 1 says world size 3 but the job was registered with 2" in msg
    # An open job (no secret) refuses a rank that brings one, and says why.
    open_job = _job()
    with ControlClient(daemon.address) as r0, ControlClient(daemon.address) as c:
        _register(r0, open_job, 0, 2)
        assert "admitted without one" in _refused(c, open_job, 1, 2, SECRET)


def test_a_proof_cannot_be_replayed_or_sent_without_a_challenge(daemon):
    job = _job()
    with ControlClient(daemon.address) as r0:
        nonce = r0.call("challenge")["nonce"]
        proof = auth.job_proof(SECRET, job, 0, nonce)
        register(r0, job, 0, 2, auth=proof)
        # What an eavesdropper saw on r0's connection, replayed on its own.
        with ControlClient(daemon.address) as thief:
            with pytest.raises(ControlPlaneError, match="send 'challenge' first"):
                register(thief, job, 0, 2, auth=proof)
            thief.call("challenge")
            with pytest.raises(ControlPlaneError, match="does not verify"):
                register(thief, job, 1, 2, auth=proof)
        # The proof carries no secret: only a public key and a signature.
        wire = codec.to_builtins(proof)
        assert SECRET not in json.dumps(wire) and set(wire) == {"pub", "sig"}


def test_a_finished_secret_jobs_counters_stay_its_own_and_the_operators(daemon):
    """The counters a job leaves behind (--finished-job-s) are read as the live job's:
    a stranger, or a reader with another secret under the same name, sees nothing."""
    job = _job()
    with ControlClient(daemon.address) as r0, ControlClient(daemon.address) as r1:
        _register(r0, job, 0, 2, SECRET)
        _register(r1, job, 1, 2, SECRET)
        r1.call("release")
        r0.call("release")  # the last rank out: the pool is freed, the counters kept
        mine = r0.call("counters")["jobs"]
        assert mine[job]["finished"] is True and mine[job]["ranks"] == [] and \
            mine[job]["size"] == 2
    with ControlClient(daemon.address) as stranger:
        assert job not in stranger.call("counters")["jobs"]
    with ControlClient(daemon.address) as guess:
        got = guess.call("counters", job=job, **auth.prove(guess.call, "guess", job, -1))
        assert job not in got["jobs"] and got["hidden_jobs"] >= 1
    with ControlClient(daemon.address) as reader:
        got = reader.call("counters", job=job, **auth.prove(reader.call, SECRET, job, -1))
        assert got["jobs"][job]["finished"] is True
    with ControlClient(daemon.address) as op:
        nonce = op.call("challenge")["nonce"]
        got = op.call("counters", operator=auth.operator_proof(OPERATOR, nonce))
        assert got["jobs"][job]["finished"] is True


def test_the_name_alone_cannot_watch_or_abort_a_job(daemon):
    job = _job()
    with ControlClient(daemon.address) as r0, ControlClient(daemon.address) as thief:
        r0.call("negotiate_hello", job=job, rank=0, size=2, role="submit",
                **auth.prove(r0.call, SECRET, job, 0))
        with pytest.raises(ControlPlaneError, match="admitted with a job secret"):
            thief.call("negotiate_hello", job=job, rank=1, size=2, role="watch")
        with pytest.raises(ControlPlaneError, match="wrong job secret"):
            thief.call("negotiate_hello", job=job, rank=1, size=2, role="watch",
                       **auth.prove(thief.call, "guess", job, 1))
        with pytest.raises(ControlPlaneError, match="negotiate_hello must come first"):
            thief.call("negotiate_abort", reason="hijack")


def test_counters_of_a_secret_job_are_its_own_and_the_operators(daemon):
    secret_job, open_job = _job(), _job()
    with ControlClient(daemon.address) as mine, ControlClient(daemon.address) as op, \
            ControlClient(daemon.address) as other:
        _register(mine, secret_job, 0, 2, SECRET)
        _register(other, open_job, 0, 2)
        assert secret_job in mine.call("counters")["jobs"]
        seen = other.call("counters")
        assert secret_job not in seen["jobs"] and open_job in seen["jobs"]
        assert seen["hidden_jobs"] >= 1 and "global" in seen
        with ControlClient(daemon.address) as stranger:  # no job at all
            assert secret_job not in stranger.call("counters")["jobs"]
            nonce = stranger.call("challenge")["nonce"]
            with pytest.raises(ControlPlaneError, match="wrong operator secret"):
                stranger.call("counters", operator=auth.operator_proof(b"x" * 16, nonce))
        nonce = op.call("challenge")["nonce"]
        everything = op.call("counters", operator=auth.operator_proof(OPERATOR, nonce))
        assert {secret_job, open_job} <= set(everything["jobs"])
        # A reader that proves the job's secret (without registering a rank) sees it.
        with ControlClient(daemon.address) as reader:
            got = reader.call("counters", job=secret_job,
                              **auth.prove(reader.call, SECRET, secret_job, -1))
            assert secret_job in got["jobs"]


def test_require_secret_refuses_open_jobs():
    with spawn(host="127.0.0.1", port=0, extra_args=["--require-secret"]) as sw:
        job = _job()
        with ControlClient(sw.address) as c:
            msg = _refused(c, job, 0, 1)
            assert "requires a job secret (--require-secret)" in msg
            assert "NETREDUCE_JOB_SECRET" in msg
            assert _register(c, job, 0, 1, SECRET)["job_index"] > 0


def _secret_rank(rank, size, address, job, secret):
    os.environ["NETREDUCE_JOB_SECRET"] = secret
    with dataplane.connect(address, job, rank, size, timeout=20.0) as conn:
        a = np.arange(100_000, dtype=np.int64) * (rank + 1)
        conn.allreduce(a)
        assert (a == np.arange(100_000, dtype=np.int64) * (size * (size + 1) // 2)).all()
        return conn.counters()["jobs"][job]["bytes_reduced"]


def test_ranks_with_the_users_secret_reduce_exactly_and_a_wrong_one_is_refused():
    with spawn(host="127.0.0.1", port=0, extra_args=["--require-secret"]) as sw:
        job = _job()
        reduced = run_ranks(_secret_rank, 3, sw.address, job, SECRET)
        assert reduced[0] > 0
        job = _job()
        with ControlClient(sw.address) as r0:
            _register(r0, job, 0, 2, SECRET)
            os.environ["NETREDUCE_JOB_SECRET"] = "wrong"
            try:
                with pytest.raises(AdmissionError, match="wrong job secret"):
                    dataplane.connect(sw.address, job, 1, 2, timeout=5.0)
            finally:
                del os.environ["NETREDUCE_JOB_SECRET"]


def _packet(fields: dict, payload: bytes) -> bytes:
    return _native.encode_header(fields) + payload + b"\0" * ((-len(payload)) % 4) + b"\0" * 4


def test_wrong_key_packets_are_dropped_counted_and_never_added(daemon):
    job = _job()
    with ControlClient(daemon.address) as c:
        s = data_socket(c)
        grant = _register(c, job, 0, 1, SECRET, sock=s)
        s.settimeout(0.3)
        payload = np.arange(16, dtype=np.int32).tobytes()
        fields = {"jumbo": 1, "length": len(payload), "dtype": 4, "op": 0, "psn": 7,
                  "dest_qp": grant["job_index"] << 12}
        dst = (daemon.address[0], grant["data_port"])
        for wrong in (grant["key"] ^ 1, grant["key"] ^ 0x80000000, 0):
            s.sendto(_packet(dict(fields, key=wrong), payload), dst)
        with pytest.raises(socket.timeout):  # no result for a packet that was not added
            s.recvfrom(65536)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            jc = c.call("counters")["jobs"][job]
            if jc["drop_bad_key"] >= 3:
                break
            time.sleep(0.02)
        assert jc["drop_bad_key"] == 3 and jc["bytes_reduced"] == 0
        assert jc["rounds_started"] == 0 and jc["slots_completed"] == 0
        # The right key, same slot and round: added once, and the result is exactly it.
        s.sendto(_packet(dict(fields, key=grant["key"]), payload), dst)
        s.settimeout(10)  # the 0.3 s above was for a result that must not come
        data, _ = s.recvfrom(65536)
        assert data[32:32 + len(payload)] == payload
        jc = c.call("counters")["jobs"][job]
        assert jc["bytes_reduced"] == len(payload) and jc["slots_completed"] == 1
        s.close()


class _Recorder:
    """A TCP relay in front of the control port that keeps every byte it carries."""

    def __init__(self, target) -> None:
        import threading
        self.target, self.seen = target, bytearray()
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.address = self.lsock.getsockname()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading
        while True:
            try:
                a, _ = self.lsock.accept()
            except OSError:
                return
            b = socket.create_connection(self.target)
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src, dst) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self.seen += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.lsock.close()


def test_the_secret_never_crosses_the_control_connection(daemon, monkeypatch):
    relay = _Recorder(daemon.address)
    monkeypatch.setenv("NETREDUCE_JOB_SECRET", SECRET)
    job = _job()
    try:
        with dataplane.connect(relay.address, job, 0, 1, timeout=10.0) as conn:
            a = np.arange(1000, dtype=np.int32)
            conn.allreduce(a)
            assert (a == np.arange(1000)).all()
            assert job in conn.counters()["jobs"]
    finally:
        relay.close()
    seen = bytes(relay.seen)
    assert b'"challenge"' in seen and b'"auth"' in seen  # the proof went through the relay
    assert SECRET.encode() not in seen and SECRET.encode().hex().encode() not in seen
