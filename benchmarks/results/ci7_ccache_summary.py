#!/usr/bin/env python3
"""One line per compile of a ccache log (CCACHE_LOGFILE): source, how it was found
(direct hit / preprocessed hit / compiled), and the counts. usage: ccache_summary.py LOG"""
import collections
import re
import sys

sources, results = {}, collections.defaultdict(list)
with open(sys.argv[1], errors="replace") as log:
    for line in log:
        m = re.match(r"\[\S+ (\d+)\s*\] (Source file|Result): (\S+)", line)
        if m and m.group(2) == "Source file":
            sources[m.group(1)] = m.group(3)
        elif m:
            results[m.group(1)].append(m.group(3))
how = {}
for pid, source in sources.items():
    r = results[pid]
    how[source] = ("direct hit" if "direct_cache_hit" in r else
                   "preprocessed hit" if "preprocessed_cache_hit" in r else
                   "compiled" if "cache_miss" in r else ",".join(r))
for source in sorted(how):
    print(f"{how[source]:17s} {source}")
print(dict(collections.Counter(how.values())))
