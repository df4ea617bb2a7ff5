"""summarize.py OUT: each run of run.sh under OUT, as JSON on stdout: the bench's → `active` p50 / p99
(one controller, 3 replicas, ratio) and, per controller, the medians (ms) of each step of its port
creations' path, wall and the request thread's CPU, over its last 60 (the measured ports)."""
import json, statistics, sys
from pathlib import Path

STEPS = {   # name: (from mark, to mark)
    "to the thread": ("entry", "hop"), "checks (reads)": ("checks_in", "checks_out"),
    "insert": ("insert_in", "insert_out"), "request id": ("key_in", "key_out"),
    "notification and commit": ("key_out", "commit_out"), "wake": ("wake_in", "wake_out"),
    "write": ("write_in", "write_out"), "answered": ("entry", "answered")}


def steps(records):
    out = {}
    for step, (a, b) in STEPS.items():
        wall, cpu = [], []
        for r in records:
            w, c = {"entry": 0.0, **dict(r["wall"])}, dict(r["cpu"])
            if a in w and b in w:
                wall.append(w[b] - w[a])
                if a in c:
                    cpu.append(c[b] - c[a])
        out[step] = {"wall": round(statistics.median(wall), 3) if wall else None,
                     "cpu": round(statistics.median(cpu), 3) if cpu else None}
    return out


def run(d: Path):
    res = json.loads((d / "results.json").read_text())
    up = {k: v["plug_first"]["up_ms"] for k, v in res["port_up"].items()}
    doc = {"active_ms": {k: {"p50": round(v["p50"], 1), "p99": round(v["p99"], 1)} for k, v in up.items()},
           "elapsed_s": round(res["elapsed_s"]), "stdout": (d / "stdout.txt").read_text().strip().splitlines()[-1]}
    one, many = up["fathom-1"], up["fathom-3"]
    doc["ratio"] = {"p50": round(many["p50"] / one["p50"], 3), "p99": round(many["p99"] / one["p99"], 3)}
    for log in sorted((d / "write-path").glob("*.log")):
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        records = [x for x in lines[1:] if "wall" in x]
        if len(records) >= 60:
            doc["fathom-3" if "--cluster" in lines[0]["argv"] else "fathom-1"] = steps(records[-60:])
    return doc


print(json.dumps({d.name: run(d) for d in sorted(Path(sys.argv[1]).iterdir()) if (d / "results.json").exists()},
                 indent=1))
