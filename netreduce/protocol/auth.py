"""Job secrets and the operator's secret on the control port (docs/operations.md,
Security; docs/protocol.md, Admission).

A job's ranks share a secret: ``netreduce-run`` generates one per run, another
launcher exports ``NETREDUCE_JOB_SECRET`` on every rank. The secret never crosses
the network. From it and the job's name each rank derives the same Ed25519 key pair
(the 32-byte seed is HMAC-SHA256(secret, "netreduce-job-key-v1" || job)). A
connection that binds to a job (``register``, ``negotiate_hello``, or ``counters``
for one job) first asks for a ``challenge``: a fresh 32-byte server nonce, good for
one proof. Its request then carries ``auth = {pub, sig}``: the public key and a
signature over (domain, nonce, job, rank). The aggregator keeps no secret, only the
public key of the first connection of the job (its *verifier*), and admits a later
connection only if it proves the same key on its own nonce. So a job's name, the
traffic of its control connections, or the aggregator's memory are not enough to
join it, abort it, watch it or read its counters. Why not a bare HMAC response: the
aggregator would need the secret to check it, and nothing could carry it there but
the network.

The operator's secret (``netreduce-switch --operator-secret-file``) is the
aggregator's own, so it is proved with HMAC-SHA256 over the connection's nonce;
that connection may read every job's counters. A job without a secret (an old
client, the single-process embedded aggregator, a user launcher without
NETREDUCE_JOB_SECRET) is *open*: anyone who knows its name can join it and read it,
as before. A daemon listening beyond loopback refuses open jobs unless started with
``--allow-open-jobs`` (a trusted network); ``--require-secret`` refuses them on
loopback too.

The verifier of a job name lives as long as some connection bound to that name is
open; then the name is free again (the next run may bring another secret) — unless
the operator pre-registered the name's key (``netreduce-switch --job-secrets``): then only that
key's holders can ever take it, so nobody can squat a name before its ranks come.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import secrets
import threading
import time
from typing import Any, Callable, Dict, Optional, Set

from netreduce.errors import ConfigError, NetReduceError

DOMAIN = b"netreduce-job-proof-v1\0"
KEY_DOMAIN = b"netreduce-job-key-v1\0"
OPERATOR_DOMAIN = b"netreduce-operator-proof-v1\0"
NONCE_BYTES = 32
log = logging.getLogger("netreduce.switch")


class AuthError(NetReduceError):
    """A refused proof; the control server answers ok=false with this message."""


# --- rank side --------------------------------------------------------------------
def job_secret() -> str:
    """The job's secret: NETREDUCE_JOB_SECRET, else the contents of
    NETREDUCE_JOB_SECRET_FILE (surrounding whitespace stripped), else "" (an open
    job). Both set to different secrets is refused: the ranks could not agree."""
    from netreduce import config
    from netreduce.errors import AdmissionError
    value, path = config.get("NETREDUCE_JOB_SECRET"), config.get("NETREDUCE_JOB_SECRET_FILE")
    if not path:
        return value
    try:
        from_file = read_secret_file(path).decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise AdmissionError(f"NETREDUCE_JOB_SECRET_FILE={path}: cannot read the job's secret: "
                             f"{exc}") from None
    if not from_file:
        raise AdmissionError(f"NETREDUCE_JOB_SECRET_FILE={path} is empty; write the job's secret "
                             "into it (e.g. `head -c 32 /dev/urandom | xxd -p -c 64 > FILE`)")
    if value and value != from_file:
        raise AdmissionError("NETREDUCE_JOB_SECRET and NETREDUCE_JOB_SECRET_FILE hold different "
                             "secrets; set one of them")
    return from_file


def job_secret_or_new() -> str:
    """The job's secret (job_secret()), else a fresh random one: what a launcher, or a
    rank 0 that starts its job's aggregator, gives the job's ranks."""
    return job_secret() or secrets.token_hex(32)


def public_key(secret: str, job: str) -> str:
    """The job's public key (hex) that ``secret`` gives: what an operator may
    pre-register for the job's name instead of the secret (netreduce-switch
    --job-secrets; `netreduce job-key`), so the daemon holds no secret at all."""
    return _public_hex(_signing_key(secret, job))


@functools.lru_cache(maxsize=64)
def _signing_key(secret: str, job: str) -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    seed = hmac.new(secret.encode(), KEY_DOMAIN + job.encode(), hashlib.sha256).digest()
    return Ed25519PrivateKey.from_private_bytes(seed)


def _public_hex(key: Any) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def _message(nonce: bytes, job: str, rank: int) -> bytes:
    return DOMAIN + nonce + job.encode() + b"\0" + str(int(rank)).encode()


def job_proof(secret: str, job: str, rank: int, nonce_hex: str) -> Any:
    """The ``auth`` field (messages.Auth) of a request binding a connection to
    ``job`` as ``rank``."""
    from netreduce.protocol.messages import Auth
    key = _signing_key(secret, job)
    sig = key.sign(_message(bytes.fromhex(nonce_hex), job, rank))
    return Auth(pub=_public_hex(key), sig=sig.hex())


def operator_proof(secret: bytes, nonce_hex: str) -> str:
    return hmac.new(secret, OPERATOR_DOMAIN + bytes.fromhex(nonce_hex), hashlib.sha256).hexdigest()


def prove_on(conn: Any, secret: str, job: str, rank: int) -> Any:
    """The ``auth`` of a request binding ``conn`` (a protocol/client.py connection)
    to ``job`` as ``rank``: a challenge on it first; None without a secret."""
    if not secret:
        return None
    from netreduce.protocol.messages import Challenge
    return job_proof(secret, job, rank, conn.request(Challenge()).nonce)


def prove(call: Callable[..., Dict[str, Any]], secret: str, job: str, rank: int) -> Dict[str, Any]:
    """The same for callers that speak by command name (``call(cmd, **fields)``):
    fields to add to a binding request (empty without a secret)."""
    if not secret:
        return {}
    nonce = call("challenge")["nonce"]
    proof = job_proof(secret, job, rank, nonce)
    return {"auth": {"pub": proof.pub, "sig": proof.sig}}


def read_secret_file(path: str) -> bytes:
    """A secret's file's bytes, surrounding whitespace stripped (the newline an editor or
    `xxd -p` leaves is no part of the secret): the job's, the operator's, a job key's."""
    with open(path, "rb") as f:
        return f.read().strip()


def read_operator_secret(path: str) -> bytes:
    """The operator's secret: the file's bytes, surrounding whitespace stripped."""
    data = read_secret_file(path)
    if len(data) < 16:
        raise ConfigError(f"operator secret file {path} holds {len(data)} bytes; use at least 16 "
                         "(e.g. `head -c 32 /dev/urandom | xxd -p > FILE`)")
    return data


class _RefusalLog:
    """Logs refused admissions (job, rank, peer, why) at WARNING, at most ``burst``
    lines per ``period`` s: a stranger retrying in a loop cannot flood the log; what
    was left out is counted in the next line."""

    def __init__(self, burst: int = 20, period: float = 10.0) -> None:
        self.burst, self.period = burst, period
        self._lock = threading.Lock()
        self._start, self._count, self._skipped = 0.0, 0, 0

    def __call__(self, message: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._start >= self.period:
                self._start, self._count = now, 0
            self._count += 1
            if self._count > self.burst:
                self._skipped += 1
                return
            skipped, self._skipped = self._skipped, 0
        more = f" ({skipped} more refusals not logged)" if skipped else ""
        log.warning("refused %s%s", message, more)


class Guard:
    """The control server's admission checks: nonces per connection, one verifier
    per job name (a pre-registered one for the names in ``job_keys``), the
    operator's connections. Every refusal is logged with the job, rank and peer."""

    def __init__(self, require_secret: bool = False,
                 operator_secret: Optional[bytes] = None,
                 job_keys: Optional[Dict[str, str]] = None,
                 beyond_loopback: bool = False) -> None:
        self.require_secret = require_secret
        # Why secrets are required, for the refusal: the default of a daemon others can
        # reach (whose operator may opt out), or --require-secret.
        self.beyond_loopback = beyond_loopback
        self.operator_secret = operator_secret
        # job -> pre-registered public key (netreduce/switch/job_keys.py); replaced
        # whole on SIGHUP, so a reader sees the old map or the new one, never a mix.
        self.job_keys: Dict[str, str] = dict(job_keys or {})
        self._lock = threading.Lock()
        self._verifiers: Dict[str, Optional[str]] = {}  # job -> public key hex; None = open
        self._bound: Dict[str, Set[int]] = {}           # job -> ids of bound sessions
        self._log_refusal = _RefusalLog()

    def set_job_keys(self, job_keys: Dict[str, str]) -> None:
        """The operator's new pre-registrations (SIGHUP): they hold for every later
        admission; connections already bound keep their job."""
        self.job_keys = dict(job_keys)

    # per connection
    def challenge(self, sess: Any) -> Any:
        from netreduce.protocol.messages import ChallengeReply
        nonce = secrets.token_bytes(NONCE_BYTES)
        sess.state["nonce"] = nonce
        return ChallengeReply(nonce=nonce.hex())

    def _take_nonce(self, sess: Any, what: str) -> bytes:
        nonce = sess.state.pop("nonce", None)
        if nonce is None:
            raise AuthError(f"{what}: send 'challenge' first on this connection (each nonce "
                            "proves one request)")
        return nonce

    def admit(self, sess: Any, job: str, rank: int, auth: Any) -> None:
        """Bind ``sess`` to ``job`` if its request's ``auth`` (messages.Auth: pub,
        sig) proves the job's secret (or the job is open and secrets are not
        required); raise AuthError naming the problem (and log it, with the peer's
        address)."""
        who = f"job '{job}' (rank {rank}, from {getattr(sess, 'peer', '?')})"
        try:
            self._admit(sess, job, auth, who, rank)
        except AuthError as exc:
            self._log_refusal(str(exc))
            raise

    def _admit(self, sess: Any, job: str, auth: Any, who: str, rank: int) -> None:
        bound = sess.state.get("auth_job")
        if bound is not None:
            if bound != job:
                raise AuthError(f"{who}: this connection already belongs to job '{bound}'")
            return
        pub = self._verify(sess, job, rank, auth, who)
        reserved = self.job_keys.get(job)
        if reserved is not None and pub != reserved:
            raise AuthError(
                f"{who}: the operator pre-registered this job name (--job-secrets), and this "
                + ("rank sent no job secret; export the job's NETREDUCE_JOB_SECRET (or "
                   "NETREDUCE_JOB_SECRET_FILE) on every rank" if pub is None else
                   "rank's job secret gives another key (a wrong secret, or another job "
                   "using this name)"))
        with self._lock:
            if job in self._bound:
                known = self._verifiers[job]
                if known != pub:
                    raise AuthError(self._mismatch(who, known, pub))
            else:
                self._verifiers[job] = pub
                self._bound[job] = set()
            self._bound[job].add(id(sess))
        sess.state["auth_job"] = job

    def _verify(self, sess: Any, job: str, rank: int, auth: Any, who: str) -> Optional[str]:
        if auth is None:
            if self.require_secret:
                why = ("it listens beyond loopback" if self.beyond_loopback
                       else "--require-secret")
                opt_out = (", or start netreduce-switch with --allow-open-jobs on a network "
                           "whose every host you trust" if self.beyond_loopback else "")
                raise AuthError(
                    f"{who}: this aggregator requires a job secret ({why}) and this rank "
                    "sent none; export the same NETREDUCE_JOB_SECRET (or "
                    "NETREDUCE_JOB_SECRET_FILE) on every rank (mpirun -x NETREDUCE_JOB_SECRET, "
                    "srun --export=ALL,NETREDUCE_JOB_SECRET; netreduce-run sets one)" + opt_out)
            return None
        if isinstance(auth, dict):  # a plain JSON proof (the elastic driver's own lines)
            from netreduce.protocol.messages import Auth
            auth = Auth(pub=auth.get("pub"), sig=auth.get("sig"))  # type: ignore[arg-type]
        if not isinstance(getattr(auth, "pub", None), str) or \
                not isinstance(getattr(auth, "sig", None), str):
            raise AuthError(f"{who}: malformed job-secret proof (want auth={{pub, sig}})")
        nonce = self._take_nonce(sess, who)
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
        try:
            key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(auth.pub))
            key.verify(bytes.fromhex(auth.sig), _message(nonce, job, rank))
        except (ValueError, InvalidSignature):
            raise AuthError(f"{who}: the job-secret proof does not verify (a forged or "
                            "replayed answer to another challenge)") from None
        return auth.pub.lower()

    @staticmethod
    def _mismatch(who: str, known: Optional[str], pub: Optional[str]) -> str:
        if known is None:
            return (f"{who}: this rank sent a job secret, but the job was admitted without one "
                    "(its other ranks have no NETREDUCE_JOB_SECRET); give every rank the same "
                    "secret, or none")
        if pub is None:
            return (f"{who}: the job was admitted with a job secret and this rank sent none; "
                    "export the same NETREDUCE_JOB_SECRET as its other ranks (netreduce-run "
                    "sets it for its ranks)")
        return (f"{who}: wrong job secret: the job was admitted with a different one "
                "(NETREDUCE_JOB_SECRET differs between ranks, or another job uses this name)")

    def unbind(self, sess: Any) -> None:
        job = sess.state.pop("auth_job", None)
        if job is None:
            return
        with self._lock:
            ids = self._bound.get(job)
            if ids is not None:
                ids.discard(id(sess))
                if not ids:
                    del self._bound[job]
                    del self._verifiers[job]

    def operator(self, sess: Any, proof: Optional[str]) -> bool:
        """Whether this request's ``operator`` field proves the operator's secret
        (HMAC over the nonce)."""
        if sess.state.get("operator"):
            return True
        if proof is None:
            return False
        if self.operator_secret is None:
            raise AuthError("operator proof sent, but this aggregator has no operator secret "
                            "(--operator-secret-file)")
        nonce = self._take_nonce(sess, "operator")
        want = operator_proof(self.operator_secret, nonce.hex())
        if not isinstance(proof, str) or not hmac.compare_digest(proof, want):
            self._log_refusal(f"operator connection from {getattr(sess, 'peer', '?')}: "
                              "wrong operator secret")
            raise AuthError("wrong operator secret")
        sess.state["operator"] = True
        return True

    def is_open(self, job: str) -> bool:
        """No verifier: the job was admitted without a secret (or is not known)."""
        with self._lock:
            return self._verifiers.get(job) is None

    def may_read(self, sess: Any, job: str) -> bool:
        return bool(sess.state.get("operator")) or sess.state.get("auth_job") == job or \
            self.is_open(job)

    def verifier(self, job: str) -> Optional[str]:
        """The public key of ``job``'s secret while a connection is bound to it; None
        for a job admitted without one (or not known)."""
        with self._lock:
            return self._verifiers.get(job)

    def may_read_finished(self, sess: Any, job: str, pub: Optional[str]) -> bool:
        """Whether ``sess`` may read the kept counters of finished ``job``, whose secret's
        key was ``pub`` (None: an open job): the operator, anyone for an open job, or a
        connection bound to that name with the same secret."""
        if sess.state.get("operator") or pub is None:
            return True
        return sess.state.get("auth_job") == job and self.verifier(job) == pub
