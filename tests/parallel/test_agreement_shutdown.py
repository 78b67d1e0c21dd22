"""A rank that shuts down while the others run cache-agreement rounds
(netreduce/worker/agreement.py) says so in its last round: afterwards no rank is left
inside a round's all-reduce waiting for it. Without that, the staying rank's
executor sat in the data plane until NETREDUCE_TIMEOUT, its shutdown's join gave
up, and the interpreter's exit with that thread in native code aborted the
process (SIGABRT, seen in CI as a rank exiting with -6)."""

import re

import pytest

from netreduce.environment import discover
from tests.procs import launch_script


SCRIPT = r"""
import sys, time
import numpy as np
import netreduce as nr
from netreduce import api
from netreduce.errors import RankFailedError
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
    # Its last round said so (v[2] = 0) and completed: an all-reduce, so rank 0 took
    # part in it, and its result turned the rounds off here.
    print(f"rank 1 left: said so {comm.agreement.said_leaving}, agreement off "
          f"{comm.agreement.off}", flush=True)
    sys.exit(0)
# Rank 0 sees that round's result and turns its rounds off too, or, when rank 1's
# goodbye (which fails the job for the ranks that stay: coordinator.py, handle_bye)
# reaches it while it still waits on its copy of that round, the failure aborts that
# wait. Either way it starts no round after. Which comes first is a race: the second
# ending shows on a loaded machine, where rank 0's thread is slower to return from
# the round than rank 1 is to say goodbye.
deadline = time.monotonic() + 15
while not comm.agreement.off and comm.failure() is None and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(0.3)                              # several idle periods (IDLE_S) later
off, in_round, failure = comm.agreement.off, comm.running() == ROUND_SEQ, comm.failure()
ending = ("agreement off" if off else
          "rank 1's goodbye" if isinstance(failure, RankFailedError) and "rank 1 " in str(failure)
          else "neither")
print(f"rank 0 after rank 1 left: rounds ended by {ending}, in a round {in_round}; "
      f"off {off}, failure {failure!r}", flush=True)
assert ending != "neither" and not in_round, (off, in_round, failure)
nr.shutdown()
print("rank 0 done", flush=True)
"""


@pytest.mark.skipif(discover().size > 1, reason="starts its own job")
@pytest.mark.parametrize("algorithm", ["flat", "hierarchical"])
def test_leaving_rank_ends_the_rounds(algorithm):
    proc = launch_script(SCRIPT, 2, NETREDUCE_TIMEOUT="20", NETREDUCE_ALGORITHM=algorithm)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "rank 1 left: said so True, agreement off True" in proc.stdout, proc.stdout[-4000:]
    assert re.search(r"rounds ended by (agreement off|rank 1's goodbye), in a round False",
                     proc.stdout), proc.stdout[-4000:]
    assert "rank 0 done" in proc.stdout, proc.stdout[-4000:]
