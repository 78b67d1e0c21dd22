"""ci4's per-pair summary of ci4_ab.sh's lines (pair, arm, ..., load from, load to, wall,
pytest's seconds, outcome): each pair's difference and the medians, per file given."""
import statistics as st
import sys


def spread(x):
    return f"{st.median(x):.1f} ({min(x):.1f}-{max(x):.1f})"


for path in sys.argv[1:]:
    pairs = {}
    with open(path) as f:
        for r in (line.split() for line in f if line.strip()):
            pairs.setdefault(r[0], {})[r[1]] = r
    print("==", path)
    d_ps, d_w, b, c, loads = [], [], [], [], []
    for i, p in sorted(pairs.items(), key=lambda x: int(x[0])):
        if "base" not in p or "ci4" not in p:
            continue
        B, C = p["base"], p["ci4"]
        bp, cp = float(B[6]), float(C[6])
        b.append(bp)
        c.append(cp)
        d_ps.append(cp - bp)
        d_w.append(float(C[5]) - float(B[5]))
        loads += [float(B[3]), float(B[4]), float(C[3]), float(C[4])]
        print(f"pair {i}: base {bp:.1f} s (load {B[3]}-{B[4]}, {B[2]}) {B[7]}  "
              f"ci4 {cp:.1f} s (load {C[3]}-{C[4]}, {C[2]}) {C[7]}  diff {cp - bp:+.1f}  "
              f"whole {d_w[-1]:+.1f}")
    print(f"median: base {spread(b)}  ci4 {spread(c)}  ci4-base {spread(d_ps)}  "
          f"whole-process {spread(d_w)}  load {min(loads):.1f}-{max(loads):.1f}")
