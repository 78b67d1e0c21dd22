"""spawn() to the ready line of netreduce-switch, N times, from the current tree; and the
daemons' CPU (user+sys, from spawn to its exit right after ready). median (min-max)."""
import os
import resource
import statistics
import sys
import time

from netreduce.switch.child import spawn


def fmt(v):
    return f"{statistics.median(v) * 1000:.0f} ({min(v) * 1000:.0f}-{max(v) * 1000:.0f})"


def main(n):
    ts, cs = [], []
    l0 = os.getloadavg()[0]
    for _ in range(n):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        s = spawn()
        ts.append(time.perf_counter() - t0)
        s.stop()
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cs.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    print(f"{os.path.basename(os.getcwd()):10s} n={n} wall {fmt(ts)} ms  cpu {fmt(cs)} ms  "
          f"load {l0:.2f}-{os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
