"""table.py SUMMARY.json: the runs' figures as the README's markdown tables."""
import json, statistics, sys
runs = json.load(open(sys.argv[1]))
print("| run | → `active` p50 ms, one controller; 3 replicas | ratio p50 / p99 |")
print("|---|---|---|")
for name, r in runs.items():
    a = r["active_ms"]
    print(f"| {name} | {a['fathom-1']['p50']}; {a['fathom-3']['p50']} | {r['ratio']['p50']:.2f} / {r['ratio']['p99']:.2f} |")
print()
steps = list(next(iter(runs.values()))["fathom-1"])
print("| step (medians of the runs' medians, ms: wall / CPU) | " + " | ".join(
    f"{v}: one controller | {v}: 3 replicas" for v in ("base", "new")) + " |")
print("|---|" + "---|" * 4)
for step in steps:
    cells = []
    for v in ("base", "new"):
        for system in ("fathom-1", "fathom-3"):
            got = [r[system][step] for n, r in runs.items() if n.startswith(v) and system in r]
            wall = [g["wall"] for g in got if g["wall"] is not None]
            cpu = [g["cpu"] for g in got if g["cpu"] is not None]
            cells.append(f"{statistics.median(wall):.2f} / {statistics.median(cpu):.2f}" if wall and cpu else
                         f"{statistics.median(wall):.2f} / —" if wall else "—")
    print(f"| {step} | " + " | ".join(cells) + " |")
