"""Pre-registered job names: ``netreduce-switch --job-secrets FILE`` (docs/operations.md,
Security).

Without it, the first connection that proves some key for a job name holds the name
while the job lives, so on a shared aggregator anyone who learns a name could take it
before its ranks come. The file binds names to keys for good: a listed name is
admitted only to ranks that prove that name's key (protocol/auth.py's challenge; the
secret never crosses the network). One entry per line, ``#`` comments and blank lines
ignored:

    JOB ed25519:HEX    the job's public key, as `netreduce job-key JOB` prints it:
                       the daemon then holds no secret at all (preferred)
    JOB @PATH          the job's secret, read from PATH (relative to the file's folder)
    JOB SECRET         the job's secret itself

A secret is turned into the job's public key at once and not kept. The daemon
re-reads the file on SIGHUP; a file that no longer parses leaves the previous
registrations in force (and says why in the log), so a typo cannot open every name.
"""
from __future__ import annotations

import os
from typing import Dict

from netreduce.errors import ConfigError
from netreduce.protocol import auth

KEY_PREFIX = "ed25519:"


def _key_of(job: str, value: str, where: str, folder: str) -> str:
    if value.startswith(KEY_PREFIX):
        key = value[len(KEY_PREFIX):].lower()
        try:
            ok = len(bytes.fromhex(key)) == 32
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"{where}: job '{job}': '{value}' is not an ed25519 public key "
                             "(64 hex digits after 'ed25519:', as `netreduce job-key` prints)")
        return key
    if value.startswith("@"):
        path = os.path.join(folder, value[1:])
        try:
            value = auth.read_secret_file(path).decode()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: job '{job}': cannot read its secret from {path}: "
                             f"{exc}") from None
        if not value:
            raise ConfigError(f"{where}: job '{job}': its secret file {path} is empty")
    return auth.public_key(value, job)


def read(path: str) -> Dict[str, str]:
    """``{job: public key hex}`` from a --job-secrets file. Raises ConfigError (a
    ValueError) naming the file and line of a malformed entry, or OSError for the
    file itself."""
    keys: Dict[str, str] = {}
    folder = os.path.dirname(os.path.abspath(path))
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            where = f"{path}:{n}"
            if len(words) != 2:
                raise ConfigError(f"{where}: expected 'JOB ed25519:KEY', 'JOB @SECRET_FILE' or "
                                 f"'JOB SECRET', got {len(words)} words")
            job, key = words[0], _key_of(words[0], words[1], where, folder)
            if keys.get(job, key) != key:
                raise ConfigError(f"{where}: job '{job}' is listed twice with different keys")
            keys[job] = key
    return keys


def reload(guard: auth.Guard, path: str, log) -> None:
    """SIGHUP: the file's registrations replace the guard's, or, if it does not read,
    the old ones stay and the log says why."""
    try:
        keys = read(path)
    except (OSError, ValueError) as exc:
        log.error("--job-secrets %s not re-read, the previous %d registrations stay: %s",
                  path, len(guard.job_keys), exc)
        return
    guard.set_job_keys(keys)
    log.info("--job-secrets %s re-read: %d job names pre-registered", path, len(keys))
