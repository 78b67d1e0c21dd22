"""CPU one ssh connection costs on the testbed (what netreduce-run pays once per
remote host since 28a6afa, once per rank before): a 1-host testbed with its sshd
(netreduce/testbed/sshd.py), `ssh h0 true` and netreduce-run's keeper connection (the
loader, the keeper's source, "end" at once), each run --runs times:

    sudo python benchmarks/ssh_connection_cpu.py --runs 10 \\
        --json benchmarks/results/issue33/ssh_connection_cpu.json

client CPU: the ssh client and the test's wrappers (unshare, sh), from RUSAGE_CHILDREN;
server CPU: what sshd's reaped children used (its session, the login shell with its
~/.bashrc, the command), from sshd's cutime+cstime in /proc. Medians, with the load."""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _reaped_cpu_s(pids) -> float:
    from benchmarks.common import proc_stat
    stats = [proc_stat.read(pid) for pid in pids]
    return sum(s.cutime + s.cstime for s in stats) / proc_stat.TICKS


def main() -> None:
    from benchmarks.common import command_line, machine_description, utc_now
    from netreduce.launcher import host_connection as hc
    from netreduce.testbed import Testbed
    from netreduce.testbed.sshd import SshHosts

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--json", default="")
    args = p.parse_args()
    records, summary = [], {}
    with Testbed(hosts=1, name="nrcc", subnet="10.79.7.0/24", replace=True) as tb, \
            SshHosts(tb) as ssh:
        env = ssh.client_env(dict(os.environ))
        sshd = [proc.pid for proc in ssh.procs.values()]
        source = hc._keeper_source()
        variants = {
            "ssh true": (["ssh", "h0", "true"], b""),
            "ssh keeper": (hc.ssh_argv("h0", hc.SshOptions(), hc.keeper_command(sys.executable)),
                           str(len(source)).encode() + b"\n" + source + b"end\n"),
        }
        for run in range(args.runs):
            for name, (argv, stdin) in variants.items():
                load = os.getloadavg()[0]
                r0, s0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), _reaped_cpu_s(sshd), time.time()
                subprocess.run(ssh.client_argv(argv), env=env, input=stdin, capture_output=True,
                               check=True, timeout=60)
                t1, r1, s1 = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN), _reaped_cpu_s(sshd)
                records.append({"variant": name, "run": run, "load1": load, "wall_s": t1 - t0,
                                "client_cpu_s": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime,
                                "server_cpu_s": s1 - s0})
    for name in variants:
        rows = [r for r in records if r["variant"] == name]
        summary[name] = {k: statistics.median(r[k] for r in rows)
                         for k in ("wall_s", "client_cpu_s", "server_cpu_s")}
        print(f"{name:11s} " + "  ".join(f"{k} {v:.3f}" for k, v in summary[name].items())
              + f"  (median of {len(rows)}, load {min(r['load1'] for r in rows):.1f}-"
              f"{max(r['load1'] for r in rows):.1f})")
    if args.json:
        meta = {"benchmark": "ssh_connection_cpu", "when": utc_now(), "command": command_line(),
                "machine": machine_description(), "summary": summary}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
