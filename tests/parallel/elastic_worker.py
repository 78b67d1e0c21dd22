"""One worker of the elastic tests (test_elastic_run.py), started by netreduce-run's
elastic driver. Its training: a 64-element parameter vector w, and each step
w += average over the ranks of a gradient that depends on the rank and the step
(so the result depends on who the ranks are), committed every step; numpy only.

It writes to $ELASTIC_OUT/<host>_<slot>.jsonl: a line {"pid"} at start, one line per
step {epoch, rank, size, step, t}, and at the end {"final": {...}} with w's bytes,
the sizes each step ran at and the resets it saw. Knobs (environment):
ELASTIC_STEPS (60), ELASTIC_PAUSE (s per step, 0.05), ELASTIC_FAIL=all (every worker
exits 1 at step 3), ELASTIC_HOLD=5,20 (after committing those steps, wait — at most 60 s —
until the driver's host update has reached this worker: the test changes the hosts
when it sees the step, and the change then takes effect at the next commit whatever
the machine's load)."""
import os
import sys
import time

import numpy as np
from elastic_log import hold_for_update, start_record

import netreduce as nr
from netreduce import config, elastic
from netreduce.ops import ReduceOp


def main() -> None:
    steps = int(os.environ.get("ELASTIC_STEPS", "60"))
    holds = {int(s) for s in os.environ.get("ELASTIC_HOLD", "").split(",") if s}
    pause = float(os.environ.get("ELASTIC_PAUSE", "0.05"))
    write = start_record()
    nr.init()
    state = elastic.ObjectState(nr.broadcast_object, nr.rank, step=0, w=np.zeros(64),
                                sizes=[])
    resets = []
    state.register_reset_callbacks([lambda: resets.append([nr.rank(), nr.size()])])

    @elastic.run_fn
    def train(state):
        while state.step < steps:
            if os.environ.get("ELASTIC_FAIL") == "all" and state.step == 3:
                sys.exit(1)
            grad = np.sin(np.arange(64) + state.step * 0.1 + nr.rank())
            state.w = state.w + nr.allreduce(grad, op=ReduceOp.Average, name="grad")
            state.step += 1
            state.sizes = state.sizes + [nr.size()]
            write({"epoch": config.get("NETREDUCE_EPOCH"), "rank": nr.rank(),
                   "size": nr.size(), "step": state.step, "t": time.time()})
            time.sleep(pause)
            state.commit()
            if state.step in holds:
                hold_for_update()

    train(state)
    write({"final": {"w": state.w.tobytes().hex(), "sizes": state.sizes, "resets": resets,
                     "rank": nr.rank(), "size": nr.size()}})
    nr.shutdown()


if __name__ == "__main__":
    main()
