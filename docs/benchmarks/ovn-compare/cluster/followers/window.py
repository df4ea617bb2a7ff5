"""window.py OUT: for each run of run.sh under OUT, its logs gzipped (JSON on stdout): the bench's → `active` p50 (one controller,
3 replicas, ratio) and, over the last 60 port creations of each (the measured ones), medians in ms from the call's
arrival at the API: its store write's end, the event loop's resumption after it, the answer, and the start of the
pass it woke (its own trigger `api`), for the single controller and for the cluster's master; and what each
other replica ran in the 60 ms after each creation's arrival (the master's pass and the port's → `active`): per
kind of work (sitecustomize.py), its mean time per creation (ms) and how many creations it overlapped."""
import bisect, gzip, json, statistics, sys
from pathlib import Path


def med(v):
    return round(statistics.median(v), 3) if v else None


def logs(d: Path):
    out = []
    for log in sorted((d / "log").glob("*.log.gz")):
        lines = [json.loads(x) for x in gzip.decompress(log.read_bytes()).decode().splitlines()]
        out.append({"cluster": "--cluster" in lines[0]["argv"],
                    "reqs": [x["req"] for x in lines[1:] if "req" in x and None not in x["req"]],
                    "acts": [x for x in lines[1:] if "act" in x]})
    return out


def path(p):
    reqs = p["reqs"][-60:]
    passes = sorted(a["t"][0] for a in p["acts"] if a["act"] == "pass" and "api" in (a["what"]["triggers"] or []))
    starts = []
    for r in reqs:
        i = bisect.bisect(passes, r[1] - 0.002)
        if i < len(passes):
            starts.append(passes[i] - r[0])
    ms = lambda v: med([x * 1000 for x in v])
    return {"write end": ms([r[1] - r[0] for r in reqs]), "loop resumed": ms([r[2] - r[0] for r in reqs]),
            "answered": ms([r[3] - r[0] for r in reqs]), "pass start": ms(starts)}


def followers(master, others, window=0.06):
    entries = [r[0] for r in master["reqs"][-60:]]
    out = {}
    for i, p in enumerate(others):
        kinds = {}
        for a in p["acts"]:
            s, e = a["t"]
            if a["act"] == "http" and e - s > 1.0:     # long-polls: waiting, not working
                continue
            j = bisect.bisect(entries, e) - 1
            if j < 0:
                continue
            o = min(e, entries[j] + window) - max(s, entries[j])
            if o > 0:
                k = kinds.setdefault(a["act"] if a["act"] != "http" else "http " + a["what"], [0.0, 0])
                k[0] += o * 1000 / len(entries)
                k[1] += 1
        out[f"other {i + 1}"] = {k: {"ms": round(v[0], 3), "creations": v[1]} for k, v in sorted(kinds.items())}
    return out


def run(d: Path):
    res = json.loads((d / "results.json").read_text())
    up = {k: v["plug_first"]["up_ms"] for k, v in res["port_up"].items()}
    one, many = up["fathom-1"]["p50"], up["fathom-3"]["p50"]
    doc = {"active p50 ms": {"one": round(one, 1), "3 replicas": round(many, 1), "ratio": round(many / one, 3)},
           "stdout": (d / "stdout.txt").read_text().strip().splitlines()[-1]}
    ps = logs(d)
    single = next(p for p in ps if not p["cluster"])
    master = max((p for p in ps if p["cluster"]), key=lambda p: len(p["reqs"]))
    doc["one controller"], doc["master"] = path(single), path(master)
    doc["the others, 60 ms after each creation"] = followers(master, [p for p in ps if p["cluster"] and p is not master])
    return doc


print(json.dumps({d.name: run(d) for d in sorted(Path(sys.argv[1]).iterdir()) if (d / "results.json").exists()},
                 indent=1))
