"""CPU-s (user+sys) and wall of a child command, N times, the trees alternated:
lazy_cpu_of.py N TREE1 TREE2 -- cmd..."""
import os
import resource
import statistics
import subprocess
import sys
import time


def fmt(v):
    return f"{statistics.median(v) * 1000:.0f} ({min(v) * 1000:.0f}-{max(v) * 1000:.0f})"


def main():
    n = int(sys.argv[1])
    i = sys.argv.index("--")
    trees, cmd = sys.argv[2:i], sys.argv[i + 1:]
    res = {t: ([], []) for t in trees}
    l0 = os.getloadavg()[0]
    for k in range(n):
        for t in (trees if k % 2 == 0 else trees[::-1]):
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            w0 = time.perf_counter()
            subprocess.run(cmd, cwd=t, check=True, stdout=subprocess.DEVNULL)
            w = time.perf_counter() - w0
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            res[t][0].append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
            res[t][1].append(w)
    for t in trees:
        print(f"{os.path.basename(t):10s} cpu {fmt(res[t][0])} ms wall {fmt(res[t][1])} ms  n={n} "
              f"load {l0:.2f}-{os.getloadavg()[0]:.2f}  {' '.join(cmd)[-60:]}")


if __name__ == "__main__":
    main()
