"""Medians of a port's pass and its steps over the 20 timed ports of scale bench runs: the last 20
`pass N (api)` lines of each run's controller log (its `passes.log` here).

    python3 docs/benchmarks/scale/views/steps.py docs/benchmarks/scale/views/scale/*/passes.log
"""
import re
import statistics
import sys

for path in sys.argv[1:]:
    steps: dict[str, list[float]] = {}
    for line in open(path):
        steps.setdefault("pass", []).append(float(re.search(r"\): ([\d.]+) ms", line).group(1)))
        for name, ms in re.findall(r"(\w+) ([\d.]+)(?:,|$)", line.split(";", 1)[1]):
            steps.setdefault(name, []).append(float(ms))
    print(path, ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in steps.items() if k != "wait"),
          f"(pass max {max(steps['pass']):.1f})")
