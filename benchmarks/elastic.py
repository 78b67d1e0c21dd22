"""Elastic jobs on the testbed (issue 32, Measure): netreduce-run's elastic driver
against Horovod 0.28.1's (horovodrun --gloo), the same resnet18 worker
(benchmarks/elastic_worker.py) under both, 2 hosts of 2 ranks over ssh.

    sudo python3 benchmarks/elastic.py                       # every scenario, 5 runs each
    sudo python3 benchmarks/elastic.py --scenarios kill --impls netreduce --runs 1

Scenarios (each run a fresh job, the two implementations alternating):

* ``kill``: ``-np 4 --min-np 2 -H h0:2,h1:2``; once the job has run WARM steps at
  N=4, both of h1's ranks are SIGKILLed (in h1's namespace). Recorded: seconds from
  the kill to the first step completed at N=2, that minus one N=2 step (the
  recovery's own cost: the reset and the state's sync from the new rank 0), and
  steps lost: the interrupted one plus completed steps the rollback undid (none:
  the state is committed every step).
* ``add``: ``-np 2 --min-np 2 --max-np 4`` with a discovery script printing h0:2; after
  WARM steps it prints h0:2 and h1:2. Recorded: seconds from that change (the file
  written) to the first step completed at N=4 — the drivers poll the script every
  second, and the new workers must start (Python, torch, the model) and get the
  state synced — and the stall: the time no step completed around the change, less
  one N=4 step (netreduce's driver starts the new workers ahead and lets the job
  train on until they are up; Horovod's stops at the next commit and waits).
* ``steady`` (netreduce only): the median step time of a static job (``netreduce-run
  -np 4 -H h0:2,h1:2``, a plain loop) against the same loop under ``hvd.elastic.run``
  with ``--min-np`` given and the state committed every step (and every 10), runs
  alternating.

Horovod needs ``--network-interface eth0``: its ranks dial the driver at the root
namespace's own eth0, reached through a default route via the bridge that this
script adds to the host namespaces (as benchmarks/launch_hosts.py does). Writes the
raw record (--json, default benchmarks/results/elastic.json): every run's timings and
each job's step log summary, the machine's load at each run."""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "elastic_worker.py")
sys.path.insert(0, REPO)

from netreduce.testbed import Testbed  # noqa: E402
from netreduce.testbed.sshd import SshHosts  # noqa: E402


def _records(out: str) -> List[dict]:
    rows = []
    for path in glob.glob(os.path.join(out, "*.jsonl")):
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def _steps(out: str) -> List[dict]:
    """One record per step: the slowest rank's end (a step is complete when every
    rank completed it), at the size it ran."""
    by = {}
    for r in _records(out):
        if "step" not in r:
            continue
        key = (r["step"], r["size"])
        if key not in by or r["t1"] > by[key]["t1"]:
            by[key] = dict(r)
    return sorted(by.values(), key=lambda r: r["t1"])


class Job:
    def __init__(self, tb: Testbed, ssh: SshHosts, impl: str, flags: List[str], env: Dict[str, str],
                 out: str) -> None:
        self.tb, self.out = tb, out
        py = sys.executable
        if impl == "netreduce":
            argv = [py, "-m", "netreduce.launcher", *flags, "-i", ssh.identity, py, WORKER]
        else:
            horovodrun = shutil.which("horovodrun") or "horovodrun"
            argv = [horovodrun, *flags, "-i", ssh.identity, "--gloo", "--network-interface", "eth0",
                    py, WORKER]
        self.log = open(os.path.join(out, "launcher.log"), "w+")
        self.proc = subprocess.Popen(ssh.client_argv(argv), env=ssh.client_env(env), cwd=REPO,
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait_for(self, what, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while not what():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"job ended or timed out; its output:\n{self.output()[-4000:]}")
            time.sleep(0.05)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def kill_host(self, index: int) -> float:
        """SIGKILL the workers in host ``index``'s namespace; the time of the kill."""
        pids = subprocess.run(["ip", "netns", "pids", self.tb.hosts[index].netns],
                              capture_output=True, text=True).stdout.split()
        victims = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"elastic_worker.py" in f.read():
                        victims.append(int(pid))
            except OSError:
                pass
        t = time.time()
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        return t

    def finish(self, timeout: float = 300.0) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _median(xs: List[float]) -> Optional[float]:
    return statistics.median(xs) if xs else None


def run_kill(tb, ssh, impl, env, out, warm, steps) -> Dict:
    job = Job(tb, ssh, impl, ["-np", "4", "--min-np", "2", "-H", "h0:2,h1:2"],
              dict(env, ELASTIC_STEPS=str(steps)), out)
    job.wait_for(lambda: sum(1 for s in _steps(out) if s["size"] == 4) >= warm)
    t_kill = job.kill_host(1)
    code = job.finish()
    rows = _steps(out)
    before = [s for s in rows if s["size"] == 4 and s["t1"] <= t_kill]
    after = [s for s in rows if s["size"] == 2]
    if not after:
        raise RuntimeError(f"no step at N=2; output:\n{job.output()[-4000:]}")
    first = after[0]
    step2 = _median([b["t1"] - a["t1"] for a, b in zip(after[1:], after[2:])])
    step4 = _median([b["t1"] - a["t1"] for a, b in zip(before[1:], before[2:])])
    last4 = max(s["step"] for s in rows if s["size"] == 4)  # completed, so committed
    # The kill interrupts step last4 + 1; the job resumes at its last commit. Steps lost:
    # that one, plus any completed step the rollback undid (none when every step commits).
    return {"exit": code, "kill_to_first_step_s": first["t1"] - t_kill,
            "recovery_s": first["t1"] - t_kill - (step2 or 0.0), "step_s_n4": step4,
            "step_s_n2": step2, "last_step_n4": last4, "first_step_n2": first["step"],
            "steps_lost": last4 + 2 - first["step"]}


def run_add(tb, ssh, impl, env, out, warm, steps) -> Dict:
    hosts = os.path.join(out, "hosts.txt")
    with open(hosts, "w") as f:
        f.write("h0:2\n")
    script = os.path.join(out, "discover.sh")
    with open(script, "w") as f:
        f.write(f"#!/bin/sh\ncat {hosts}\n")
    os.chmod(script, 0o755)
    job = Job(tb, ssh, impl, ["-np", "2", "--min-np", "2", "--max-np", "4",
                              "--host-discovery-script", script],
              dict(env, ELASTIC_STEPS="1000"), out)
    job.wait_for(lambda: sum(1 for s in _steps(out) if s["size"] == 2) >= warm)
    with open(hosts + ".new", "w") as f:
        f.write("h0:2\nh1:2\n")
    t_change = time.time()
    os.replace(hosts + ".new", hosts)
    job.wait_for(lambda: sum(1 for s in _steps(out) if s["size"] == 4) >= 4)
    os.killpg(job.proc.pid, signal.SIGTERM)  # measured: stop the job
    job.finish()
    rows = _steps(out)
    before = [s for s in rows if s["size"] == 2]
    after = [s for s in rows if s["size"] == 4]
    step4 = _median([b["t1"] - a["t1"] for a, b in zip(after, after[1:])])
    return {"change_to_first_step_s": after[0]["t1"] - t_change,
            # no step completed meanwhile, less the one the first N=4 step takes
            "stall_s": after[0]["t1"] - before[-1]["t1"] - (step4 or 0.0),
            "steps_n2_after_change": sum(1 for s in before if s["t1"] > t_change),
            "step_s_n2": _median([b["t1"] - a["t1"] for a, b in zip(before[1:], before[2:])]),
            "step_s_n4": step4, "last_step_n2": before[-1]["step"],
            "first_step_n4": after[0]["step"]}


def run_steady(tb, ssh, mode, env, out, steps, commit) -> Dict:
    flags = ["-np", "4", "-H", "h0:2,h1:2"] + (["--min-np", "4"] if mode != "static" else [])
    job = Job(tb, ssh, "netreduce", flags, dict(env, ELASTIC_STEPS=str(steps),
                                                ELASTIC_MODE=mode, ELASTIC_COMMIT=str(commit)), out)
    code = job.finish()
    rows = [s for s in _steps(out) if s["step"] > 3]  # the first steps warm up
    times = [b["t1"] - a["t1"] for a, b in zip(rows, rows[1:])]
    return {"exit": code, "step_s": _median(times), "steps_timed": len(times),
            "step_s_min": min(times) if times else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", default="kill,add,steady")
    p.add_argument("--impls", default="netreduce,horovod")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--warm", type=int, default=5)
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--steady-steps", type=int, default=24)
    p.add_argument("--json", default=os.path.join(HERE, "results", "elastic.json"))
    args = p.parse_args()
    scenarios = args.scenarios.split(",")
    impls = args.impls.split(",")
    record = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(args), "runs": []}

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(record, f, indent=1)

    with Testbed(hosts=2, rate=args.rate, name="nrel", subnet="10.79.7.0/24", replace=True) as tb, \
            SshHosts(tb) as ssh:
        for node in tb.hosts:  # horovodrun's ranks reach its driver at the root's eth0
            subprocess.run(["ip", "-n", node.netns, "route", "add", "default", "via",
                            tb.plan.bridge_address], check=True)
        switch = tb.spawn_switch(port=4791, args=["--require-secret"])
        env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", NETREDUCE_TIMEOUT="30")
        for k in ("NETREDUCE_SWITCH", "NETREDUCE_JOB_SECRET", "NETREDUCE_JOB"):
            env.pop(k, None)
        env["NETREDUCE_SWITCH"] = f"{switch.address[0]}:{switch.address[1]}"
        try:
            for run in range(args.runs):
                for scenario in scenarios:
                    variants = ([("netreduce", "static", 1), ("netreduce", "elastic", 1),
                                 ("netreduce", "elastic", 10)] if scenario == "steady"
                                else [(impl, None, 1) for impl in impls])
                    for impl, mode, commit in variants:
                        out = tempfile.mkdtemp(prefix="nr-elastic.")
                        load = os.getloadavg()[0]
                        env_run = dict(env, ELASTIC_OUT=out, ELASTIC_IMPL=impl)
                        t0 = time.time()
                        try:
                            if scenario == "kill":
                                res = run_kill(tb, ssh, impl, env_run, out, args.warm, args.steps)
                            elif scenario == "add":
                                res = run_add(tb, ssh, impl, env_run, out, args.warm, args.steps)
                            else:
                                res = run_steady(tb, ssh, mode, env_run, out, args.steady_steps,
                                                 commit)
                        except RuntimeError as exc:
                            res = {"error": str(exc)[-3000:]}
                        res.update(scenario=scenario, impl=impl, mode=mode, commit=commit, run=run,
                                   load=load, wall_s=time.time() - t0,
                                   model=next((r.get("model") for r in _records(out)
                                               if "model" in r), None))
                        record["runs"].append(res)
                        save()
                        print(json.dumps(res), flush=True)
                        shutil.rmtree(out, ignore_errors=True)
        finally:
            switch.stop()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
