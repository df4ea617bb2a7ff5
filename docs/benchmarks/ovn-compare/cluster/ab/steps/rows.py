"""The rows of docs/benchmarks.md's table (Against a cluster) from runs made by run.sh:
rows.py RUN_DIR... (each with results.json and sched.jsonl or sched.jsonl.gz). The CPU column is
the schedstat run time of the lab's controllers and its PostgreSQL backends from 0.1 s before the
first measured API call to 0.3 s after the last (both labs' ports alternate: 60 ports a lab), per
port of that lab."""
import collections
import gzip
import json
import os
import sys

PREFIX = os.environ.get("PREFIX", "a6")   # the labs' prefix the runs were made with (run.sh)


def cpu(d: str, n: int) -> dict:
    doc = json.load(open(f"{d}/results.json"))
    runs = [x for v in doc["port_up"].values() for x in v["plug_first"]["runs"]]
    t0, t1 = min(x["t_api"] for x in runs) - 0.1, max(x["t_api"] for x in runs) + 0.3
    path = f"{d}/sched.jsonl"
    lines = open(path) if os.path.exists(path) else gzip.open(path + ".gz", "rt")
    recs = [json.loads(line) for line in lines]
    a, b = (min(recs, key=lambda r: abs(r["t"] - t)) for t in (t0, t1))
    out = collections.Counter()
    for proc, threads in b["ctrl"].items():
        out[proc.split("/")[0]] += sum(v - a["ctrl"].get(proc, {}).get(t, 0) for t, v in threads.items()) / 1e6 / n
    for key, v in b["pg"].items():
        out[key.split(":")[0]] += (v - a["pg"].get(key, 0)) / 1e6 / n
    return out


def row(d: str) -> str:
    doc = json.load(open(f"{d}/results.json"))
    one, many = (doc["port_up"][s]["plug_first"] for s in ("fathom-1", "fathom-3"))
    up = lambda c, q: c["up_ms"][q]          # noqa: E731
    echo = lambda c, q: c["echo_ms"][q]      # noqa: E731
    steps = lambda s: " / ".join(f"{doc['timeline'][s]['all'][k]:.1f}" for k in   # noqa: E731
                                 ("api_answered_ms", "read_ms", "make_ms", "statuses_ms"))
    c = cpu(d, one["up_ms"]["n"])
    env = doc["environment"]
    return (f"| {os.path.basename(d.rstrip('/'))} ({env['date_utc'][11:16]}, {env['loadavg_at_start'][0]:.1f}) "
            f"| {up(one, 'p50'):.0f} / {up(one, 'p99'):.0f}; {up(many, 'p50'):.0f} / {up(many, 'p99'):.0f} "
            f"| {up(many, 'p50') / up(one, 'p50'):.2f} / {up(many, 'p99') / up(one, 'p99'):.2f} "
            f"| {echo(many, 'p50') / echo(one, 'p50'):.2f} / {echo(many, 'p99') / echo(one, 'p99'):.2f} "
            f"| {steps('fathom-1')}; {steps('fathom-3')} | {c[PREFIX + '1']:.0f}; {c[PREFIX + '3']:.0f} ms |")


if __name__ == "__main__":
    for d in sys.argv[1:]:
        print(row(d))
