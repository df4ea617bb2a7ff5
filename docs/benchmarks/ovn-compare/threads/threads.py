"""The fathom controller's CPU per thread during batches of 50 port creations.

Brings up the fathom half of `fathom bench ovn-compare`'s lab (labs named <prefix>f), grows the tenant
twice by 50 ports as the bench does (API call, then the VIF at once), and records for each batch the
control plane's CPU to all up (as the bench reads it) and each controller thread's utime + stime
from /proc/<pid>/task; at the end `py-spy dump` names the threads (OUT.dump). Run as root from a
worktree, with py-spy installed beside the interpreter:

    .venv/bin/python docs/benchmarks/ovn-compare/threads/threads.py OUT [--prefix pt]
    python3 docs/benchmarks/ovn-compare/threads/summary.py DIR   # before-*/after-* pairs in DIR

writes OUT.json and OUT.dump (with --log also OUT.log, the controller's log: with the
instrumentation of pass-cpu.diff applied, each pass's CPU per step, which pass_cpu.py sums up); the
lab is removed at the end.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from fathom.bench.ovncompare import Bench

out = sys.argv[1]
prefix = sys.argv[sys.argv.index("--prefix") + 1] if "--prefix" in sys.argv else "pt"
bench = Bench(prefix=prefix, repeats=1, ports=1, seconds=2, batch=50, window_s=20, rest_s=0,
              progress=lambda m: print(m, file=sys.stderr))
fathom = bench.systems[0]
bench.systems, bench.seq = [fathom], {fathom.name: 0}
tick = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[int, float]:
    """thread id -> utime + stime in seconds"""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


try:
    fathom.up(bench.progress)
    pid = fathom.lab.state()["controller"]["pid"]
    doc = {}
    for k in range(2):
        before = thread_cpu(pid)
        grown = bench.grow(fathom, 50)
        after = thread_cpu(pid)
        doc[f"batch {k + 1}"] = {
            "grow": grown,
            "threads_s": {tid: round(s - before.get(tid, 0.0), 2) for tid, s in after.items() if s > before.get(tid, 0.0)}}
    dump = subprocess.run([str(Path(sys.executable).with_name("py-spy")), "dump", "-p", str(pid)],
                          capture_output=True, text=True, check=True).stdout
    Path(out + ".dump").write_text(dump)
    Path(out + ".json").write_text(json.dumps(doc, indent=1, default=str))
finally:
    if "--log" in sys.argv:
        shutil.copy(fathom.lab.dir / "controller.log", out + ".log")
    fathom.down()
