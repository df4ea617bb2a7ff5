"""Median step times of the 20 timed ports' passes (the last 20 API-woken passes that changed all 100
switches) in each side's passes.log: python3 docs/benchmarks/scale/hostlocal-kept/steps.py"""
import re
import statistics
from pathlib import Path

HERE = Path(__file__).parent
for side in ("before", "after"):
    rows = [line for line in (HERE / side / "passes.log").read_text().splitlines()
            if "(api)" in line and "100 switches changed" in line][-20:]
    steps: dict[str, list[float]] = {}
    for line in rows:
        steps.setdefault("pass", []).append(float(re.search(r": ([\d.]+) ms", line).group(1)))
        for k, v in re.findall(r"(\w+) ([\d.]+)", line.split("changed;")[1]):
            steps.setdefault(k, []).append(float(v))
    print(side, {k: round(statistics.median(v), 1) for k, v in steps.items()})
    print("  agents step, each pass:", [round(x) for x in steps["agents"]])
