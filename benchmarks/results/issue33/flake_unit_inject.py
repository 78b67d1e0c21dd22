"""The interleaving a loaded host makes, injected: the sampler's thread takes its first
sample as it starts (before the test's t0), then is not run for 1 s (longer than the
old test's two 0.05 s sleeps and the 64 MiB touch between them). Runs the test at git
revision REV (argument) and at the work tree; prints pass/fail of each.
Usage, from the repository root: python3 benchmarks/results/issue33/flake_unit_inject.py REV"""
import subprocess
import sys
import threading
import time
import types

sys.path.insert(0, ".")
from benchmarks import common  # noqa: E402

_init = common.MachineCPUSampler.__init__


class _Stalled(threading.Event):
    first = True

    def wait(self, timeout=None):
        if self.first:
            self.first = False
            time.sleep(1.0)  # descheduled
            return self.is_set()
        return super().wait(timeout)


def _init_stalled(self, *a, **kw):
    _init(self, *a, **kw)
    self._stop = _Stalled()


_enter = common.MachineCPUSampler.__enter__


def _enter_sampled(self):
    _enter(self)
    while not self.samples:  # its first sample taken before the caller goes on
        time.sleep(0.001)
    return self


common.MachineCPUSampler.__init__ = _init_stalled
common.MachineCPUSampler.__enter__ = _enter_sampled

for label, source in (("old (%s)" % sys.argv[1], subprocess.run(
        ["git", "show", sys.argv[1] + ":tests/unit/test_overlap_step.py"],
        capture_output=True, text=True, check=True).stdout),
        ("new (work tree)", open("tests/unit/test_overlap_step.py").read())):
    mod = types.ModuleType("t")
    mod.__file__ = "tests/unit/test_overlap_step.py"
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)
    try:
        mod.test_ranks_minor_faults_are_sampled_beside_their_cpu()
        print(label, "passed")
    except AssertionError as exc:
        print(label, "FAILED:", repr(exc)[:200])
