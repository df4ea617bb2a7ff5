"""Per run and medians: ports/s, p99, control-plane CPU ms a creation, and by thread group (the store
writes' worker threads, event loops, reconciler, change-feed listener, PostgreSQL).
Run in this directory: python summary.py"""
import glob, json, re, statistics

rows = {}
for path in sorted(glob.glob("r[123]-*-w[12]-*.json")):
    d = json.load(open(path))
    s = d["schedstat_ms_per_port"]

    def group(word):
        return sum(v for k, v in s.items() if word in k)
    r = rows[path[:-5]] = dict(pps=d["ports_per_second"], p99=d["per_call_ms"]["p99"],
                               cp=d["control_plane_cpu_ms_per_port"], store_write=group("AnyIO"),
                               loops=group("event loop"), reconciler=group("reconciler"),
                               feed=group("change-feed"), pg=group("postgresql"), errors=d["n_errors"])
    print(f"{path[:-5]:16s} {r['pps']:4.0f}/s p99 {r['p99']:5.1f} ms  control plane {r['cp']:.2f}  store writes "
          f"{r['store_write']:.2f}  event loops {r['loops']:.2f}  reconciler {r['reconciler']:.2f}  "
          f"feed {r['feed']:.2f}  PostgreSQL {r['pg']:.2f}  errors {r['errors']}")
print("medians (ms a creation but ports/s and p99):")
for key in sorted({re.sub(r"-\d+$", "", k) for k in rows}):
    runs = [v for k, v in rows.items() if re.sub(r"-\d+$", "", k) == key]
    print(f"{key:14s} " + "  ".join(f"{f} {statistics.median(r[f] for r in runs):.2f}"
                                     for f in ("pps", "p99", "cp", "store_write", "loops", "reconciler", "pg")))
