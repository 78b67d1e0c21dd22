"""Rank discovery from every launcher family netreduce supports."""
import pytest

from netreduce import environment

NR_VARS = ("NETREDUCE_RANK", "NETREDUCE_SIZE", "NETREDUCE_LOCAL_RANK", "NETREDUCE_LOCAL_SIZE",
           "NETREDUCE_JOB")


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for var in NR_VARS:
        monkeypatch.delenv(var, raising=False)


def test_no_launcher_is_a_single_process():
    t = environment.discover({})
    assert (t.rank, t.size, t.local_rank, t.local_size, t.launcher) == (0, 1, 0, 1, "single")
    assert t.job == "default"


def test_netreduce_run_variables(monkeypatch):
    for k, v in dict(NETREDUCE_RANK="2", NETREDUCE_SIZE="4", NETREDUCE_LOCAL_RANK="0",
                     NETREDUCE_LOCAL_SIZE="2", NETREDUCE_JOB="j7").items():
        monkeypatch.setenv(k, v)
    t = environment.discover({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "9"})
    assert (t.rank, t.size, t.local_rank, t.local_size, t.job, t.launcher) == \
        (2, 4, 0, 2, "j7", "netreduce-run")


def test_open_mpi():
    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
           "PMIX_NAMESPACE": "prterun-host-1234@1", "RANK": "0", "WORLD_SIZE": "8"}
    t = environment.discover(env)
    assert (t.rank, t.size, t.local_rank, t.local_size, t.launcher) == (3, 4, 1, 2, "openmpi")
    assert t.job == "mpi-prterun-host-1234@1"


def test_horovodrun():
    t = environment.discover({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2",
                              "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2"})
    assert (t.rank, t.size, t.local_rank, t.local_size, t.launcher) == (1, 2, 1, 2, "horovod")


def test_torchrun():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "TORCHELASTIC_RUN_ID": "abc", "MASTER_ADDR": "h0", "MASTER_PORT": "29500"}
    t = environment.discover(env)
    assert (t.rank, t.size, t.local_rank, t.local_size, t.launcher) == (5, 8, 1, 4, "torchrun")
    assert t.job == "torchrun-abc-h0:29500"


def test_mpich_pmi():
    t = environment.discover({"PMI_RANK": "1", "PMI_SIZE": "3", "MPI_LOCALRANKID": "1",
                              "MPI_LOCALNRANKS": "3", "PMI_KVSNAME": "kvs_77"})
    assert (t.rank, t.size, t.local_rank, t.local_size, t.launcher) == (1, 3, 1, 3, "pmi")
    assert t.job == "pmi-kvs_77"


def test_slurm_srun_step():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "7", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
           "SLURM_STEP_TASKS_PER_NODE": "2(x2),3", "SLURM_JOB_ID": "99", "SLURM_STEP_ID": "0"}
    t = environment.discover(env)
    assert (t.rank, t.size, t.local_rank, t.local_size, t.launcher) == (5, 7, 1, 3, "slurm")
    assert t.job == "slurm-99.0"


def test_slurm_batch_script_is_not_a_rank():
    # sbatch's shell has SLURM_PROCID=0 and SLURM_NTASKS=N but no step: not rank 0 of N
    t = environment.discover({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "9"})
    assert t.launcher == "single" and t.size == 1


def test_local_defaults_without_locality():
    t = environment.discover({"RANK": "1", "WORLD_SIZE": "2"})
    assert (t.local_rank, t.local_size) == (0, 1)


@pytest.mark.parametrize("env,match", [
    ({"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "4"}, "rank 4 outside"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
])
def test_bad_values_are_named(env, match):
    with pytest.raises(ValueError, match=match):
        environment.discover(env)


@pytest.mark.parametrize("env, job", [
    ({"TORCHELASTIC_RUN_ID": "abc"}, "torchrun-abc"),
    ({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "h0", "MASTER_PORT": "29500"},
     "torchrun-h0:29500"),
    ({"MASTER_ADDR": "h0"}, "torchrun-h0"),
    ({"TORCHELASTIC_RUN_ID": "none"}, ""),
    ({}, ""),
])
def test_torchrun_job_name_from_what_identifies_the_launch(env, job):
    t = environment.discover(dict(env, RANK="1", WORLD_SIZE="2"))
    assert t.job == job
    assert "none" not in t.job and not t.job.endswith(":")
    assert (environment.job_problem(t) == "") == bool(job)


def test_ranks_that_cannot_agree_on_a_name_are_told_to_set_netreduce_job():
    t = environment.discover({"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"})
    with pytest.raises(environment.NetReduceError) as info:
        environment.require_job(t)
    msg = str(info.value)
    assert "rank 1 of 2 (from torchrun)" in msg and "NETREDUCE_JOB" in msg
    assert "MASTER_ADDR" in msg and "TORCHELASTIC_RUN_ID" in msg


def test_a_single_torchrun_rank_needs_no_agreement():
    t = environment.discover({"RANK": "0", "WORLD_SIZE": "1"})
    assert environment.require_job(t) == "torchrun"


def test_netreduce_job_overrides_the_derivation(monkeypatch):
    monkeypatch.setenv("NETREDUCE_JOB", "resnet-7")
    t = environment.discover({"RANK": "1", "WORLD_SIZE": "2"})
    assert environment.require_job(t) == "resnet-7"


def test_init_refuses_before_connecting(monkeypatch):
    from netreduce import api
    for var in ("NETREDUCE_SWITCH", "NETREDUCE_RANK", "NETREDUCE_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(environment.config, "launcher_environment",
                        lambda: {"RANK": "1", "WORLD_SIZE": "2"})
    monkeypatch.setattr(api, "_connect", lambda *a, **k: pytest.fail("connected"))
    with pytest.raises(environment.NetReduceError, match="export NETREDUCE_JOB"):
        api.init()
