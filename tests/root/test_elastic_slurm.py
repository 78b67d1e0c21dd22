"""An elastic job inside a real Slurm allocation (issue 32 item 5's elastic case), as
Horovod's docs run one: an sbatch script on 2 nodes runs netreduce-run with a discovery
script that lists the allocation's nodes (scontrol show hostnames), the workers of the
other node started over ssh (sshd in the testbed's host namespaces). A node's tasks
SIGKILLed: its host is blacklisted and the job finishes on the other node, COMPLETED.
Slurm's tasks see the root namespace's /etc/hosts, so the script maps the node names to
the testbed's addresses. Skipped, with the reason, when not root or Slurm, munge or sshd
are missing."""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from netreduce.testbed import sshd
from tests.parallel.test_elastic_run import worker_records
from tests.root.slurm_cluster import REASON, REPO, slurm_on_testbed

REASON = REASON or sshd.why_unusable()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=REASON or "")]
WORKER = os.path.join(REPO, "tests", "parallel", "elastic_worker.py")

SCRIPT = """#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=2 --output={out}/slurm-%j.out
cat > {out}/discover.sh <<'EOF'
#!/bin/sh
scontrol show hostnames "$SLURM_JOB_NODELIST" | while read node; do
    echo "$(grep "^$node " {out}/addresses | cut -d' ' -f2):2"
done
EOF
chmod +x {out}/discover.sh
exec {python} -m netreduce.launcher -np 4 --min-np 2 --host-discovery-script {out}/discover.sh \\
    -i {identity} --switch {switch} {python} {worker}
"""


@pytest.mark.timeout(240)
def test_a_nodes_tasks_killed_in_an_elastic_slurm_job(tmp_path):
    out = str(tmp_path)
    with slurm_on_testbed("l") as cluster, sshd.SshHosts(cluster.tb) as ssh:
        with open(os.path.join(out, "addresses"), "w") as f:
            for node in cluster.tb.hosts:
                f.write(f"{node.name} {node.address}\n")
        env = ssh.client_env(dict(cluster.env, ELASTIC_OUT=out, ELASTIC_STEPS="60",
                                  NETREDUCE_TIMEOUT="20"))
        job = cluster.slurm.sbatch(SCRIPT.format(out=out, python=sys.executable, worker=WORKER,
                                                 identity=ssh.identity, switch=cluster.switch),
                                   env, cwd=out)
        deadline = time.monotonic() + 150
        while max((r.get("step", 0) for rs in worker_records(out).values() for r in rs), default=0) < 10:
            assert time.monotonic() < deadline, cluster.slurm.job_state(job, env)
            time.sleep(0.2)
        pids = subprocess.run(["ip", "netns", "pids", cluster.tb.hosts[1].netns],
                              capture_output=True, text=True).stdout.split()
        victims = [int(p) for p in pids
                   if b"elastic_worker.py" in open(f"/proc/{p}/cmdline", "rb").read()]
        assert len(victims) == 2, victims
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        state = cluster.slurm.wait_job(job, env, timeout_s=150)
    log = open(glob.glob(os.path.join(out, "slurm-*.out"))[0]).read()
    assert state == "COMPLETED", log[-4000:]
    addresses = [n.address for n in cluster.tb.hosts]
    finals = {w: rs[-1]["final"] for w, rs in worker_records(out).items() if rs and "final" in rs[-1]}
    assert sorted(finals) == [f"{addresses[0]}_0", f"{addresses[0]}_1"], log[-4000:]
    assert len({f["w"] for f in finals.values()}) == 1
    sizes = finals[f"{addresses[0]}_0"]["sizes"]
    assert len(sizes) == 60 and sizes[0] == 4 and sizes[-1] == 2, sizes
    assert f"host {addresses[1]} blacklisted" in log
