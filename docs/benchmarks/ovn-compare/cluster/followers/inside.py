"""inside.py RUN...: for each run of run.sh (its logs gzipped), the one controller's and the cluster master's port
creations (the last 60): medians in ms of the API's work before the store write (`pre`), from the write's start to its
first SQL statement (`to_sql`), the SQL statements' own time (`sql`), from the commit's start (SQLAlchemy's "commit"
event, before the change notification and the COMMIT) to the write's end (`commit_to_end`), the whole write, and the
writing thread's CPU in it; JSON on stdout."""
import gzip
import json
import statistics
import sys
from pathlib import Path


def med(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values) * 1000, 2) if values else None


out = {}
for run in sys.argv[1:]:
    for log in sorted(Path(run, "log").glob("*.log.gz")):
        lines = [json.loads(x) for x in gzip.decompress(log.read_bytes()).decode().splitlines()]
        reqs = [x for x in lines[1:] if "req" in x and None not in x["req"] and x.get("w", {}).get("write_in")][-60:]
        if len(reqs) < 30:
            continue
        w = [x["w"] for x in reqs]
        out[f"{Path(run).name} {'cluster master' if '--cluster' in lines[0]['argv'] else 'one controller'}"] = {
            "pre": med(m["write_in"] - x["req"][0] for m, x in zip(w, reqs)),
            "to_sql": med(m["first_sql"] - m["write_in"] if m.get("first_sql") else None for m in w),
            "sql": med(m["sql"] for m in w),
            "commit_to_end": med(x["req"][1] - m["commit_at"] if m.get("commit_at") else None for m, x in zip(w, reqs)),
            "write": med(x["req"][1] - m["write_in"] for m, x in zip(w, reqs)),
            "cpu": med(m["cpu"] for m in w), "creations": len(reqs)}
json.dump(out, sys.stdout, indent=1)
print()
