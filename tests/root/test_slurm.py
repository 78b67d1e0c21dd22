"""netreduce under a real Slurm (Debian's slurm-wlm 22.05 and munge), started here:
slurmctld on the testbed's bridge, a slurmd in each of 2 host namespaces, the
aggregator in the aggregator namespace. The README's srun line and its sbatch script
run as written — the aggregator's address for `aggr`, a small rank program for
`train.py` — across both Slurm nodes; every rank takes rank, size and local rank from
Slurm's variables, runs in its node's namespace and all-reduces exactly. Skipped, with
the reason, when not root or Slurm/munge are missing (scripts/install.sh test)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.root.slurm_cluster import REASON, REPO, slurm_on_testbed

pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

RANK = r"""
import json, os
import numpy as np
import netreduce as nr
from netreduce import environment
topo = environment.discover()
nr.init()
r, n = nr.rank(), nr.size()
x = nr.allreduce(np.arange(50_000, dtype=np.int32) * (r + 1), op=nr.Sum)
print(json.dumps({"rank": r, "size": n, "local_rank": nr.local_rank(),
                  "local_size": nr.local_size(), "launcher": topo.launcher, "job": topo.job,
                  "exact": bool((x == np.arange(50_000) * (n * (n + 1) // 2)).all()),
                  "node": os.environ["SLURMD_NODENAME"], "procid": os.environ["SLURM_PROCID"],
                  "netns": os.stat("/proc/self/ns/net").st_ino}), flush=True)
nr.shutdown()
"""


def _readme_blocks():
    with open(os.path.join(REPO, "README.md")) as f:
        return re.findall(r"```bash\n(.*?)```", f.read(), re.S)


def _as_here(text: str, cluster, rank_py: str) -> str:
    """The README's text with this testbed's aggregator for `aggr` and the rank
    program for `python train.py`."""
    assert "aggr:4791" in text and "python train.py" in text, text
    return text.replace("aggr:4791", cluster.switch).replace(
        "python train.py", f"{sys.executable} {rank_py}")


@pytest.fixture(scope="module")
def cluster():
    with slurm_on_testbed("q") as c:
        yield c


@pytest.fixture
def rank_py(tmp_path):
    path = tmp_path / "rank.py"
    path.write_text(RANK)
    return str(path)


def _check(reports, cluster, per_node):
    netns = {cluster.tb.hosts[i].name: int(cluster.tb.run(
        i, ["stat", "-L", "-c", "%i", "/proc/self/ns/net"], capture_output=True, text=True,
        check=True).stdout) for i in range(2)}
    n = 2 * per_node
    assert sorted(r["rank"] for r in reports) == list(range(n)), reports
    assert len({r["job"] for r in reports}) == 1 and reports[0]["job"].startswith("slurm-")
    for r in reports:
        node = r["rank"] // per_node  # srun's block distribution: node 0 first
        assert r["exact"], r
        assert (r["size"], r["local_rank"], r["local_size"]) == (n, r["rank"] % per_node, per_node), r
        assert r["launcher"] == "slurm" and r["procid"] == str(r["rank"]), r
        assert r["node"] == f"h{node}" and r["netns"] == netns[f"h{node}"], (r, netns)


@pytest.mark.timeout(120)
def test_readme_srun_line_across_two_nodes(cluster, rank_py, tmp_path):
    block = next(b for b in _readme_blocks() if "\nsrun -N 2 " in b)
    lines = [ln for ln in block.splitlines()
             if ln.startswith(("export NETREDUCE_JOB_SECRET=", "srun -N 2 "))]
    assert len(lines) == 2, block
    per_node = int(re.search(r"--ntasks-per-node=(\d+)", lines[1]).group(1))
    proc = subprocess.run(["bash", "-ec", _as_here("\n".join(lines), cluster, rank_py)],
                          env=cluster.env, cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reports = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    _check(reports, cluster, per_node)


@pytest.mark.timeout(120)
def test_readme_sbatch_script_across_two_nodes(cluster, rank_py, tmp_path):
    script = next(b for b in _readme_blocks() if b.startswith("#!/bin/bash\n#SBATCH"))
    per_node = int(re.search(r"--ntasks-per-node=(\d+)", script).group(1))
    job = cluster.slurm.sbatch(_as_here(script, cluster, rank_py), cluster.env, cwd=str(tmp_path))
    state = cluster.slurm.wait_job(job, cluster.env, timeout_s=100)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert state == "COMPLETED", out
    _check([json.loads(ln) for ln in out.splitlines() if ln.startswith("{")], cluster, per_node)
