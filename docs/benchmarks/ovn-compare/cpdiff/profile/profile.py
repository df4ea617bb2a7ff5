"""Where the fathom controller's CPU goes during batches of 50 port creations.

Brings up the fathom half of `fathom bench ovn-compare`'s lab (labs named <prefix>f), grows the tenant
twice by 50 ports exactly as the bench does (API call, then the VIF at once; CPU to all up and over a
20 s window), and records for each batch the controller's `/v1/health` before and after
(`pass_steps_total`: seconds per pass step; `switch_diffs`) and, with --spy, py-spy's samples of the
thread holding the GIL (50 Hz unless --rate, raw folded stacks). Run as root from a worktree:

    .venv/bin/python docs/benchmarks/ovn-compare/cpdiff/profile/profile.py OUT [--spy] [--rate HZ] [--prefix cpd]

writes OUT.json (and OUT-0.txt, OUT-1.txt with --spy); the lab is removed at the end.
"""
import json
import subprocess
import sys
from pathlib import Path

from fathom.bench.ovncompare import Bench

out = sys.argv[1]
prefix = sys.argv[sys.argv.index("--prefix") + 1] if "--prefix" in sys.argv else "cpd"
rate = sys.argv[sys.argv.index("--rate") + 1] if "--rate" in sys.argv else "50"
bench = Bench(prefix=prefix, repeats=1, ports=1, seconds=2, batch=50, window_s=20, rest_s=0,
              progress=lambda m: print(m, file=sys.stderr))
fathom = bench.systems[0]
bench.systems, bench.seq = [fathom], {fathom.name: 0}
try:
    fathom.up(bench.progress)
    pid = fathom.lab.state()["controller"]["pid"]
    doc = {}
    for k in range(2):
        before = fathom.api.get("/health")
        spy = None
        if "--spy" in sys.argv:
            spy = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "-p", str(pid),
                                    "-r", rate, "--gil", "-o", f"{out}-{k}.txt", "-f", "raw", "-d", "20",
                                    "--nonblocking"])
        grown = bench.grow(fathom, 50)
        if spy:
            spy.wait()
        doc[f"batch {k + 1}"] = {"grow": grown, "health_before": before, "health_after": fathom.api.get("/health")}
    Path(out + ".json").write_text(json.dumps(doc, indent=1, default=str))
finally:
    fathom.down()
