"""citime 12-06: a summary of citime_timing_plugin.py's records (one JSON line per test).
python3 citime_analyze.py RECORD.jsonl [N]: tiers, the N slowest files, the most waiting tests."""
import collections
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1])]
W = sum(r["wall"] for r in rows)
C = sum(r["self"] + r["children"] for r in rows)
B = sum(r["busy"] for r in rows)
print(f"tests {len(rows)}  sum wall {W:.0f} s  suite CPU {C:.0f} s ({C / W:.2f} cores)  "
      f"machine busy {B:.0f} CPU-s ({B / W:.2f} of 2 cores)")
tiers = collections.OrderedDict()
for r in rows:
    x = tiers.setdefault("/".join(r["id"].split("/")[:2]), [0, 0, 0, 0])
    x[0] += r["wall"]
    x[1] += r["self"] + r["children"]
    x[2] += r["busy"]
    x[3] += 1
for t, (w, c, b, n) in tiers.items():
    print(f"  {t:18s} {n:4d} tests wall {w:6.0f} s  suite CPU {c:6.0f} ({c / max(w, 1e-9):.2f} cores)  "
          f"machine {b / max(w, 1e-9):.2f} cores")
files = collections.defaultdict(lambda: [0, 0])
for r in rows:
    f = files[r["id"].split("::")[0]]
    f[0] += r["wall"]
    f[1] += r["self"] + r["children"]
print("slowest files:")
for name, (w, c) in sorted(files.items(), key=lambda x: -x[1][0])[:int(sys.argv[2]) if len(sys.argv) > 2 else 20]:
    print(f"  {w:6.1f} s  CPU {c:6.1f}  {name}")
print("most waiting tests (wall - suite CPU, s):")
for r in sorted(rows, key=lambda r: -(r["wall"] - r["self"] - r["children"]))[:15]:
    print(f"  {r['wall'] - r['self'] - r['children']:5.1f} of {r['wall']:5.1f}  {r['id']}")
