"""The table of this directory's bench runs (main-N.json, branch-N.json): per API processes and
networks, each run's control-plane CPU ms a creation and its schedstat split, then the means.
    python summary.py > summary.txt"""
import glob, json, os, statistics
from collections import defaultdict

here = os.path.dirname(os.path.abspath(__file__))
PARTS = ("controller event loop", "controller other threads", "api workers", "postgresql backends")
runs = defaultdict(list)
print("run       workers networks  ports/s  control-plane  event-loop  other-threads  api-workers  pg-backends")
for path in sorted(glob.glob(os.path.join(here, "*-[0-9].json"))):
    name = os.path.basename(path)[:-5]
    for a in json.load(open(path))["api"]:
        s = a["schedstat_ms_per_port"]
        key = (a["api_workers"], "one" if a["shared_network"] else "each", name.split("-")[0])
        row = [a["control_plane_cpu_ms_per_port"], *(s.get(p, 0.0) for p in PARTS)]
        runs[key].append(row)
        print(f"{name:9s} {a['api_workers']:7d} {key[1]:8s} {a['ports_per_second']:8.0f} "
              + "  ".join(f"{v:12.3f}" for v in row))
print("\nmeans (runs)")
for key in sorted(runs):
    cols = list(zip(*runs[key]))
    print(f"{key[2]:7s} {key[0]} workers, {key[1]:4s} network(s): " + " ".join(f"{statistics.mean(c):.3f}" for c in cols)
          + f"  ({len(runs[key])})   [control-plane, event loop, other threads, api workers, pg backends]")
