"""The 3 replicas' reconciler passes over a run, by what woke them (from kept logs), and their summed pass time."""
import re, sys
from pathlib import Path
LINE = re.compile(r"fathom\.reconciler: pass \d+ \(([^)]*)\): ([\d.]+) ms")
for run in sys.argv[1:]:
    count, ms = {}, 0.0
    for log in sorted(Path(run).glob("controller*.passes.log")):
        for m in LINE.finditer(log.read_text(errors="replace")):
            count[m[1]] = count.get(m[1], 0) + 1
            ms += float(m[2])
    top = ", ".join(f"{k} {v}" for k, v in sorted(count.items(), key=lambda kv: -kv[1])[:6])
    print(f"{Path(run).name}: {sum(count.values())} passes, {ms/1000:.1f} s; {top}")
