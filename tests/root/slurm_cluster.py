"""A real Slurm for tests: a testbed, netreduce-switch in its aggregator namespace
(port 4791, --require-secret), slurmctld on the bridge and a slurmd in each host
namespace (netreduce/testbed/slurm.py). Not a test module: test modules import from
it, each with a fixture of its own scope and tag (the /24 is picked per run):

    from tests.root.slurm_cluster import REASON, slurm_on_testbed

    pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

    @pytest.fixture(scope="module")
    def cluster():
        with slurm_on_testbed("e") as c:
            yield c

    def test_x(cluster, tmp_path):
        subprocess.run(["srun", "-N", "2", "--ntasks-per-node=2", sys.executable, "rank.py"],
                       env=cluster.env, cwd=tmp_path, ...)

``cluster.env`` is a client environment: this process's, with the checkout on
PYTHONPATH, SLURM_CONF naming the cluster, NETREDUCE_SWITCH left out and no job
secret (a job brings its own). ``cluster.switch`` is the aggregator's "address:port",
``cluster.tb`` the Testbed, ``cluster.slurm`` the SlurmCluster (sbatch, wait_job).
Startup is about 1.5 s."""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Dict, Iterator, Sequence

from netreduce.testbed import Testbed, why_unusable
from netreduce.testbed import slurm as slurm_mod
from netreduce.testbed.slurm import SlurmCluster
from netreduce.testbed.testbed import SwitchHandle
from tests.root import scratch_subnet, scratch_testbed_name

REASON = why_unusable() or slurm_mod.why_unusable()
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass
class SlurmOnTestbed:
    tb: Testbed
    slurm: SlurmCluster
    aggregator: SwitchHandle
    switch: str              # "10.78.x.250:4791"
    env: Dict[str, str]      # for srun/sbatch/scontrol


@contextlib.contextmanager
def slurm_on_testbed(tag: str, hosts: int = 2, cpus: int = 8,
                     switch_args: Sequence[str] = ()) -> Iterator[SlurmOnTestbed]:
    base = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    for name in ("NETREDUCE_SWITCH", "NETREDUCE_JOB_SECRET", "NETREDUCE_JOB"):
        base.pop(name, None)
    with Testbed(hosts=hosts, rate="1gbit", name=scratch_testbed_name(tag),
                 subnet=scratch_subnet(),
                 replace=True) as tb:
        aggregator = tb.spawn_switch(port=4791, args=["--require-secret", *switch_args], env=base)
        try:
            with SlurmCluster(tb, cpus=cpus) as slurm:
                yield SlurmOnTestbed(tb, slurm, aggregator,
                                     f"{aggregator.address[0]}:{aggregator.address[1]}",
                                     slurm.client_env(base))
        finally:
            aggregator.stop()
