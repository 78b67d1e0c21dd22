"""Loaded first by every rank benchmarks/overlap_step.py starts (this folder leads
PYTHONPATH).

1. torchvision 0.28's Linux wheel is the CUDA build: its compiled ops do not load
   beside the CPU torch and its import fails on two op schemas; the models need none
   of the ops, so declaring the schemas first lets it import
   (tests/parallel/test_elastic_examples.py does the same).
2. NRBENCH_PHASES=PATH: rank 0 records, per training step of an unmodified script,
   when ``optimizer.zero_grad()`` was called, when ``loss.backward()`` started and
   returned, and when the wrapped optimizer's own update (``torch.optim.SGD.step``,
   which Horovod's DistributedOptimizer.step calls after waiting for the gradients)
   started and returned; written to PATH as JSON at exit, in the clock of
   NETREDUCE_TIMELINE (wall-clock microseconds), so the two line up. A PATH with
   ``{rank}`` in it: every rank records, to its own file.
3. NRBENCH_SET_TO_NONE=0: ``optimizer.zero_grad()`` called without an argument zeroes
   the gradients in place (``set_to_none=False``) instead of dropping them (torch's
   default): the gradients' memory then lives from step to step (with
   ``--env-variant``, each mode against itself with torch's default).
4. NRBENCH_THREAD_NAMES=1: Python threads named at the kernel too;
   NRBENCH_THREAD_CPU=PATH: every rank's threads' CPU at every zero_grad (_thread_cpu).
"""
import os

try:
    import torchvision  # noqa: F401
except RuntimeError:
    import sys
    for _name in [m for m in sys.modules if m.startswith("torchvision")]:
        del sys.modules[_name]
    import torch
    _lib = torch.library.Library("torchvision", "FRAGMENT")
    _lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _lib.define("qnms(Tensor qdets, Tensor qscores, float iou_threshold) -> Tensor")
except ImportError:
    pass


def _probe(path: str) -> None:
    import atexit
    import functools
    import json
    import time

    import torch

    steps = []      # [zero_grad, backward start, backward end, update start, update end]
    clock = time.time_ns

    def stamp(index):
        if steps and len(steps[-1]) == index:
            steps[-1].append(clock() / 1000.0)

    zero_grad = torch.optim.Optimizer.zero_grad
    backward = torch.Tensor.backward
    sgd_step = torch.optim.SGD.step

    @functools.wraps(zero_grad)
    def zero_grad_probe(self, *a, **k):
        steps.append([clock() / 1000.0])
        return zero_grad(self, *a, **k)

    @functools.wraps(backward)
    def backward_probe(self, *a, **k):
        stamp(1)
        try:
            return backward(self, *a, **k)
        finally:
            stamp(2)

    @functools.wraps(sgd_step)
    def step_probe(self, *a, **k):
        stamp(3)
        try:
            return sgd_step(self, *a, **k)
        finally:
            stamp(4)

    torch.optim.Optimizer.zero_grad = zero_grad_probe
    torch.Tensor.backward = backward_probe
    torch.optim.SGD.step = step_probe

    def write():
        with open(path, "w") as f:
            json.dump([s for s in steps if len(s) == 5], f)
    atexit.register(write)


_RANK = os.environ.get("RANK", os.environ.get("NETREDUCE_RANK", "0"))
if "{rank}" in os.environ.get("NRBENCH_PHASES", ""):  # every rank, a file each
    _probe(os.environ["NRBENCH_PHASES"].replace("{rank}", _RANK))
elif os.environ.get("NRBENCH_PHASES") and _RANK == "0":
    _probe(os.environ["NRBENCH_PHASES"])


def _zero_in_place() -> None:
    import functools

    import torch

    zero_grad = torch.optim.Optimizer.zero_grad

    @functools.wraps(zero_grad)
    def zero_grad_in_place(self, set_to_none=False):
        return zero_grad(self, set_to_none)

    torch.optim.Optimizer.zero_grad = zero_grad_in_place


if os.environ.get("NRBENCH_SET_TO_NONE") == "0":
    _zero_in_place()


def _name_threads() -> None:
    """Each Python thread started from here on carries its name (15 bytes) as the
    kernel's thread name, so /proc/PID/task/TID/comm and ``perf report --sort comm``
    tell netreduce's executor, landing and negotiation threads apart (Python 3.11
    leaves every thread named after the process)."""
    import ctypes
    import threading

    libc = ctypes.CDLL(None, use_errno=True)
    start = threading.Thread._bootstrap_inner

    def named(self):
        try:
            libc.prctl(15, self.name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
        except Exception:
            pass
        return start(self)

    threading.Thread._bootstrap_inner = named
    libc.prctl(15, b"MainThread", 0, 0, 0)  # (this one runs the training loop)


def _thread_cpu(path: str) -> None:
    """NRBENCH_THREAD_CPU=PATH: at every ``optimizer.zero_grad()`` this process's
    threads' CPU-seconds and minor faults by kernel thread name (the Python threads
    named, _name_threads), written at exit to PATH ({rank}, {who} = NRBENCH_HVD and
    {pid} filled in) as [[time_us, {name: [cpu_s, minflt]}], ...]: a step's CPU
    thread by thread, from one snapshot to the next (~0.2 ms a snapshot)."""
    import atexit
    import functools
    import importlib.util
    import json
    import re
    import time

    import torch

    # The project's one /proc/PID/stat reader, as the benchmarks have it (common.py loads
    # it from this checkout's file: the ranks' netreduce may be another checkout's).
    spec = importlib.util.spec_from_file_location(
        "_overlap_site_common", os.path.join(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))), "common.py"))
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    proc_stat = common.proc_stat
    snaps = []

    def snapshot():
        threads = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                st = proc_stat.read("self", tid)
            except OSError:
                continue
            name = re.sub(r"\d+$", "#", st.comm)
            old = threads.get(name, [0.0, 0])
            threads[name] = [old[0] + st.cpu_seconds, old[1] + st.minflt]
        snaps.append([time.time_ns() / 1000.0, threads])

    zero_grad = torch.optim.Optimizer.zero_grad

    @functools.wraps(zero_grad)
    def zero_grad_snapshot(self, *a, **k):
        snapshot()
        return zero_grad(self, *a, **k)

    torch.optim.Optimizer.zero_grad = zero_grad_snapshot
    out = path.format(rank=_RANK, who=os.environ.get("NRBENCH_HVD", "").replace(":", "_"),
                      pid=os.getpid())

    def write():
        with open(out, "w") as f:
            json.dump(snaps, f)
    atexit.register(write)


if os.environ.get("NRBENCH_THREAD_NAMES") == "1":
    _name_threads()
if os.environ.get("NRBENCH_THREAD_CPU"):
    _thread_cpu(os.environ["NRBENCH_THREAD_CPU"])


def _frameworks_from_tree() -> None:
    """netreduce.torch (mxnet, tensorflow) from the checkout on PYTHONPATH after this
    folder (overlap_step.py's --code NAME=DIR, or the run's own tree): an editable
    install maps those packages to the checkout it was made from, and its finder
    answers for them because the package found on PYTHONPATH has no such folder
    (they live in frameworks/), so a MODE@CODE run would pair the other tree's core
    with the installed tree's framework code."""
    import importlib.util
    import sys
    tree = next((p for p in sys.path[1:] if os.path.isfile(os.path.join(p, "netreduce",
                                                                         "__init__.py"))), None)
    if tree is None or not os.path.isdir(os.path.join(tree, "frameworks")):
        return

    class Frameworks:
        @staticmethod
        def find_spec(fullname, path=None, target=None):
            name = fullname.partition("netreduce.")[2]
            folder = os.path.join(tree, "frameworks", name)
            if not fullname.startswith("netreduce.") or "." in name or \
                    not os.path.isfile(os.path.join(folder, "__init__.py")):
                return None
            return importlib.util.spec_from_file_location(
                fullname, os.path.join(folder, "__init__.py"),
                submodule_search_locations=[folder])

    sys.meta_path.insert(0, Frameworks())


_frameworks_from_tree()
