"""The interleaving a loaded host makes, injected: a helper process stops rank 0
(SIGSTOP) for 8 ms every 20 ms while test_wait_for_a_late_peer_stops_spinning_and_sleeps
runs, so that in some calls rank 0 is the late one. Runs the test at git revision REV
(argument) and at the work tree; prints pass/fail of each.
Usage, from the repository root: python3 benchmarks/results/issue33/flake_hier_inject.py REV"""
import os
import signal
import subprocess
import sys
import time
import types

sys.path.insert(0, ".")


def _stopper(pid):
    if os.fork() == 0:
        try:
            for _ in range(400):
                time.sleep(0.02)
                os.kill(pid, signal.SIGSTOP)
                time.sleep(0.008)
                os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        os._exit(0)


for label, source in (("old (%s)" % sys.argv[1], subprocess.run(
        ["git", "show", sys.argv[1] + ":tests/parallel/test_hierarchical.py"],
        capture_output=True, text=True, check=True).stdout),
        ("new (work tree)", open("tests/parallel/test_hierarchical.py").read())):
    mod = types.ModuleType("t")
    mod.__file__ = "tests/parallel/test_hierarchical.py"
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)
    real = mod._late_peer_rank

    def rank(r, n, q_seg, q_out, *args, real=real):
        if r == 0:
            _stopper(os.getpid())
        return real(r, n, q_seg, q_out, *args)

    mod._late_peer_rank = rank
    try:
        mod.test_wait_for_a_late_peer_stops_spinning_and_sleeps()
        print(label, "passed")
    except AssertionError as exc:
        print(label, "FAILED:", str(exc).splitlines()[0][:200])
