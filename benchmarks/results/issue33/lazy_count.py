"""Python starts of a suite run by kind, from lazy_sitecustomize.py's log
(S time pid ppid argv / E time pid seconds modules)."""
import ast
import collections
import gzip
import sys


def kind(argv, mods, exited):
    text = " ".join(argv[1:4])
    if "'netreduce.switch'" in repr(argv) or "netreduce.switch.daemon" in mods:
        return "daemon (python -m netreduce.switch)"
    if "tensorflow" in mods:
        return "rank/process importing tensorflow"
    if "torch" in mods and "pytest" not in mods:
        return "rank/process importing torch"
    if "pytest" in mods:
        return "pytest session (a launched rank's, or a test's)"
    if "netreduce.launcher" in text:
        return "netreduce-run (launcher)"
    if "netreduce.api" in mods or "netreduce.worker.communicator" in mods:
        return "numpy rank (netreduce.api, no framework)"
    if not exited:
        return "no exit line (killed)"
    return "other python (tools, helpers)"


def main(path):
    starts, exits = {}, {}
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as log:
        for line in log:
            p = line.split(" ", 4)
            if p[0] == "S":
                starts[int(p[2])] = ast.literal_eval(p[4])
            elif p[0] == "E":
                fields = line.split()
                exits[int(p[2])] = set(fields[4].split(",")) if len(fields) > 4 else set()
    counts = collections.Counter(kind(argv, exits.get(pid, set()), pid in exits)
                                 for pid, argv in starts.items())
    print("python starts:", len(starts))
    for k, v in counts.most_common():
        print(f"  {v:5d} {k}")


if __name__ == "__main__":
    main(sys.argv[1])
