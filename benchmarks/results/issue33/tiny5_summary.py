# ruff: noqa
# tiny5 (12-07): the tables of BENCHMARKS.md "... (tiny5)" from its records (run from this folder).
import json, statistics as st, glob, re, sys
def med(v): return f"{st.median(v):.3f} ({min(v):.3f}–{max(v):.3f})" if max(v) < 10 else f"{st.median(v):.1f} ({min(v):.1f}–{max(v):.1f})"
print("control_plane step, paired (before = main, agreement = tiny5):")
for f in sorted(glob.glob("tiny5_ab_n*_*.json")):
    d = json.load(open(f)); r, c = d["results"], d["cpu_us"]
    b, a, dp = r["auto cycle=1 before"], r["auto cycle=1 agreement"], r["auto cycle=1 dataplane"]
    cb, ca = c["auto cycle=1 before"], c["auto cycle=1 agreement"]
    tr = [x / y for x, y in zip(a, b)]; cr = [x / y for x, y in zip(ca, cb)]
    print(f"{f}: load {d['load']} | ms main {med(b)} tiny5 {med(a)} dp {st.median(dp):.3f} | ratio {med(tr)} lower {sum(x<1 for x in tr)}/{len(tr)}"
          f" | CPU us main {med(cb)} tiny5 {med(ca)} ratio {med(cr)} lower {sum(x<1 for x in cr)}/{len(cr)}")
print("issue33 latency (the target's command), alternated:")
for t in ("tiny5_base", "tiny5"):
    for f in sorted(glob.glob(f"tiny5_latency_{t}_[0-9].json")):
        d = json.load(open(f))
        s = d.get("summary", d)
        out = []
        for k in ("np4", "np2"):
            for cell, v in s[k].items():
                m = v["median"] if isinstance(v, dict) and "median" in v else v
                out.append(f"{k} {cell.replace('auto cycle=1 ','')} {m if not isinstance(m,float) else round(m,4)}")
        print(f, "; ".join(out))
print("probe (tiny4_probe.py), per rank per call: wall us of the slowest, CPU us (mean of ranks, all threads), vol/invol switches (caller thread + executor)")
cur = None; rows = []
for line in open("tiny5_ab.log"):
    m = re.match(r"== probe N=(\d)", line)
    if m: n = m[1]
    m = re.match(r"-- round (\d) (\S+) load ([\d.]+)", line)
    if m: cur = dict(n=n, round=m[1], tree=m[2], load=m[3], us=[], cpu=[], vol=0.0, inv=0.0, ex=[]); rows.append(cur); continue
    if line.startswith("=="): cur = None
    if cur is None: continue
    m = re.match(r"rank \d+ ([\d.]+) us/call, cpu ([\d.]+)", line)
    if m: cur["us"].append(float(m[1])); cur["cpu"].append(float(m[2])); cur["k"] = 0; continue
    m = re.search(r"cpu\s+([\d.]+)\s+vol ([\d.]+)\s+invol ([\d.]+)", line)
    if m:
        cur["vol"] += float(m[2]); cur["inv"] += float(m[3])
        if cur["k"] == 1: cur["ex"].append(float(m[1]))
        cur["k"] += 1
for n in ("4", "2"):
    for t in ("tiny5_base", "tiny5"):
        rs = [r for r in rows if r["n"] == n and r["tree"] == t]
        if not rs: continue
        k = len(rs[0]["cpu"])
        print(f"N={n} {t}: " + " | ".join(f"r{r['round']} load {r['load']}: {max(r['us']):.0f} us, CPU {st.mean(r['cpu']):.1f} (executor {st.mean(r['ex']) if r['ex'] else 0:.1f}), vol {r['vol']/k:.2f} invol {r['inv']/k:.2f}" for r in rs))
        print(f"   CPU median {med([st.mean(r['cpu']) for r in rs])}, wall median {med([max(r['us']) for r in rs])}")
