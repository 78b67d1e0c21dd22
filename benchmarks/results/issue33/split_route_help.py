"""route() + help() of one submission on a standalone Agreement (no executor, no data
plane): the user-thread path the executor's wake-up bookkeeping sits on (split,
12-07). Thread CPU ns per submission, the minimum of 5 runs of 50,000.

    python3 benchmarks/results/issue33/split_route_help.py TREE   # TREE: a checkout's root
"""
import sys
import threading
import time
from types import SimpleNamespace

N = 50000


def main(tree: str) -> None:
    sys.path.insert(0, tree)
    import netreduce
    from netreduce.protocol.signature import Signature
    from netreduce.worker.agreement import Agreement
    from netreduce.worker.wake_queue import WakeQueue
    assert netreduce.__file__.startswith(tree), netreduce.__file__
    sig = Signature("allreduce", "float32", (3,), "sum")
    cache = SimpleNamespace(id_of={"a": (0, sig)}, hits=0)
    comm = SimpleNamespace(timeout_s=30.0, cache=cache, failure=lambda: None)
    ag = Agreement(comm, WakeQueue(), width=8, threshold=1 << 20)
    spec = ag.spec
    spec.ids, spec.idset, spec.waited = (0,), frozenset({0}), True   # left to a wait
    wakes = getattr(ag, "wakes", ag)     # (the counters lived on the Agreement before)
    t = SimpleNamespace(name="a", sig=sig, kind="allreduce",
                        handle=SimpleNamespace(_helper=None), seq=-1)
    done = threading.Event()
    done.set()
    handle = SimpleNamespace(_event=done)

    def run() -> float:
        q = ag.q.queue
        t0 = time.thread_time_ns()
        for _ in range(N):
            wakes.polls = True
            ag.route([t])
            ag.help(handle)
            ag.pending.clear()
            q.clear()
        return (time.thread_time_ns() - t0) / N

    run()
    print(f"{min(run() for _ in range(5)):.0f}")


if __name__ == "__main__":
    main(sys.argv[1])
