"""citime2, 12-07: does `nice -n 19` in a session of its own yield to a nice-0 process
of another session? Two busy loops pinned to CPU 0 for 4 s, CPU-s each after 3.5 s
(/proc/PID/stat utime+stime). With the kernel's autogroups
(/proc/sys/kernel/sched_autogroup_enabled = 1) every session is a scheduling group,
and a task's nice counts only inside its group.
    python3 benchmarks/results/issue33/citime2_autogroup_probe.py"""
import os
import subprocess
import sys
import time

SPIN = [sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<4: pass"]


def cpu(p):
    with open(f"/proc/{p.pid}/stat") as f:
        x = f.read().rsplit(")", 1)[1].split()
    return (int(x[11]) + int(x[12])) / os.sysconf("SC_CLK_TCK")


def run(label, prefix, session, group_nice=None):
    a = subprocess.Popen(["taskset", "-c", "0"] + SPIN)
    b = subprocess.Popen(prefix + ["taskset", "-c", "0"] + SPIN, start_new_session=session)
    if group_nice is not None:
        with open(f"/proc/{b.pid}/autogroup", "w") as f:
            f.write(str(group_nice))
    time.sleep(3.5)
    ca, cb = cpu(a), cpu(b)
    a.wait()
    b.wait()
    print(f"{label:55s} nice-0 spinner {ca:.2f} CPU-s, background {cb:.2f} CPU-s")


with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
    print("sched_autogroup_enabled", f.read().strip(), "| kernel", os.uname().release,
          "| load", open("/proc/loadavg").read().split()[0])
run("nice -n 19, same session", ["nice", "-n", "19"], False)
run("nice -n 19, own session (main's tests/prebuild.py)", ["nice", "-n", "19"], True)
run("chrt --idle 0, own session", ["chrt", "--idle", "0"], True)
run("nice -n 19, own session, its group at nice 19 (branch)", ["nice", "-n", "19"], True, 19)
