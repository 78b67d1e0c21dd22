"""Launch time across hosts: seconds from starting the launcher to the first
completed all-reduce on every rank, for 4 ranks on 2 testbed hosts (h0:2,h1:2)
reached over ssh from the root namespace (netreduce/testbed/sshd.py).

    sudo PYTHONPATH=. python benchmarks/launch_hosts.py --runs 5 \\
        --json benchmarks/results/launch_hosts.json

Variants, run in rotation (round 1: every variant once, round 2: ..., so that a load
change hits all of them alike):

    netreduce-run numpy   netreduce-run -H h0:2,h1:2, `import netreduce`, nr.allreduce
    netreduce-run torch   the same with `import netreduce.torch as hvd`, a torch tensor
    horovodrun torch      horovodrun -H h0:2,h1:2 --gloo, horovod.torch (Horovod 0.28.1)
    mpirun mpi4py         mpirun -H h0:2,h1:2 over ssh, mpi4py's MPI Allreduce (Open MPI)
    mpirun netreduce      the same mpirun, ranks running the netreduce numpy program on
                          an aggregator started beforehand (not timed)

A variant with " @base" appended (e.g. "netreduce-run numpy @base") runs the same
command on the checkout at --baseline (its PYTHONPATH, its cwd; built in place): a
paired A/B of a launcher change, alternated with the others in every round; the
summary then gives each pair's difference (change - base).

Each rank records, on the machine's one clock, when its Python started, when init
finished and when its first 4-element all-reduce returned; a run's launch time is
the last rank's first all-reduce minus the launcher's start. horovodrun keeps its
ssh/NIC checks cached (~/.horovod) between runs unless --horovod-disable-cache.

Needs root, openssh-server, Open MPI + mpi4py, Horovod (scripts/env_horovod.sh)."""
from __future__ import annotations

import json
import os
import sys
import time


def _rank(kind: str, out: str) -> None:
    """One rank (this file run as a program): write its three times to OUT/<rank>.json."""
    t_python = time.time()
    if kind == "nr-numpy":
        import numpy as np
        import netreduce as nr
        nr.init()
        t_init = time.time()
        nr.allreduce(np.ones(4, np.float32), op=nr.Sum)
        rank = nr.rank()
    elif kind == "nr-torch":
        import torch
        import netreduce.torch as hvd
        hvd.init()
        t_init = time.time()
        hvd.allreduce(torch.ones(4), op=hvd.Sum)
        rank = hvd.rank()
    elif kind == "hvd-torch":
        import torch
        import horovod.torch as hvd
        hvd.init()
        t_init = time.time()
        hvd.allreduce(torch.ones(4), op=hvd.Sum)
        rank = hvd.rank()
    elif kind == "mpi4py":
        import numpy as np
        from mpi4py import MPI
        t_init = time.time()
        x = np.ones(4, np.float32)
        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, x)
        rank = MPI.COMM_WORLD.Get_rank()
    else:
        raise SystemExit(f"unknown rank kind {kind}")
    t_done = time.time()
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump({"python": t_python, "init": t_init, "done": t_done}, f)
    if kind.startswith("nr-"):
        (nr if kind == "nr-numpy" else hvd).shutdown()


def main() -> None:
    import argparse
    import shutil
    import statistics
    import subprocess
    import tempfile

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.common import command_line, machine_description, utc_now
    from netreduce.testbed import Testbed
    from netreduce.testbed.sshd import SshHosts

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--variants", default="netreduce-run numpy,netreduce-run torch,"
                   "horovodrun torch,mpirun mpi4py,mpirun netreduce")
    p.add_argument("--horovod-disable-cache", action="store_true")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--json", default="")
    p.add_argument("--baseline", default="", help="checkout the '@base' variants run")
    args = p.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]

    me = os.path.abspath(__file__)
    repo = os.path.dirname(os.path.dirname(me))
    subnet = "10.79.5.0/24"
    py = sys.executable
    records = []
    with Testbed(hosts=2, name="nrbl", subnet=subnet, replace=True) as tb, SshHosts(tb) as ssh:
        # horovodrun's ranks dial its rendezvous server at the driver's address on the
        # interface named by --network-interface (eth0: the root namespace's own eth0):
        # a default route through the bridge lets them reach it. Nothing else uses it.
        for node in tb.hosts:
            subprocess.run(["ip", "-n", node.netns, "route", "add", "default", "via",
                            tb.plan.bridge_address], check=True)
        base = dict(os.environ, PYTHONPATH=repo, OMP_NUM_THREADS="1",
                    OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        for k in ("NETREDUCE_SWITCH", "NETREDUCE_JOB_SECRET"):
            base.pop(k, None)
        env = ssh.client_env(base)
        hosts = ["-np", "4", "-H", "h0:2,h1:2"]
        mpi = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", *hosts,
               "--mca", "plm_rsh_agent", os.path.join(ssh.bin_dir, "ssh"),
               "--mca", "oob_tcp_if_include", subnet, "--mca", "btl", "tcp,self",
               "--mca", "btl_tcp_if_include", subnet, "-x", "PYTHONPATH", "-x", "PATH",
               "-x", "OMP_NUM_THREADS"]
        # The aggregator "mpirun netreduce" uses, started once, outside any timing.
        switch = tb.spawn_switch(port=4791, args=["--require-secret"], env=base)
        secret = "launch-bench-" + "ab" * 20
        commands = {
            "netreduce-run numpy": [py, "-m", "netreduce.launcher", *hosts, "-i", ssh.identity,
                                    py, me, "--rank", "nr-numpy"],
            "netreduce-run torch": [py, "-m", "netreduce.launcher", *hosts, "-i", ssh.identity,
                                    py, me, "--rank", "nr-torch"],
            "horovodrun torch": ["horovodrun", *hosts, "-i", ssh.identity, "--gloo",
                                 "--network-interface", "eth0"]
                                + (["--disable-cache"] if args.horovod_disable_cache else [])
                                + [py, me, "--rank", "hvd-torch"],
            "mpirun mpi4py": [*mpi, py, me, "--rank", "mpi4py"],
            "mpirun netreduce": [*mpi, "-x", "NETREDUCE_SWITCH", "-x", "NETREDUCE_JOB_SECRET",
                                 py, me, "--rank", "nr-numpy"],
        }
        extra_env = {"mpirun netreduce": {"NETREDUCE_SWITCH": f"{switch.address[0]}:4791",
                                          "NETREDUCE_JOB_SECRET": secret}}
        try:
            for run in range(args.runs):
                for variant in variants:
                    out = tempfile.mkdtemp(prefix="nr-launch.")
                    name, at_base = variant.removesuffix(" @base"), variant.endswith(" @base")
                    argv = ssh.client_argv(commands[name] + [out])
                    run_env = dict(env, **extra_env.get(name, {}))
                    if at_base:
                        run_env["PYTHONPATH"] = os.path.abspath(args.baseline)
                    load = os.getloadavg()[0]
                    t0 = time.time()
                    proc = subprocess.run(argv, env=run_env, capture_output=True, text=True,
                                          timeout=args.timeout,
                                          cwd=os.path.abspath(args.baseline) if at_base else repo)
                    t_exit = time.time()
                    ranks = []
                    for r in range(4):
                        try:
                            with open(os.path.join(out, f"{r}.json")) as f:
                                ranks.append(json.load(f))
                        except OSError:
                            pass
                    shutil.rmtree(out, ignore_errors=True)
                    ok = proc.returncode == 0 and len(ranks) == 4
                    rec = {"variant": variant, "run": run, "ok": ok, "load1": load,
                           "returncode": proc.returncode, "exit_s": t_exit - t0}
                    if ok:
                        rec.update(first_allreduce_s=max(x["done"] for x in ranks) - t0,
                                   python_started_s=max(x["python"] for x in ranks) - t0,
                                   init_done_s=max(x["init"] for x in ranks) - t0)
                    else:
                        rec["output"] = (proc.stdout + proc.stderr)[-3000:]
                    records.append(rec)
                    print(f"run {run} {variant:22s} " + (
                        f"first all-reduce {rec['first_allreduce_s']:.2f} s (pythons up "
                        f"{rec['python_started_s']:.2f}, init {rec['init_done_s']:.2f}, exit "
                        f"{rec['exit_s']:.2f}) load {load:.1f}" if ok else
                        f"FAILED rc={proc.returncode}: {rec['output'][-600:]}"), flush=True)
        finally:
            switch.stop()
    summary = {}
    for variant in variants:
        vals = sorted(r["first_allreduce_s"] for r in records if r["variant"] == variant and r["ok"])
        if vals:
            summary[variant] = {"median_s": statistics.median(vals), "min_s": vals[0],
                                "max_s": vals[-1], "runs": len(vals)}
            print(f"{variant:22s} median {statistics.median(vals):.2f} s  "
                  f"[{' '.join(f'{v:.2f}' for v in vals)}]")
    pairs = {}
    for variant in variants:  # "X @base" against "X", run by run: change - base
        base = variant + " @base"
        if base not in variants:
            continue
        for key in ("first_allreduce_s", "python_started_s"):
            at = {(r["variant"], r["run"]): r[key] for r in records if r["ok"]}
            d = sorted(at[(variant, i)] - at[(base, i)] for i in range(args.runs)
                       if (variant, i) in at and (base, i) in at)
            if d:
                pairs[f"{variant}: {key}"] = {"median_s": statistics.median(d), "min_s": d[0],
                                              "max_s": d[-1], "faster": sum(x < 0 for x in d),
                                              "pairs": len(d)}
                print(f"{variant} - @base, {key}: median {statistics.median(d):+.2f} s "
                      f"({d[0]:+.2f}..{d[-1]:+.2f}), faster in {sum(x < 0 for x in d)}/{len(d)}")
    if args.json:
        meta = {"benchmark": "launch_hosts", "when": utc_now(), "command": command_line(),
                "machine": machine_description(), "summary": summary, "paired": pairs}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "records": records}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--rank":
        _rank(sys.argv[2], sys.argv[3])
    else:
        main()
