"""pooled.py RUN...: `fathom bench ovn-compare --replicas N` runs taken as one: the mean of their → `active` p50 ratios
(the cluster over one controller) with a 95 % stratified bootstrap interval (2,000 resamples, each run's ports resampled
within it, seeded: the same figures every time), and the p99 ratio of all their ports pooled, with its interval; JSON
on stdout."""
import json
import random
import statistics
import sys

from ratio_ci import ports, quantile


def ratios(sides):
    p50 = statistics.mean(statistics.median(b) / statistics.median(a) for a, b in sides)
    p99 = quantile([x for _, b in sides for x in b], 0.99) / quantile([x for a, _ in sides for x in a], 0.99)
    return p50, p99


runs = [json.load(open(f"{d}/results.json")) for d in sys.argv[1:]]
sides = [(ports(r, "fathom-1"), ports(r, "fathom-3")) for r in runs]
rng = random.Random(1)
boots = [ratios([(rng.choices(a, k=len(a)), rng.choices(b, k=len(b))) for a, b in sides]) for _ in range(2000)]
p50s, p99s = sorted(x[0] for x in boots), sorted(x[1] for x in boots)
p50, p99 = ratios(sides)
json.dump({"runs": len(runs), "ports a side": sum(len(a) for a, _ in sides),
           "p50 ratio, mean of runs": round(p50, 3), "p50 95%": [round(p50s[50], 3), round(p50s[1949], 3)],
           "p99 ratio, pooled": round(p99, 3), "p99 95%": [round(p99s[50], 3), round(p99s[1949], 3)]},
          sys.stdout, indent=1)
print()
