"""sched_summary.py TIDS TIMEHIST: from `perf sched timehist`, each group of TIDS' threads (a controller's,
a lab's PostgreSQL sessions): how many times they were switched in, their scheduling delay (from being
woken to running: mean, p50, p90, ms) and their run time (ms), as JSON."""
import json, re, statistics, sys
from collections import defaultdict

group = {int(t): g for t, g in (line.split() for line in open(sys.argv[1]) if line.strip())}
delays, run = defaultdict(list), defaultdict(float)
row = re.compile(r"\s*[\d.]+\s+\[\d+\]\s+.*?\[(\d+)(?:/\d+)?\]\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
for line in open(sys.argv[2]):
    m = row.match(line)
    if m and int(m[1]) in group:
        g = group[int(m[1])]
        delays[g].append(float(m[3]))
        run[g] += float(m[4])
print(json.dumps({g: {"switched_in": len(d), "delay_ms": {"mean": round(statistics.mean(d), 4),
                                                           "p50": round(statistics.median(d), 4),
                                                           "p90": round(sorted(d)[int(0.9 * len(d))], 4)},
                      "run_ms": round(run[g], 1)} for g, d in sorted(delays.items())}, indent=1))
