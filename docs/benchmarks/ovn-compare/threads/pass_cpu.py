"""A pass's CPU per step, by what woke it, from a controller log written with pass-cpu.diff applied
(threads.py --log): passes that changed no switch apart. Prints a JSON line per kind of pass."""
import json
import re
import sys
from collections import Counter, defaultdict

kinds: dict[str, Counter] = defaultdict(Counter)
count: Counter = Counter()
woke: dict[int, str] = {}
for line in open(sys.argv[1]):
    m = re.search(r"pass (\d+) \(([^)]*)\): [\d.]+ ms, (\d+) switches changed", line)
    if m:
        woke[int(m.group(1))] = m.group(2) + (", no switch changed" if m.group(3) == "0" else "")
        continue
    m = re.search(r"pass (\d+) cpu: (.*)", line)
    if m and int(m.group(1)) in woke:
        kind = woke[int(m.group(1))]
        count[kind] += 1
        for step, ms in re.findall(r"(\w+)=([\d.]+)", m.group(2)):
            kinds[kind][step] += float(ms)
for kind, n in count.most_common():
    steps = {k: round(v / n, 2) for k, v in kinds[kind].items()}
    print(json.dumps({"woken by": kind, "passes": n, "ms_cpu_per_pass": round(sum(steps.values()), 2), "steps": steps}))
