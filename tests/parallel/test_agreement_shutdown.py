"""A rank that shuts down while the others run cache-agreement rounds
(netreduce/worker/agreement.py) says so in its last round: afterwards no rank is left
inside a round's all-reduce waiting for it. Without that, the staying rank's
executor sat in the data plane until NETREDUCE_TIMEOUT, its shutdown's join gave
up, and the interpreter's exit with that thread in native code aborted the
process (SIGABRT, seen in CI as a rank exiting with -6)."""

import pytest

from netreduce.environment import discover
from tests.procs import launch_script


SCRIPT = r"""
import sys, time
import numpy as np
import netreduce as nr
from netreduce import api
from netreduce.worker.agreement import ROUND_SEQ
nr.init()
r = nr.rank()
comm = api._communicator()
x = np.ones(1024, dtype=np.float32)
for step in range(20):                       # the same name: cached after the first
    out = nr.allreduce(x, name="g", op=nr.Sum)
    assert np.all(out == nr.size()), out
assert comm.agreement is not None and comm.agreement.rounds > 0, "no round ran"
# ... and steady steps were speculative (netreduce/worker/speculation.py): rank 1 leaves
# with the speculation armed, so its last message is a speculative one saying 'other'
assert comm.agreement.spec.hits > 0, "no speculative step"
if r == 1:
    nr.shutdown()                            # leaves while rank 0 idles in rounds
    print("rank 1 left", flush=True)
    sys.exit(0)
deadline = time.monotonic() + 15
while not comm.agreement.off and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(0.3)                              # several idle periods (IDLE_S) later
state = (comm.agreement.off, comm.running() == ROUND_SEQ)
print(f"rank 0 after rank 1 left: agreement off {state[0]}, in a round {state[1]}; "
      f"failure {comm.failure()!r}", flush=True)
# rounds over (a failure raised by rank 1's leaving is as good: no round follows it)
assert (state[0] or comm.failure() is not None) and not state[1], state
nr.shutdown()
print("rank 0 done", flush=True)
"""


@pytest.mark.skipif(discover().size > 1, reason="starts its own job")
@pytest.mark.parametrize("algorithm", ["flat", "hierarchical"])
def test_leaving_rank_ends_the_rounds(algorithm):
    proc = launch_script(SCRIPT, 2, NETREDUCE_TIMEOUT="20", NETREDUCE_ALGORITHM=algorithm)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "agreement off True, in a round False" in proc.stdout, proc.stdout[-4000:]
    assert "rank 0 done" in proc.stdout, proc.stdout[-4000:]
