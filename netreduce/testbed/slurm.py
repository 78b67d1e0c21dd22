"""A real Slurm on the testbed: Debian's slurmctld in the root namespace on the
bridge's address, one slurmd per host namespace, munge for their credentials.

    with Testbed(hosts=2) as tb, SlurmCluster(tb) as slurm:
        subprocess.run(["srun", "-N", "2", "--ntasks-per-node=2", "python", "train.py"],
                       env=slurm.client_env(env))
        job = slurm.sbatch("#!/bin/sh\\n#SBATCH -N 2\\nsrun ...", cwd=tmp)
        slurm.wait_job(job)             # -> Slurm's final state, e.g. "COMPLETED"

What works here (/work/shared/research/slurm.md): the daemons started by hand (no
systemd), slurmd entered into its namespace with `nsenter --net` (under `ip netns
exec`, which remounts /sys, slurmd dies on its cgroup plugin), nodes at their testbed
addresses (NodeAddr) and named after the testbed's hosts (h0, h1, ...), every node
declaring ``cpus`` CPUs whatever the machine has (SlurmdParameters=config_overrides),
one partition with OverSubscribe. So a node's tasks run in that host's network
namespace and netreduce sees one host per node.

Everything lives in a scratch folder made here (key, sockets, state, logs; removed on
stop()); the controller's port is picked free, so several clusters coexist. Clients
(srun, sbatch, squeue, scontrol) find it through SLURM_CONF (client_env()). Needs root
and Debian's slurmctld, slurmd, slurm-client and munge; why_unusable() says what is
missing. Startup takes about a second: the nodes are idle a few hundred ms after their
daemons start (wait_idle())."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from netreduce.process import free_tcp_port
from netreduce.testbed.plan import TestbedError
from netreduce.testbed.testbed import Testbed

TOOLS = (("slurmctld", "slurmctld"), ("slurmd", "slurmd"), ("srun", "slurm-client"),
         ("sbatch", "slurm-client"), ("scontrol", "slurm-client"), ("munged", "munge"),
         ("mungekey", "munge"), ("nsenter", "util-linux"))


def _which(tool: str) -> Optional[str]:
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")


def why_unusable() -> Optional[str]:
    """Why a Slurm cluster cannot be started here, or None."""
    if os.geteuid() != 0:
        return "needs root (slurmd in network namespaces)"
    for tool, package in TOOLS:
        if _which(tool) is None:
            return f"{tool} not found (Debian: apt-get install {package})"
    return None


class SlurmCluster:
    """slurmctld + one slurmd per host of ``testbed`` (or those ``hosts`` names),
    each node with ``cpus`` CPUs."""

    def __init__(self, testbed: Testbed, hosts: Optional[Sequence[int]] = None,
                 cpus: int = 8) -> None:
        self.testbed = testbed
        self.hosts = list(range(len(testbed.hosts)) if hosts is None else hosts)
        self.cpus = cpus
        self.dir = ""
        self.munged: Optional[subprocess.Popen] = None
        self.slurmctld: Optional[subprocess.Popen] = None
        self.slurmd: Dict[int, subprocess.Popen] = {}

    @property
    def nodes(self) -> List[str]:
        """Slurm's node names: the testbed's host names (h0, h1, ...)."""
        return [self.testbed.hosts[i].name for i in self.hosts]

    @property
    def conf(self) -> str:
        return os.path.join(self.dir, "slurm.conf")

    def _path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    # -- life cycle ------------------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> "SlurmCluster":
        why = why_unusable()
        if why:
            raise TestbedError(f"cannot start Slurm: {why}")
        self.dir = tempfile.mkdtemp(prefix=f"{self.testbed.name}-slurm.")
        # munged checks every folder on its paths: none writable by others, and the
        # socket's folder open to all (755), apart from the key's (700).
        os.chmod(self.dir, 0o755)
        for sub, mode in (("munge", 0o700), ("sock", 0o755), ("state", 0o700)):
            os.makedirs(self._path(sub), mode=mode)
        try:
            self._start_munge()
            self._write_conf()
            self._start_daemons()
            self.wait_idle(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in [*self.slurmd.values(), self.slurmctld, self.munged]:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in [*self.slurmd.values(), self.slurmctld, self.munged]:
            if proc is None:
                continue
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.slurmd.clear()
        self.slurmctld = self.munged = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start_munge(self) -> None:
        key = self._path("munge", "munge.key")
        subprocess.run([_which("mungekey"), "--create", f"--keyfile={key}"], check=True,
                       capture_output=True)
        self.munge_socket = self._path("sock", "munge.socket")
        self.munged = subprocess.Popen(
            [_which("munged"), "--foreground", "--force", f"--key-file={key}",
             f"--socket={self.munge_socket}", f"--pid-file={self._path('munge', 'munged.pid')}",
             f"--log-file={self._path('munge', 'munged.log')}",
             f"--seed-file={self._path('munge', 'munged.seed')}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while not os.path.exists(self.munge_socket):
            if self.munged.poll() is not None:
                raise TestbedError(f"munged exited with code {self.munged.returncode}: "
                                   f"{self.munged.stderr.read().decode(errors='replace')[-500:]}")
            if time.monotonic() > deadline:
                raise TestbedError(f"munged made no socket {self.munge_socket} within 10 s")
            time.sleep(0.01)

    def _write_conf(self) -> None:
        p = self.testbed.plan
        self.port = free_tcp_port(p.bridge_address)
        lines = [
            f"ClusterName={self.testbed.name}",
            # The controller's name must be this machine's (short) hostname; its
            # address, the bridge's, is what every node dials.
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({p.bridge_address})",
            "MailProg=/bin/true",
            f"SlurmctldPort={self.port}",
            "SlurmdPort=6818",  # one slurmd per network namespace: no clash
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={self._path('state')}",
            f"SlurmdSpoolDir={self._path('spool-%n')}",
            f"SlurmctldPidFile={self._path('slurmctld.pid')}",
            f"SlurmdPidFile={self._path('slurmd-%n.pid')}",
            f"SlurmctldLogFile={self._path('slurmctld.log')}",
            f"SlurmdLogFile={self._path('slurmd-%n.log')}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "MpiDefault=none",
            "KillWait=3",          # SIGTERM -> SIGKILL of a cancelled step's tasks
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "MinJobAge=30",
        ]
        for i in self.hosts:
            node = self.testbed.hosts[i]
            lines.append(f"NodeName={node.name} NodeAddr={node.address} CPUs={self.cpus} "
                         f"State=UNKNOWN")
        lines.append(f"PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
                     f"OverSubscribe=YES")
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def _start_daemons(self) -> None:
        self.slurmctld = subprocess.Popen(
            [_which("slurmctld"), "-D", "-c", "-i", "-f", self.conf],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for i in self.hosts:
            node = self.testbed.hosts[i]
            # nsenter --net, not `ip netns exec`: the latter remounts /sys, and slurmd's
            # cgroup plugin then finds no cgroup filesystem and exits.
            self.slurmd[i] = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{node.netns}", _which("slurmd"), "-D",
                 "-f", self.conf, "-N", node.name],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _log_tail(self, name: str) -> str:
        try:
            with open(self._path(name), errors="replace") as f:
                return f.read()[-800:]
        except OSError:
            return "(no log)"

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Until every node is idle (schedulable), else TestbedError with the logs."""
        deadline = time.monotonic() + timeout_s
        states: Dict[str, str] = {}
        while time.monotonic() < deadline:
            for name, proc in [("slurmctld", self.slurmctld)] + \
                    [(f"slurmd-{self.testbed.hosts[i].name}", p) for i, p in self.slurmd.items()]:
                if proc is not None and proc.poll() is not None:
                    raise TestbedError(f"{name} exited with code {proc.returncode}: "
                                       f"{self._log_tail(name + '.log')}")
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.client_env({}),
                                 capture_output=True, text=True)
            states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
            if states and all(states.get(n) == "idle" for n in self.nodes):
                return
            time.sleep(0.05)
        raise TestbedError(f"Slurm nodes not idle within {timeout_s} s: {states}; "
                           f"slurmctld: {self._log_tail('slurmctld.log')}")

    # -- use -------------------------------------------------------------------------
    def client_env(self, base: Dict[str, str]) -> Dict[str, str]:
        """``base`` with SLURM_CONF naming this cluster's configuration."""
        return dict(base, SLURM_CONF=self.conf)

    def sbatch(self, script: str, env: Dict[str, str], cwd: str) -> str:
        """Submit ``script`` (a batch script's text); returns the job id."""
        path = os.path.join(cwd, f"job-{time.monotonic_ns()}.sh")
        with open(path, "w") as f:
            f.write(script)
        out = subprocess.run(["sbatch", "--parsable", path], env=self.client_env(env), cwd=cwd,
                             capture_output=True, text=True, check=True)
        return out.stdout.strip().split(";")[0]

    def job_state(self, job: str, env: Dict[str, str]) -> str:
        out = subprocess.run(["scontrol", "-o", "show", "job", job], env=self.client_env(env),
                             capture_output=True, text=True)
        for field in out.stdout.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "UNKNOWN"

    def wait_job(self, job: str, env: Dict[str, str], timeout_s: float = 120.0) -> str:
        """Slurm's final state of ``job`` (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.job_state(job, env)
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "UNKNOWN"):
                return state
            time.sleep(0.1)
        raise TestbedError(f"Slurm job {job} not finished within {timeout_s} s "
                           f"(state {self.job_state(job, env)})")
