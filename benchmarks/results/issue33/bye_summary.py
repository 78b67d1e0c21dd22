"""bye's A/B summary: per run the median of its 3 repeats (ms of the slowest rank per
4 KiB public-API all-reduce; CPU us of all ranks per all-reduce), per pair bye / main,
then median (min-max) over the pairs. Run in this folder; an argument: the set's TAG
(bye_ab.sh), e.g. q."""
import glob
import json
import re
import statistics as st
import sys

TAG = sys.argv[1] if len(sys.argv) > 1 else ""

def med(v): return st.median(v)
cells = [("np4", "auto cycle=1 agreement"), ("np2", "auto cycle=1 agreement"),
         ("np4", "auto cycle=1 dataplane"), ("np2", "auto cycle=1 dataplane")]
pairs = sorted({int(re.search(r"_(\d+)\.json", p).group(1)) for p in glob.glob(f"bye_latency_{TAG}bye_*_*.json")})
rows, ratios = [], {}
for i in pairs:
    try:
        a = json.load(open(f"bye_latency_{TAG}bye_base_{i}.json"))
        b = json.load(open(f"bye_latency_{TAG}bye_{i}.json"))
    except FileNotFoundError:
        continue
    line = [f"pair {i}"]
    for np_, cell in cells:
        short = np_ + (" agree" if "agreement" in cell else " dp")
        ta, tb = med(a["runs"][np_]["results"][cell]), med(b["runs"][np_]["results"][cell])
        ca, cb = med(a["runs"][np_]["cpu_us"][cell]), med(b["runs"][np_]["cpu_us"][cell])
        line.append(f"{short}: ms {ta:.3f}->{tb:.3f} cpu {ca:.0f}->{cb:.0f}")
        ratios.setdefault(short + " ms", []).append(tb / ta)
        ratios.setdefault(short + " cpu", []).append(cb / ca)
    la = [r for r in a["runs"]["np4"].get("load", [])]
    rows.append(" | ".join(line))
print("\n".join(rows))
for k, v in ratios.items():
    print(f"{k}: bye/main {med(v):.3f} ({min(v):.3f}-{max(v):.3f}), lower in {sum(x < 1 for x in v)} of {len(v)}")
