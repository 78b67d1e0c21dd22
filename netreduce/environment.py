"""Rank, size, local rank/size and job name, from the launcher already in use.

The ranks come from whatever started the processes (docs/design.md, launcher and
rank discovery): netreduce-run (on this host, or across hosts over ssh) or a launcher
the user already has. Each leaves its own variables; the first family that is
present wins, in this order:

    netreduce-run   NETREDUCE_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE (via config);
                    it sets horovodrun's HOROVOD_* and torchrun's variables to the
                    same values, so code that reads those agrees
    Open MPI        OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE
    horovodrun      HOROVOD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE
    torchrun        RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE
    MPICH/PMI       PMI_RANK / PMI_SIZE (+ MPI_LOCALRANKID / MPI_LOCALNRANKS)
    Slurm srun      SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_STEP_TASKS_PER_NODE

Open MPI comes before torchrun because mpirun under a torch script may also carry a
stale RANK; Slurm comes last because mpirun/srun steps inside an allocation carry
both their own variables and SLURM_*, and a batch script (no SLURM_STEP_ID) carries
SLURM_PROCID=0 without being rank 0 of anything.

These foreign variables are the launcher's contract, not netreduce knobs, so this
module reads them directly; every NETREDUCE_* variable still goes through config.
"""
from __future__ import annotations

import dataclasses
import re
from typing import List, Mapping, Optional

from netreduce import config
from netreduce.errors import ConfigError, NetReduceError


@dataclasses.dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int
    local_size: int
    job: str
    launcher: str  # which family the values came from ("single" = none found)
    # False when local_rank/local_size are a guess (the launcher did not say): the
    # topology exchange at init then groups ranks by host identity instead.
    local_known: bool = True


def _int(env: Mapping[str, str], name: str) -> Optional[int]:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


def _slurm_tasks_on_node(spec: str, node_id: int) -> Optional[int]:
    """Tasks on node ``node_id`` from Slurm's compressed list, e.g. '2(x3),1'."""
    counts: List[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node_id] if 0 <= node_id < len(counts) else None


def _family(env: Mapping[str, str], launcher: str, rank: str, size: str,
            local_rank: str, local_size: str) -> Optional[tuple]:
    r, n = _int(env, rank), _int(env, size)
    if r is None or n is None:
        return None
    lr, ln = _int(env, local_rank), _int(env, local_size)
    # Without local information assume one process per host: that is what a launcher
    # that does not say anything about locality most often means.
    return (r, n, 0 if lr is None else lr, 1 if ln is None else ln, launcher,
            lr is not None and ln is not None)


def _job_name(env: Mapping[str, str], launcher: str, size: int = 0) -> str:
    """A name every rank of one launch derives identically, different across launches
    so that two jobs on one aggregator never share negotiation state."""
    explicit = config.get("NETREDUCE_JOB")
    if explicit:
        return explicit
    if launcher == "openmpi":
        for var in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid"):
            if env.get(var):
                return f"mpi-{env[var]}"
        return "mpi"
    if launcher == "slurm" or (launcher == "pmi" and env.get("SLURM_JOB_ID")):
        return f"slurm-{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_STEP_ID', '0')}"
    if launcher == "pmi" and env.get("PMI_KVSNAME"):
        return f"pmi-{env['PMI_KVSNAME']}"
    if launcher == "torchrun":
        # torchrun's rendezvous id ("none" unless --rdzv-id or --standalone gave one)
        # and its master's address: what the ranks of one launch share.
        parts = [env["TORCHELASTIC_RUN_ID"]] if env.get("TORCHELASTIC_RUN_ID", "none") != "none" else []
        master = ":".join(v for v in (env.get("MASTER_ADDR"), env.get("MASTER_PORT")) if v)
        parts += [master] if master else []
        if parts:
            return "torchrun-" + "-".join(parts)
        return "torchrun" if size == 1 else ""  # a single rank has nobody to agree with
    if launcher == "horovod":
        return f"horovod-{env.get('HOROVOD_GLOO_RENDEZVOUS_PORT', '0')}"
    return "default"


def job_problem(topo: Topology) -> str:
    """Why ``topo`` has no job name (empty when it has one): what the ranks lacked
    to agree on one, and what to set."""
    if topo.job:
        return ""
    return (f"rank {topo.rank} of {topo.size} (from {topo.launcher}) cannot name its job: "
            "the torchrun-style variables RANK and WORLD_SIZE are set, but nothing that "
            "identifies this launch (TORCHELASTIC_RUN_ID other than 'none', MASTER_ADDR, "
            "MASTER_PORT), so the ranks cannot agree on a name; export NETREDUCE_JOB=<name> "
            "on every rank, the same for all ranks of this job and different from any "
            "other job on the aggregator")


def require_job(topo: Topology) -> str:
    """The job name of ``topo``, or NetReduceError saying what to set."""
    problem = job_problem(topo)
    if problem:
        raise NetReduceError(problem)
    return topo.job


def discover(env: Optional[Mapping[str, str]] = None) -> Topology:
    """The topology of this process. ``env`` defaults to the launcher variables
    config reads (tests pass a dict); NETREDUCE_* always come from config."""
    env = config.launcher_environment() if env is None else env
    found = None
    r, n = config.get("NETREDUCE_RANK"), config.get("NETREDUCE_SIZE")
    if r >= 0 and n > 0:
        lr, ln = config.get("NETREDUCE_LOCAL_RANK"), config.get("NETREDUCE_LOCAL_SIZE")
        found = (r, n, r if lr < 0 else lr, n if ln < 0 else ln, "netreduce-run",
                 lr >= 0 and ln >= 0)
    found = found or _family(env, "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
    found = found or _family(env, "horovod", "HOROVOD_RANK", "HOROVOD_SIZE",
                             "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")
    found = found or _family(env, "torchrun", "RANK", "WORLD_SIZE",
                             "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    found = found or _family(env, "pmi", "PMI_RANK", "PMI_SIZE",
                             "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    if found is None and (env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")):
        base = _family(env, "slurm", "SLURM_PROCID", "SLURM_NTASKS",
                       "SLURM_LOCALID", "__unset__")
        if base is None:
            base = _family(env, "slurm", "SLURM_PROCID", "SLURM_NPROCS",
                           "SLURM_LOCALID", "__unset__")
        if base is not None:
            spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "")
            local = _slurm_tasks_on_node(spec, _int(env, "SLURM_NODEID") or 0) if spec else None
            known = local is not None and _int(env, "SLURM_LOCALID") is not None
            found = base[:3] + (local or 1,) + base[4:5] + (known,)
    if found is None:
        found = (0, 1, 0, 1, "single", True)
    rank, size, local_rank, local_size, launcher, local_known = found
    if not (0 <= rank < size):
        raise ConfigError(f"{launcher} environment gives rank {rank} outside [0, {size})")
    if not (0 <= local_rank < max(local_size, 1)):
        raise ConfigError(f"{launcher} environment gives local rank {local_rank} "
                         f"outside [0, {local_size})")
    return Topology(rank, size, local_rank, local_size, _job_name(env, launcher, size), launcher,
                    local_known)
