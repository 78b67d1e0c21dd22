"""Secure by default across hosts (docs/operations.md, Security), against a real
netreduce-switch started as an operator starts it:

- beyond loopback, a job whose ranks bring no secret is refused, naming the job and
  the peer, in the rank's error and in the daemon's log (--allow-open-jobs: admitted);
- while a real job runs, a stranger with its name (no secret, a wrong one) and a
  second job come and go: the strangers are refused and logged, the real job
  completes exactly;
- a name the operator pre-registered (--job-secrets: its public key, its secret or
  a file holding it; re-read on SIGHUP) cannot be squatted;
- the secret may come from a file (NETREDUCE_JOB_SECRET_FILE);
- TLS on the control port (--tls-cert/--tls-key, ranks with NETREDUCE_TLS_CA, a
  throwaway CA made here): a job completes; a rank trusting another CA, and one
  speaking plain TCP, are refused, the latter logged."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from netreduce.worker import dataplane
from netreduce.errors import NetReduceError
from netreduce.worker.negotiation import NegotiationClient
from netreduce.protocol import auth
from netreduce.protocol.address import parse_address
from netreduce.switch.child import READY_PREFIX
from tests.parallel.ranks import _CTX, run_ranks
from tests.parallel.tls_certs import make_ca as _ca, server_cert as _server_cert

ROOT = Path(__file__).resolve().parents[2]


class Daemon:
    """python -m netreduce.switch HOST ... with its log (stderr) in a file."""

    def __init__(self, tmp: Path, host: str, *args: str) -> None:
        self.log_path = tmp / f"switch-{uuid.uuid4().hex[:6]}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "netreduce.switch", "--host", host, "--port", "0",
             "--log-level", "INFO", *args],
            stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=ROOT)
        line = self.proc.stdout.readline()
        assert line.startswith(READY_PREFIX), (line, self.log())
        self.ready = line
        port = parse_address(line[len(READY_PREFIX):].split()[0])[1]
        self.address = ("127.0.0.1", port)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def wait_log(self, text: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.log()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture
def daemon(tmp_path):
    started = []

    def start(host: str = "0.0.0.0", *args: str) -> Daemon:
        d = Daemon(tmp_path, host, *args)
        started.append(d)
        return d
    yield start
    for d in started:
        d.stop()


def _sum_once(address, job, rank=0, size=1, **env):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with dataplane.connect(address, job, rank, size, timeout=20.0) as conn:
            x = np.full(8, rank + 1, np.int32)
            conn.allreduce(x)
            return x
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_beyond_loopback_a_job_without_a_secret_is_refused_and_named(daemon, monkeypatch):
    d = daemon("0.0.0.0")
    assert "job secrets required" in d.ready, d.ready
    job = "open-" + uuid.uuid4().hex[:6]
    monkeypatch.delenv("NETREDUCE_JOB_SECRET", raising=False)
    with pytest.raises(NetReduceError) as info:
        _sum_once(d.address, job)
    msg = str(info.value)
    assert f"job '{job}' (rank 0, from 127.0.0.1:" in msg, msg
    assert "NETREDUCE_JOB_SECRET" in msg and "--allow-open-jobs" in msg, msg
    log = d.wait_log(f"refused job '{job}'")
    assert f"refused job '{job}' (rank 0, from 127.0.0.1:" in log, log
    # the same job with a secret is admitted
    assert (_sum_once(d.address, job, NETREDUCE_JOB_SECRET="s3cret-" + job) == 1).all()


def test_allow_open_jobs_is_the_explicit_opt_out(daemon, monkeypatch):
    d = daemon("0.0.0.0", "--allow-open-jobs")
    assert "job secrets optional" in d.ready, d.ready
    monkeypatch.delenv("NETREDUCE_JOB_SECRET", raising=False)
    assert (_sum_once(d.address, "trusted-" + uuid.uuid4().hex[:6]) == 1).all()
    assert "admitting jobs without a secret" in d.wait_log("admitting jobs"), d.log()


def _real_rank(rank, size, address, job, secret, joined, done, steps):
    os.environ["NETREDUCE_JOB_SECRET"] = secret
    with dataplane.connect(address, job, rank, size, timeout=30.0) as conn:
        neg = NegotiationClient(address, job, rank, size, threshold=1 << 20, capacity=64,
                                start_timeout=30.0)
        joined.set()  # (every rank's hello returned: all of them hold the name now)
        sums = []
        for step in range(steps):
            x = np.arange(1000, dtype=np.int64) * (rank + 1) + step
            conn.allreduce(x)
            sums.append(bool((x == np.arange(1000) * size * (size + 1) // 2
                              + size * step).all()))
            if step == 1:
                done.wait(60)  # strangers come and go while the job is in the middle
        neg.close()
        return sums


def test_strangers_and_a_second_job_do_not_disturb_a_running_job(daemon, monkeypatch):
    d = daemon("0.0.0.0")
    job, secret = "real-" + uuid.uuid4().hex[:6], uuid.uuid4().hex
    joined, done = _CTX.Event(), _CTX.Event()
    outcome = {}

    def strangers():
        try:
            assert joined.wait(60)
            monkeypatch.delenv("NETREDUCE_JOB_SECRET", raising=False)
            refused = {}
            for name, env in (("none", {}), ("wrong", {"NETREDUCE_JOB_SECRET": "not-" + secret})):
                try:
                    _sum_once(d.address, job, rank=1, size=3, **env)
                except NetReduceError as exc:
                    refused[name] = str(exc)
            try:  # a stranger's hello, as a rank of the job
                NegotiationClient(d.address, job, 2, 3, threshold=1 << 20, capacity=64,
                                  start_timeout=5.0).close()
            except NetReduceError as exc:
                refused["hello"] = str(exc)
            other = "other-" + uuid.uuid4().hex[:6]
            outcome["second_job"] = _sum_once(d.address, other,
                                              NETREDUCE_JOB_SECRET=uuid.uuid4().hex).tolist()
            outcome["refused"] = refused
        except BaseException as exc:  # reported below
            outcome["error"] = repr(exc)
        finally:
            done.set()

    t = threading.Thread(target=strangers)
    t.start()
    results = run_ranks(_real_rank, 3, d.address, job, secret, joined, done, 4)
    t.join(60)
    assert "error" not in outcome, outcome
    assert all(all(r) for r in results), results            # exact, every step, every rank
    assert outcome["second_job"] == [1] * 8, outcome
    refused = outcome["refused"]
    assert set(refused) == {"none", "wrong", "hello"}, refused
    assert "sent none" in refused["none"] and "wrong job secret" in refused["wrong"], refused
    assert "sent none" in refused["hello"], refused
    log = d.wait_log("wrong job secret")
    for rank in (1, 2):
        assert f"refused job '{job}' (rank {rank}, from 127.0.0.1:" in log, log
    assert "wrong job secret" in log, log


def test_a_pre_registered_name_cannot_be_squatted(daemon, monkeypatch, tmp_path):
    job, secret = "reserved-" + uuid.uuid4().hex[:6], uuid.uuid4().hex
    keys = tmp_path / "job-secrets"
    keys.write_text(f"# the operator's list\n{job} ed25519:{auth.public_key(secret, job)}\n")
    d = daemon("127.0.0.1", "--job-secrets", str(keys))  # loopback: open jobs otherwise allowed
    monkeypatch.delenv("NETREDUCE_JOB_SECRET", raising=False)
    for env in ({}, {"NETREDUCE_JOB_SECRET": "squatter"}):  # first, before the real ranks
        with pytest.raises(NetReduceError, match="pre-registered this job name"):
            _sum_once(d.address, job, rank=0, size=2, **env)
    results = run_ranks(_real_rank, 2, d.address, job, secret, _CTX.Event(), _done(), 2)
    assert all(all(r) for r in results), results
    with pytest.raises(NetReduceError, match="pre-registered this job name"):
        _sum_once(d.address, job, rank=0, size=2)  # and after they left
    assert f"refused job '{job}' (rank 0, from 127.0.0.1:" in d.wait_log("refused"), d.log()
    # an open job of another name is still admitted on loopback
    assert (_sum_once(d.address, "free-" + uuid.uuid4().hex[:6]) == 1).all()


def test_job_secrets_take_a_secret_or_a_file_and_are_re_read_on_sighup(daemon, monkeypatch,
                                                                        tmp_path):
    inline, from_file, later = ("pre-" + uuid.uuid4().hex[:6] for _ in range(3))
    (tmp_path / "secret-file").write_text("filed-secret\n")
    keys = tmp_path / "job-secrets"
    keys.write_text(f"{inline} inline-secret\n{from_file} @secret-file  # beside this file\n")
    d = daemon("127.0.0.1", "--job-secrets", str(keys))
    monkeypatch.delenv("NETREDUCE_JOB_SECRET", raising=False)
    for job, secret in ((inline, "inline-secret"), (from_file, "filed-secret")):
        with pytest.raises(NetReduceError, match="pre-registered this job name"):
            _sum_once(d.address, job, NETREDUCE_JOB_SECRET="squatter")
        assert (_sum_once(d.address, job, NETREDUCE_JOB_SECRET=secret) == 1).all()
    assert (_sum_once(d.address, later) == 1).all()  # not listed yet: an open job on loopback
    keys.write_text(keys.read_text() + f"{later} later-secret\n")
    d.proc.send_signal(signal.SIGHUP)
    assert "3 job names pre-registered" in d.wait_log("3 job names pre-registered"), d.log()
    with pytest.raises(NetReduceError, match="pre-registered this job name"):
        _sum_once(d.address, later)
    assert (_sum_once(d.address, later, NETREDUCE_JOB_SECRET="later-secret") == 1).all()
    # A file broken by a typo keeps the registrations in force (no name becomes open).
    keys.write_text(f"{later}\n")
    d.proc.send_signal(signal.SIGHUP)
    assert "not re-read, the previous 3 registrations stay" in d.wait_log("not re-read"), d.log()
    with pytest.raises(NetReduceError, match="pre-registered this job name"):
        _sum_once(d.address, later)


def test_a_malformed_job_secrets_file_stops_the_daemon_naming_the_line(tmp_path):
    keys = tmp_path / "job-secrets"
    keys.write_text("ok-job s3cret\nbad-job ed25519:1234\n")
    out = subprocess.run([sys.executable, "-m", "netreduce.switch", "--host", "127.0.0.1",
                          "--port", "0", "--job-secrets", str(keys)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2, out
    assert f"{keys}:2: job 'bad-job'" in out.stderr and "ed25519" in out.stderr, out.stderr


def _done():
    e = _CTX.Event()
    e.set()
    return e


def test_the_secret_may_come_from_a_file(daemon, monkeypatch, tmp_path):
    d = daemon("127.0.0.1", "--require-secret")
    monkeypatch.delenv("NETREDUCE_JOB_SECRET", raising=False)
    path = tmp_path / "secret"
    path.write_text(uuid.uuid4().hex + "\n")
    monkeypatch.setenv("NETREDUCE_JOB_SECRET_FILE", str(path))
    results = run_ranks(lambda r, n, a, j: _sum_once(a, j, r, n).tolist(), 2, d.address,
                        "file-" + uuid.uuid4().hex[:6])
    assert results == [[3] * 8, [3] * 8], results
    path.write_text("")
    with pytest.raises(NetReduceError, match="NETREDUCE_JOB_SECRET_FILE=.* is empty"):
        _sum_once(d.address, "file-" + uuid.uuid4().hex[:6])


# --- TLS ------------------------------------------------------------------------------
def _tls_rank(rank, size, address, job):
    with dataplane.connect(address, job, rank, size, timeout=30.0) as conn:
        neg = NegotiationClient(address, job, rank, size, threshold=1 << 20, capacity=64,
                                start_timeout=30.0)  # the hello, over TLS too
        x = np.full(1000, rank + 1, np.float32)
        conn.allreduce(x)
        neg.close()
        return bool((x == size * (size + 1) // 2).all())


def test_control_connections_over_tls(daemon, monkeypatch, tmp_path):
    ca_key, ca_cert, ca_path = _ca(tmp_path, "ca")
    cert, key = _server_cert(tmp_path, ca_key, ca_cert)
    d = daemon("127.0.0.1", "--tls-cert", str(cert), "--tls-key", str(key))
    assert "TLS" in d.ready, d.ready
    address = f"127.0.0.1:{d.address[1]}"
    secret = uuid.uuid4().hex
    monkeypatch.setenv("NETREDUCE_JOB_SECRET", secret)
    monkeypatch.setenv("NETREDUCE_SWITCH", address)
    monkeypatch.setenv("NETREDUCE_TLS_CA", str(ca_path))
    job = "tls-" + uuid.uuid4().hex[:6]
    results = run_ranks(_tls_rank, 2, d.address, job)
    assert results == [True, True], results
    # A rank that trusts another CA refuses the aggregator, naming it and why.
    _, _, other_ca = _ca(tmp_path, "other-ca")
    monkeypatch.setenv("NETREDUCE_TLS_CA", str(other_ca))
    with pytest.raises(NetReduceError, match=rf"aggregator 127.0.0.1:{d.address[1]}: its TLS "
                                             r"certificate is not trusted"):
        _sum_once(d.address, "tls2-" + uuid.uuid4().hex[:6])
    # A rank without TLS: the daemon refuses the handshake and says who it was.
    monkeypatch.delenv("NETREDUCE_TLS_CA")
    with pytest.raises(NetReduceError):
        _sum_once(d.address, "plain-" + uuid.uuid4().hex[:6])
    log = d.wait_log("TLS handshake failed")
    assert "refused control connection from 127.0.0.1:" in log and "TLS handshake failed" in log, log
    # and the port still serves TLS ranks
    monkeypatch.setenv("NETREDUCE_TLS_CA", str(ca_path))
    assert run_ranks(_tls_rank, 2, d.address, "tls3-" + uuid.uuid4().hex[:6]) == [True, True]


def test_job_key_prints_the_line_an_operator_registers(tmp_path, daemon, monkeypatch):
    env = dict(os.environ, NETREDUCE_JOB_SECRET="the-job-secret")
    env.pop("NETREDUCE_JOB_SECRET_FILE", None)
    out = subprocess.run([sys.executable, "-m", "netreduce.cli", "job-key", "train-7"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"train-7 ed25519:{auth.public_key('the-job-secret', 'train-7')}"
    path = tmp_path / "job-secrets"
    path.write_text(out.stdout)  # the line as printed is what the daemon reads
    d = daemon("0.0.0.0", "--job-secrets", str(path))
    monkeypatch.delenv("NETREDUCE_JOB_SECRET", raising=False)
    with pytest.raises(NetReduceError, match="pre-registered this job name"):
        _sum_once(d.address, "train-7", NETREDUCE_JOB_SECRET="squatter")
    assert (_sum_once(d.address, "train-7", NETREDUCE_JOB_SECRET="the-job-secret") == 1).all()
    env.pop("NETREDUCE_JOB_SECRET")
    out = subprocess.run([sys.executable, "-m", "netreduce.cli", "job-key", "train-7"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 2 and "no job secret" in out.stderr, out.stderr
