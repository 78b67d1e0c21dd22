"""Summary of lazy_ab.txt: per file, pytest's "in N s" and the whole process's wall,
base and branch, median (min-max) over pairs, and branch - base per pair."""
import collections
import re
import statistics
import sys

LINE = re.compile(r"(\S+) pair=(\d+) arm=(\w+) wall=([\d.]+) load=([\d.]+)-([\d.]+) "
                  r"starts=(\d+) daemons=(\d+) \| (.*) in ([\d.]+)s")


def f3(v):
    return f"{statistics.median(v):.1f} ({min(v):.1f}–{max(v):.1f})"


def s3(v):
    return f"{statistics.median(v):+.1f} ({min(v):+.1f} – {max(v):+.1f})"


def main(path):
    runs = collections.defaultdict(dict)
    for line in open(path):
        m = LINE.match(line)
        if m:
            f, p, arm, wall, l0, l1, starts, daemons, res, t = m.groups()
            runs[(f, int(p))][arm] = (float(t), float(wall), float(l0), float(l1), int(starts),
                                      int(daemons), "failed" in res)
    for f in dict.fromkeys(k[0] for k in runs):
        pairs = [runs[k] for k in sorted(runs) if k[0] == f and len(runs[k]) == 2]
        base = [p["base"] for p in pairs]
        br = [p["branch"] for p in pairs]
        loads = [x for p in pairs for a in p.values() for x in a[2:4]]
        fails = sum(a[6] for p in pairs for a in p.values())
        print(f"| `{f}` | {len(pairs)} | {min(loads):.1f}–{max(loads):.1f} | {br[0][4]} ({br[0][5]}) | "
              f"{f3([b[0] for b in base])} | {f3([b[0] for b in br])} | "
              f"**{s3([b[0] - a[0] for a, b in zip(base, br)])}** | "
              f"{s3([b[1] - a[1] for a, b in zip(base, br)])} | {fails} |")


if __name__ == "__main__":
    main(sys.argv[1])
