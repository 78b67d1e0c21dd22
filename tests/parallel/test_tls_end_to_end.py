"""TLS on every control connection of a real job, as users start one: a real
netreduce-switch with --tls-cert/--tls-key (a throwaway CA made here), ranks started
by netreduce-run with NETREDUCE_TLS_CA, each calling nr.init() and all-reducing;
with NETREDUCE_TLS_CERT too, the job's own servers (rank 0's rendezvous, the per-rank
aggregators of NETREDUCE_FALLBACK=host) serve TLS and a plain client gets nothing
from them; `netreduce info --switch` reads the daemon over TLS; a rank trusting
another CA fails nr.init() with an error naming the job, the rank, the aggregator
and the knob."""
from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from tests.parallel.test_secure_by_default import Daemon
from tests.parallel.tls_certs import make_ca, server_cert
from tests.procs import ROOT, launch_script

RANK = r"""
import json, os, socket
import numpy as np
import netreduce as nr
from netreduce.errors import NetReduceError
try:
    nr.init()
except NetReduceError as exc:
    print(json.dumps({"init_error": type(exc).__name__, "message": str(exc)}), flush=True)
    raise SystemExit(3)
r, n = nr.rank(), nr.size()
x = np.arange(1000, dtype=np.int32) * (r + 1)
y = nr.allreduce(x, op=nr.Sum)
ok = bool((y == np.arange(1000) * n * (n + 1) // 2).all())
plain = None
if os.environ.get("PROBE_RENDEZVOUS") and r == 0:
    # A client without TLS at rank 0's rendezvous: a TLS server answers no JSON line.
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b'{"cmd":"hello","version":2}\n{"cmd":"challenge"}\n')
        s.settimeout(5)
        try:
            plain = s.recv(4096).decode(errors="replace")
        except (socket.timeout, ConnectionError) as e:
            plain = repr(e)
y = nr.allreduce(x, op=nr.Sum)  # the job still runs after the stranger
ok = ok and bool((y == np.arange(1000) * n * (n + 1) // 2).all())
nr.shutdown()
print(json.dumps({"rank": r, "ok": ok, "plain": plain}), flush=True)
"""


def _reports(out: str):
    return [json.loads(line[line.index("{"):]) for line in out.splitlines() if "{" in line
            and line.rstrip().endswith("}")]


@pytest.fixture
def tls_daemon(tmp_path):
    ca_key, ca_cert, ca = make_ca(tmp_path, "ca")
    cert, key = server_cert(tmp_path, ca_key, ca_cert)
    d = Daemon(tmp_path, "127.0.0.1", "--tls-cert", str(cert), "--tls-key", str(key))
    yield d, ca, cert, key
    d.stop()


def test_a_job_over_tls_end_to_end(tls_daemon):
    d, ca, _, _ = tls_daemon
    switch = f"127.0.0.1:{d.address[1]}"
    out = launch_script(RANK, 3, NETREDUCE_SWITCH=switch, NETREDUCE_TLS_CA=str(ca))
    reports = _reports(out.stdout)
    assert out.returncode == 0, out.stdout
    assert sorted(r["rank"] for r in reports) == [0, 1, 2] and all(r["ok"] for r in reports), \
        out.stdout
    assert "TLS handshake failed" not in d.log(), d.log()
    # netreduce info --switch reads the daemon's counters over TLS.
    info = subprocess.run([sys.executable, "-m", "netreduce.cli", "info", "--switch", switch,
                           "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=dict(__import__("os").environ, NETREDUCE_TLS_CA=str(ca)))
    assert info.returncode == 0, info.stderr
    agg = json.loads(info.stdout)["aggregator"]
    assert "unreachable" not in agg and "jobs" in agg, agg


def test_the_jobs_own_servers_serve_tls_with_a_certificate(tls_daemon):
    d, ca, cert, key = tls_daemon
    out = launch_script(RANK, 2, NETREDUCE_SWITCH=f"127.0.0.1:{d.address[1]}",
                        NETREDUCE_TLS_CA=str(ca), NETREDUCE_TLS_CERT=str(cert),
                        NETREDUCE_TLS_KEY=str(key), NETREDUCE_FALLBACK="host",
                        PROBE_RENDEZVOUS="1")
    reports = _reports(out.stdout)
    assert out.returncode == 0, out.stdout
    assert all(r["ok"] for r in reports) and len(reports) == 2, out.stdout
    plain = [r["plain"] for r in reports if r["rank"] == 0][0]
    assert plain is not None and '"ok"' not in plain, plain  # no JSON to a plain client


def test_a_rank_trusting_another_ca_fails_init_naming_what_to_set(tls_daemon, tmp_path):
    d, _, _, _ = tls_daemon
    _, _, other = make_ca(tmp_path, "other-ca")
    job = "wrong-ca-" + uuid.uuid4().hex[:6]
    switch = f"127.0.0.1:{d.address[1]}"
    out = launch_script(RANK, 1, NETREDUCE_SWITCH=switch, NETREDUCE_TLS_CA=str(other),
                        NETREDUCE_JOB=job)
    assert out.returncode != 0, out.stdout
    errors = [r for r in _reports(out.stdout) if "init_error" in r]
    assert errors, out.stdout
    msg = errors[0]["message"]
    for part in (f"job '{job}'", "rank 0", switch, "NETREDUCE_TLS_CA", "not trusted"):
        assert part in msg, msg
    assert "TLS handshake failed" in d.wait_log("TLS handshake failed"), d.log()
