"""Per run made by run.sh: the reconciler thread's schedstat run time per port of the cluster's
replica that masters c1's br-int and of the two others, of the one controller, and each lab's
PostgreSQL backends per port, from 0.1 s before the first measured API call to 0.3 s after the
last (as rows.py). Usage: replicas.py RUN_DIR..."""
import collections
import gzip
import json
import os
import re
import sys


def per_port(d: str) -> dict:
    doc = json.load(open(f"{d}/results.json"))
    runs = [x for v in doc["port_up"].values() for x in v["plug_first"]["runs"]]
    t0, t1 = min(x["t_api"] for x in runs) - 0.1, max(x["t_api"] for x in runs) + 0.3
    n = len(runs) // 2
    path = f"{d}/sched.jsonl"
    lines = open(path) if os.path.exists(path) else gzip.open(path + ".gz", "rt")
    recs = [json.loads(line) for line in lines]
    a, b = (min(recs, key=lambda r: abs(r["t"] - t)) for t in (t0, t1))
    out = collections.Counter()
    for proc, threads in b["ctrl"].items():
        for t, v in threads.items():
            if t.split(":")[0] == "reconciler":
                out[proc] += (v - a["ctrl"].get(proc, {}).get(t, 0)) / 1e6 / n
    for key, v in b["pg"].items():
        out["pg/" + key.split(":")[0]] += (v - a["pg"].get(key, 0)) / 1e6 / n
    return out


def row(d: str) -> str:
    c = per_port(d)
    master = re.search(r"masters of c1's br-int during the run: replica (\d+)", open(f"{d}/summary.md").read())[1]
    name = "a73/controller" + ("" if master == "0" else f"-{master}")
    others = sorted(v for k, v in c.items() if k.startswith("a73/") and k != name)
    return (f"| {os.path.basename(d.rstrip('/'))} | {c['a71/controller']:.1f} | {c[name]:.1f} | "
            f"{' / '.join(f'{v:.1f}' for v in others)} | {c['pg/a71']:.1f}; {c['pg/a73']:.1f} |")


if __name__ == "__main__":
    print("| run | reconciler ms a port: one controller | the cluster's master of c1 | the two others | "
          "PostgreSQL ms a port: one; 3 |")
    print("|---|---|---|---|---|")
    for d in sys.argv[1:]:
        print(row(d))
