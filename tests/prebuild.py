"""Slow builds and peers' reference runs a test needs, started in the background when
the session starts.

The suite runs one test at a time, and most of its time one of the two cores waits: on
a timeout a test is meant to hit, a daemon's start, a framework's import (the
rehearsals' CPU was ~1.15 of 2 cores). On a fresh machine (CI's) four caches are filled
inside one test each while nothing else runs: the sanitizer build of
tests/parallel/test_fuzz_smoke.py (the native data plane three ways with clang, ~55
CPU-s; ~/.cache/netreduce/fuzz), netreduce.tensorflow's graph ops (tf-ops), the gloo
runs tests/parallel/test_torch_fsdp.py compares against (fsdp-gloo: three 2- and 4-rank
torch jobs) and Horovod's answers of the reducescatter comparison (horovod-answers: one
2-rank horovodrun); a warm machine computes none of them. Started at the session's
start under ``nice -n 19``, they take the cores' idle time instead. The fuzz test waits
for its build, then runs scripts/sanitizers.sh as before (its own fuzz/build.sh finds
everything built, or builds what is missing and shows any compiler error); a TensorFlow
test that needs the ops meanwhile waits on their cache's lock, as concurrent ranks do;
the two peers' tests wait for their run (the test module run as a program computes
what the test reads, keyed as the test keys it), then read the cache or, where that
run failed, run the peer themselves. A failed or unfinished background run changes
nothing but the time; NETREDUCE_TEST_PREBUILD=0 starts none.

A run that writes files for its test (the Soft-RoCE run's record folder under /tmp,
the Ray driver's scratch folder) names each as it makes it (files_line): where no test
read that run's output (its test deselected, the session interrupted, the run
failed), stop_all removes them with the run, finished or not. A cache (the fuzz
build, the TF ops, the peers' answers) is kept on purpose and named by no such line.

Niced for real: each build runs in a session of its own (killed as a group), and where
the kernel schedules by session (autogroups, /proc/sys/kernel/sched_autogroup_enabled)
a task's nice counts only inside its session's group. So the group itself is set to
nice 19 (/proc/PID/autogroup), and so is each session a build's launcher starts below
it (netreduce-run and horovodrun start every rank in one); a build a test waits for
goes back to 0. Without it, on the AMD boot of 12-07, a `nice -n 19` spinner in its own
session took as much of a core as a nice-0 one beside it (1.33 against 1.27 CPU-s in
3.5 s; benchmarks/results/issue33/citime2_autogroup_probe.txt); with it 0.01.

Before them, and not in the background: the checkout's bytecode (netreduce/, frameworks/,
tests/), where this interpreter writes none itself (PYTHONDONTWRITEBYTECODE, set on the
machines the suite is rehearsed on). Then every process the suite starts, and it starts
over a thousand (daemons, ranks, launchers), compiled each netreduce module it imported
from source again: ~85 ms of a daemon start's ~470 ms CPU. Python reads bytecode that
is there whatever that variable says, and checks it against its source file as always,
so an edit is seen as before; compiling the tree takes ~0.5 CPU-s, ~0.15 when it is up
to date. The files go to the __pycache__/ folders Python would write (.gitignore)."""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Callable, Dict, List, Optional, Set, Tuple

from netreduce.testbed import proc_stat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FUZZ = "tests/parallel/test_fuzz_smoke.py::test_sanitizer_build_and_fuzz_smoke"
FSDP_GLOO = "tests/parallel/test_torch_fsdp.py::test_fsdp_matches_gloo"
HOROVOD_ANSWERS = ("tests/parallel/test_torch_reducescatter.py"
                   "::test_reducescatter_allgather_alltoall_match_horovod")
RAY = "tests/parallel/test_ray.py"
SOFTROCE = "tests/softroce/test_softroce.py"


def _tensorflow_selected(ids) -> bool:
    return any(("tensorflow" in i or "keras" in i) for i in ids) and \
        importlib.util.find_spec("tensorflow") is not None


def _selected(prefix: str) -> Callable[[Set[str]], bool]:
    return lambda ids: any(i.startswith(prefix) for i in ids)


def _ray_driven(ids) -> bool:
    """A test of test_ray.py that reads its driver's run (all but the arguments' check)."""
    return any(i.startswith(RAY + "::") and "::test_config_arguments" not in i for i in ids) \
        and importlib.util.find_spec("ray") is not None


# name -> (the program it needs, whether the selected node ids need it, the command);
# run from the checkout's root
BUILDS: Dict[str, Tuple[str, Callable[[Set[str]], bool], List[str]]] = {
    FUZZ: ("clang++", lambda ids: FUZZ in ids, ["bash", "fuzz/build.sh"]),
    # netreduce.tensorflow's graph ops (frameworks/tensorflow/op_library.py): compiled on
    # a fresh machine by the first TensorFlow test that builds a graph (~20 CPU-s with
    # TensorFlow's import), while its ranks wait; a test that needs them meanwhile waits
    # on the cache's file lock, as concurrent ranks do
    "tf-ops": ("c++", _tensorflow_selected,
               [sys.executable, "-m", "netreduce.tensorflow.op_library"]),
    # peers' answers (~35 CPU-s of torch jobs, ~8 s of horovodrun on a fresh machine):
    # the test module computes what its test reads from the cache
    FSDP_GLOO: (sys.executable, _selected(FSDP_GLOO),
                [sys.executable, "-m", "tests.parallel.test_torch_fsdp"]),
    HOROVOD_ANSWERS: ("horovodrun", _selected(HOROVOD_ANSWERS),
                      [sys.executable, "-m", "tests.parallel.test_torch_reducescatter"]),
    # Ray's driver (tests/parallel/ray_driver.py: a local Ray cluster, a TorchTrainer
    # and a RayExecutor job, ~38 s and ~60 CPU-s quietly, most of it Ray's and torch's
    # process starts): the module fixture reads the RESULT line of this run's output
    # (output(RAY)), or runs the driver itself where this run failed. Nothing is
    # cached: each session runs the driver once, as before.
    RAY: (sys.executable, _ray_driven, [sys.executable, "-m", "tests.parallel.test_ray"]),
    # the Soft-RoCE module's bed and QEMU guest (TCG: ~40 s and ~40 CPU-s quietly, the
    # guest's boot ~8 s of it): its fixture moves this run's record and files into its
    # own folder, or boots the guest itself where this run's guest never reported a
    # status. Its bridge, tap and nftables table are named for this run's pid; SIGTERM
    # takes them down (stop_all)
    SOFTROCE: ("qemu-system-x86_64", _selected(SOFTROCE + "::"),
               [sys.executable, "-m", "tests.softroce.test_softroce"]),
}

FILES = "FILES "  # a background run's line naming a file or folder it wrote for its test

_running: Dict[str, subprocess.Popen] = {}
_outputs: Dict[str, "IO[bytes]"] = {}  # name -> its stdout and stderr (an unlinked file)
_watcher: Optional[threading.Thread] = None
_lock = threading.Lock()
WATCH_S = 0.5  # a rank's first half second at nice 0; a /proc scan is ~4 ms of CPU here


def _launched() -> bool:
    """A rank's own session under a launcher (tests/parallel/launched.py: the TensorFlow
    and torch suites, one pytest per rank, started by a test of the session that
    already started these): it would start one more of each per rank, and its ranks
    build the TF ops they need under the cache's lock themselves."""
    from netreduce.environment import discover

    return discover().size > 1


def start(selected_ids: Set[str]) -> None:
    """Starts, niced, each build the selected tests need whose program is here."""
    if os.environ.get("NETREDUCE_TEST_PREBUILD", "1") == "0" or _launched():
        return
    compile_bytecode()
    for name, (compiler, needed, cmd) in BUILDS.items():
        if name not in _running and shutil.which(compiler) and needed(selected_ids):
            _outputs[name] = tempfile.TemporaryFile()
            _running[name] = subprocess.Popen(
                ["nice", "-n", "19"] + cmd, cwd=ROOT, stdin=subprocess.DEVNULL,
                stdout=_outputs[name], stderr=subprocess.STDOUT, start_new_session=True)
            _nice_autogroup(_running[name].pid)
    global _watcher
    if _running and _watcher is None and os.path.exists("/proc/self/autogroup"):
        _watcher = threading.Thread(target=_watch, name="prebuild nice", daemon=True)
        _watcher.start()


def compile_bytecode() -> None:
    """The checkout's bytecode, where no process of the suite would write it (above)."""
    if not sys.dont_write_bytecode:
        return  # the first process to import a module writes its bytecode
    import compileall
    for folder in ("netreduce", "frameworks", "tests"):
        compileall.compile_dir(os.path.join(ROOT, folder), quiet=2)


def _nice_autogroup(pid: int, nice: int = 19) -> bool:
    """The session's scheduling group of ``pid`` at ``nice``, where the kernel has
    autogroups (at 19 its members yield to every other session's, the tests' among
    them). False only where that was refused: back to 0 needs CAP_SYS_NICE (root)."""
    for _ in range(3):
        try:
            with open(f"/proc/{pid}/autogroup", "w") as f:
                f.write(str(nice))
            return True
        except BlockingIOError:  # EAGAIN: without CAP_SYS_ADMIN one change per 0.1 s
            time.sleep(0.11)
        except PermissionError:
            return False
        except OSError:  # no autogroup here (or the build has ended already): nice alone
            return True
    return True


def _sessions_below(roots: Set[int]) -> List[int]:
    """The session leaders among the descendants of ``roots``: netreduce-run and
    horovodrun start each rank in a session of its own, which under autogroups is a
    scheduling group of its own at nice 0 whatever the rank's nice."""
    parent: Dict[int, int] = {}
    leaders: List[int] = []
    for p in proc_stat.processes():
        parent[p.pid] = p.ppid
        if p.session == p.pid:  # its own session's leader
            leaders.append(p.pid)
    below = []
    for pid in leaders:
        up = parent.get(pid, 0)
        for _ in range(32):
            if up in roots:
                below.append(pid)
                break
            if up <= 1:
                break
            up = parent.get(up, 0)
    return below


def _watch() -> None:
    """While background builds run: each new session under one (a rank) gets its group
    at nice 19 too, as the build's own."""
    global _watcher
    done: Set[int] = set()
    while True:
        with _lock:  # wait() takes a build out of _running and its groups back to 0
            roots = {p.pid for p in list(_running.values()) if p.poll() is None}
            if not roots:
                _watcher = None
                return
            for pid in _sessions_below(roots):
                if pid not in done:
                    done.add(pid)
                    _nice_autogroup(pid)
        time.sleep(WATCH_S)


def wait(name: str, timeout: float = 600) -> Optional[int]:
    """Waits for the background build ``name``, if one was started; its exit status
    (None: none started). The caller's own build shows what went wrong, if anything."""
    with _lock:
        proc = _running.pop(name, None)
        if proc is None:
            return None
        # a test waits on it now: the rest of the build no longer takes only idle time
        # (under others' load a group at nice 19 would get next to nothing meanwhile);
        # where it cannot get its priority back (not root) it goes, and the test builds
        # or runs the peer itself, at the test's priority
        if not _nice_autogroup(proc.pid, 0):
            _kill(proc)
            return None
        for pid in _sessions_below({proc.pid}):
            _nice_autogroup(pid, 0)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return None


def output(name: str) -> str:
    """What the background run ``name`` wrote (stdout and stderr); "" where none ran.
    Read once wait() has returned its exit status."""
    f = _outputs.pop(name, None)
    if f is None:
        return ""
    with f:
        f.seek(0)
        return f.read().decode(errors="replace")


def files_line(path: str) -> str:
    """What a background run prints (and flushes) as it makes ``path``, a file or
    folder for its test under the temporary folder: stop_all removes it where no test
    reads the run's output."""
    return FILES + os.path.abspath(path)


def stop_all() -> None:
    """At the session's end: a build no test waited for (deselected, interrupted) goes,
    and so do the files of each run whose output no test read (output()), finished
    or not."""
    for name in list(_running):
        _kill(_running.pop(name))
    for name in list(_outputs):
        _remove_files(output(name))


def files(text: str) -> List[str]:
    """The files and folders a run's output ``text`` names (files_line), in order."""
    return [line[len(FILES):] for line in text.splitlines() if line.startswith(FILES)]


def _remove_files(text: str) -> None:
    """The files and folders a run's output names, under the temporary folder only (a
    stray line is no reason to remove anything else)."""
    tmp = os.path.abspath(tempfile.gettempdir())
    for named in files(text):
        path = os.path.abspath(named)
        if os.path.commonpath([tmp, path]) != tmp or path == tmp:
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)


def _kill(proc: subprocess.Popen, grace: float = 15) -> None:
    """The run's session: SIGTERM to its process group first (the Soft-RoCE run takes
    its bridge, tap and table down on it), then SIGKILL after ``grace`` seconds to
    whatever of the session is left, process groups of its own included (coreutils'
    timeout, around the guest's QEMU, makes one)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    for p in proc_stat.processes():
        if p.session == proc.pid:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    proc.wait()
