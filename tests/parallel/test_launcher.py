"""netreduce-run: rank environment, prefixed output, failure handling, signal
forwarding, no orphans. The toy commands are plain Python one-liners."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from netreduce.testbed import proc_stat

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env(**extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NETREDUCE_SWITCH", None)
    env.update(extra)
    return env


def run_launcher(args, timeout=60.0, **env):
    return subprocess.run([sys.executable, "-m", "netreduce.launcher", *args], env=_env(**env),
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def wait_gone(pids, within: float) -> list:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(proc_stat.alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if proc_stat.alive(p)]


# A rank that records its pid and the pid of a child it started, then sleeps; the
# rank named by FAIL_RANK exits 1 once every rank has written its pids.
SLEEPER = textwrap.dedent("""
    import os, subprocess, sys, time
    d, n = sys.argv[1], int(os.environ["NETREDUCE_SIZE"])
    r = int(os.environ["NETREDUCE_RANK"])
    child = subprocess.Popen(["sleep", "120"])
    with open(os.path.join(d, f"{r}.pid"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    print("started", r, flush=True)
    if r == int(os.environ.get("FAIL_RANK", "-1")):
        while len([x for x in os.listdir(d) if x.endswith(".pid")]) < n:
            time.sleep(0.05)
        sys.exit(1)
    time.sleep(120)
""")


def read_pids(d, n):
    pids = []
    for r in range(n):
        with open(os.path.join(d, f"{r}.pid")) as f:
            pids += [int(x) for x in f.read().split()]
    return pids


def test_rank_environment_and_prefixed_output():
    code = ("import os; e = os.environ; print(e['NETREDUCE_RANK'], e['NETREDUCE_SIZE'], "
            "e['NETREDUCE_LOCAL_RANK'], e['NETREDUCE_JOB'], e['NETREDUCE_SWITCH']); "
            "import sys; print('to stderr', file=sys.stderr)")
    proc = run_launcher(["-np", "3", "--switch", "127.0.0.1:9", sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stderr
    lines = sorted(proc.stdout.splitlines())
    assert [ln.split()[:3] for ln in lines] == [[f"[{r}]<stdout>:{r}", "3", str(r)] for r in range(3)]
    assert len({ln.split()[3] for ln in lines}) == 1            # one job name for all ranks
    assert all(ln.split()[4] == "127.0.0.1:9" for ln in lines)  # --switch: nothing spawned
    assert sorted(proc.stderr.splitlines()) == [f"[{r}]<stderr>:to stderr" for r in range(3)]


def test_exit_codes_and_usage():
    assert run_launcher(["-np", "2", "--switch", "h:1", "--", sys.executable, "-c",
                         "pass"]).returncode == 0
    proc = run_launcher(["-np", "2", "--switch", "h:1"])
    assert proc.returncode == 2 and "no command given" in proc.stderr
    proc = run_launcher(["-np", "2", "--switch", "h:1", "/nonexistent/program"])
    assert proc.returncode == 127 and "cannot start rank 0 on localhost: /nonexistent/program" in proc.stderr


def test_embedded_aggregator_serves_the_ranks():
    code = ("import numpy as np, netreduce as nr; nr.init(); "
            "x = nr.allreduce(np.full(4, nr.rank(), np.float32), op=nr.Sum); "
            "print('sum', x[0]); nr.shutdown()")
    proc = run_launcher(["-np", "2", sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0]<stdout>:sum 1.0", "[1]<stdout>:sum 1.0"]


def test_names_of_this_machine_are_distinct_hosts(tmp_path):
    """-H localhost:2,127.0.0.1:2 (as Horovod's own elastic tests use it): four local
    processes, two hosts to netreduce's layout check and to the ranks' variables."""
    code = ("import json, os, numpy as np, netreduce as nr; nr.init(); "
            "x = nr.allreduce(np.arange(5000, dtype=np.int32) * (nr.rank() + 1), op=nr.Sum); "
            "e = os.environ; print(json.dumps([nr.rank(), nr.local_rank(), nr.local_size(), "
            "e['HOROVOD_HOSTNAME'], e['HOROVOD_CROSS_RANK'], e['HOROVOD_CROSS_SIZE'], "
            "bool((x == np.arange(5000) * 10).all())])); nr.shutdown()")
    proc = run_launcher(["-np", "4", "-H", "localhost:2,127.0.0.1:2", "--output-filename",
                         str(tmp_path), sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = sorted(json.loads(ln.split(":", 1)[1]) for ln in proc.stdout.splitlines())
    assert got == [[0, 0, 2, "localhost", "0", "2", True], [1, 1, 2, "localhost", "0", "2", True],
                   [2, 0, 2, "127.0.0.1", "1", "2", True], [3, 1, 2, "127.0.0.1", "1", "2", True]]
    assert json.loads((tmp_path / "rank.3" / "stdout").read_text())[0] == 3


def test_host_list_errors_are_usage_errors():
    for args, said in ((["-np", "5", "-H", "localhost:2,127.0.0.1:2"], "more ranks than the 4 slots"),
                       (["-np", "2", "-H", "localhost"], "is not host:slots"),
                       (["-np", "2", "-H", "a:1", "--hostfile", "f"], "not allowed with"),
                       (["-H", "localhost:2"], "-np/--num-proc is required")):
        proc = run_launcher([*args, "true"])
        assert proc.returncode == 2 and said in proc.stderr, (args, proc.stderr)


@pytest.mark.slow
def test_failing_rank_stops_the_job_fast_with_no_orphans(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    t0 = time.monotonic()
    proc = run_launcher(["-np", "3", "--switch", "127.0.0.1:9", sys.executable, str(script),
                         str(tmp_path)], FAIL_RANK="1")
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert elapsed < 10, elapsed
    assert "rank 1 on localhost exited with code 1" in proc.stderr
    # the ranks and the `sleep` each of them started are all gone
    assert wait_gone(read_pids(tmp_path, 3), 2.0) == []


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_are_forwarded_and_nothing_survives(tmp_path, signum):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    launcher = subprocess.Popen([sys.executable, "-m", "netreduce.launcher", "-np", "2",
                                 sys.executable, str(script), str(tmp_path)],
                                env=_env(), cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = read_pids(tmp_path, 2)
        # the embedded aggregator is a child of the launcher too
        switch = [p for p in proc_stat.children(launcher.pid) if "netreduce.switch" in _cmdline(p)]
        assert len(switch) == 1
        pids += switch
        t0 = time.monotonic()
        launcher.send_signal(signum)
        code = launcher.wait(10)
        assert time.monotonic() - t0 < 10
        assert code == 128 + signum
        assert wait_gone(pids, 2.0) == []
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        launcher.stdout.close()
        launcher.stderr.close()


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


@pytest.mark.slow
def test_launcher_killed_with_sigkill_takes_the_ranks_along(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    launcher = subprocess.Popen([sys.executable, "-m", "netreduce.launcher", "-np", "2",
                                 "--switch", "127.0.0.1:9", sys.executable, str(script),
                                 str(tmp_path)], env=_env(), cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = read_pids(tmp_path, 2)
    launcher.kill()
    launcher.wait()
    rank_pids = pids[0::2]  # PR_SET_PDEATHSIG reaches the ranks themselves
    assert wait_gone(rank_pids, 5.0) == []
    for p in pids[1::2]:  # their `sleep` children are not ours to guarantee here
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
