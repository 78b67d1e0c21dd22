"""sshd in the testbed's host namespaces, so that launchers that ssh to hosts
(netreduce-run -H, horovodrun, mpirun) run across them from the root namespace.

    with Testbed(hosts=2) as tb, SshHosts(tb) as ssh:
        subprocess.run(ssh.client_argv(["netreduce-run", "-np", "4", "-H", "h0:2,h1:2",
                                        "-i", ssh.identity, "python", "train.py"]),
                       env=ssh.client_env(launcher_env))

Everything is throwaway and made here: a host key and a user key (ed25519, no
passphrase) in a private folder, an sshd per host namespace listening on the host's
testbed address (root logs in with that key only; no PAM, no password), and a client
side that touches nothing of the machine's own ssh setup:

* ssh_config (known_hosts pre-filled with the host key, quiet logging) reached through
  an `ssh` wrapper that passes `-F ssh_config`, first on the PATH of client_env();
* the testbed's names (h0, nrtb-h0, ...) do not resolve in the root namespace, so
  client_argv() runs the client in a private mount namespace whose /etc/hosts adds
  them, as a cluster's DNS would.

sshd is started with `ip netns exec`, so each session sees its namespace's /etc/hosts
and /sys, as a process started with Testbed.popen() does. Needs root and Debian's
openssh-server (/usr/sbin/sshd); why_unusable() says what is missing."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from netreduce.testbed.plan import TestbedError
from netreduce.testbed.testbed import Testbed

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = "/run/sshd"  # sshd refuses to start without its privilege separation folder


def why_unusable() -> Optional[str]:
    """Why sshd hosts cannot be started here, or None."""
    if os.geteuid() != 0:
        return "needs root (sshd in network namespaces)"
    for tool, package in ((SSHD, "openssh-server"), ("ssh", "openssh-client"),
                          ("ssh-keygen", "openssh-client"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"{tool} not found (Debian: apt-get install {package})"
    return None


class SshHosts:
    """An sshd in each of ``testbed``'s host namespaces (all of them unless ``hosts``
    names some), port ``port``."""

    def __init__(self, testbed: Testbed, hosts: Optional[Sequence[int]] = None,
                 port: int = 22) -> None:
        self.testbed = testbed
        self.hosts = list(range(len(testbed.hosts)) if hosts is None else hosts)
        self.port = port
        self.dir = ""
        self.procs: Dict[int, subprocess.Popen] = {}

    # -- paths -----------------------------------------------------------------------
    @property
    def identity(self) -> str:
        """The user's private key (netreduce-run -i, horovodrun -i)."""
        return os.path.join(self.dir, "id_ed25519")

    @property
    def config(self) -> str:
        return os.path.join(self.dir, "ssh_config")

    @property
    def bin_dir(self) -> str:
        """Holds the `ssh` wrapper (ssh -F ssh_config)."""
        return os.path.join(self.dir, "bin")

    @property
    def etc_hosts(self) -> str:
        return os.path.join(self.dir, "hosts")

    # -- life cycle ------------------------------------------------------------------
    def start(self, timeout_s: float = 10.0) -> "SshHosts":
        why = why_unusable()
        if why:
            raise TestbedError(f"cannot start sshd hosts: {why}")
        self.dir = tempfile.mkdtemp(prefix=f"{self.testbed.name}-ssh.")
        os.chmod(self.dir, 0o700)
        os.makedirs(PRIVSEP_DIR, mode=0o755, exist_ok=True)
        try:
            self._keys()
            self._client_files()
            for i in self.hosts:
                self.procs[i] = self._sshd(i)
            self._wait_listening(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""

    def __enter__(self) -> "SshHosts":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _keys(self) -> None:
        for path in (os.path.join(self.dir, "host_ed25519"), self.identity):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "netreduce-testbed",
                            "-f", path], check=True, capture_output=True)
        shutil.copy(self.identity + ".pub", os.path.join(self.dir, "authorized_keys"))

    def _client_files(self) -> None:
        with open(os.path.join(self.dir, "host_ed25519.pub")) as f:
            host_key = " ".join(f.read().split()[:2])
        nodes = [self.testbed.hosts[i] for i in self.hosts]
        with open(os.path.join(self.dir, "known_hosts"), "w") as f:
            for n in nodes:
                names = [n.name, n.netns, n.address] + \
                    ([f"[{n.name}]:{self.port}", f"[{n.address}]:{self.port}"] if self.port != 22 else [])
                f.write(f"{','.join(names)} {host_key}\n")
        with open(self.config, "w") as f:
            f.write(f"Host *\n"
                    f"  User root\n"
                    f"  Port {self.port}\n"
                    f"  IdentityFile {self.identity}\n"
                    f"  UserKnownHostsFile {os.path.join(self.dir, 'known_hosts')}\n"
                    f"  GlobalKnownHostsFile /dev/null\n"
                    f"  LogLevel ERROR\n")
        os.makedirs(self.bin_dir)
        wrapper = os.path.join(self.bin_dir, "ssh")
        with open(wrapper, "w") as f:
            f.write(f"#!/bin/sh\nexec {shutil.which('ssh')} -F {self.config} \"$@\"\n")
        os.chmod(wrapper, 0o755)
        with open("/etc/hosts") as f:
            base = f.read()
        with open(self.etc_hosts, "w") as f:
            f.write(base.rstrip("\n") + "\n# netreduce testbed " + self.testbed.name + "\n")
            for n in self.testbed.plan.nodes:
                f.write(f"{n.address}\t{n.name} {n.netns}\n")

    def _sshd(self, i: int) -> subprocess.Popen:
        node = self.testbed.hosts[i]
        conf = os.path.join(self.dir, f"sshd_{node.name}.conf")
        with open(conf, "w") as f:
            f.write(f"Port {self.port}\n"
                    f"ListenAddress {node.address}\n"
                    f"HostKey {os.path.join(self.dir, 'host_ed25519')}\n"
                    f"PidFile {os.path.join(self.dir, f'sshd_{node.name}.pid')}\n"
                    f"AuthorizedKeysFile {os.path.join(self.dir, 'authorized_keys')}\n"
                    "PermitRootLogin prohibit-password\n"
                    "PasswordAuthentication no\n"
                    "KbdInteractiveAuthentication no\n"
                    "UsePAM no\n"
                    "StrictModes no\n"
                    "UseDNS no\n"
                    "PrintMotd no\n"
                    "MaxStartups 200\n"
                    "MaxSessions 200\n"
                    "LogLevel ERROR\n")
        # -e: its log (errors only) to a file here, read when it fails to start.
        log = open(os.path.join(self.dir, f"sshd_{node.name}.log"), "wb")
        try:
            return self.testbed.popen(i, [SSHD, "-D", "-e", "-f", conf],
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        finally:
            log.close()

    def _wait_listening(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for i in self.hosts:
            node = self.testbed.hosts[i]
            while True:
                proc = self.procs[i]
                if proc.poll() is not None:
                    with open(os.path.join(self.dir, f"sshd_{node.name}.log"), errors="replace") as f:
                        said = f.read().strip()[-1000:]
                    raise TestbedError(f"sshd in {node.netns} exited with code "
                                       f"{proc.returncode}: {said}")
                try:
                    with socket.create_connection((node.address, self.port), timeout=0.5):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise TestbedError(f"sshd in {node.netns} not listening on "
                                           f"{node.address}:{self.port} after {timeout_s} s") from None
                    time.sleep(0.02)

    # -- use -------------------------------------------------------------------------
    def client_env(self, base: Dict[str, str]) -> Dict[str, str]:
        """``base`` (a launcher's environment) with the ssh wrapper first on PATH."""
        env = dict(base)
        env["PATH"] = self.bin_dir + os.pathsep + env.get("PATH", "")
        return env

    def client_argv(self, argv: Sequence[str]) -> List[str]:
        """``argv`` run in the root network namespace, in a private mount namespace
        where /etc/hosts also names the testbed's nodes."""
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount --bind "$0" /etc/hosts && exec "$@"', self.etc_hosts, *argv]
