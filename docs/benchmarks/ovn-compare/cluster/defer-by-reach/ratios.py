"""Each run's ratios (3 replicas / one controller): → active p50, p99; → first echo p50, p99; and
the deferred passes the 3 replicas' logs count (when kept)."""
import json, sys, statistics
from pathlib import Path
rows = []
for run in sys.argv[1:]:
    d = json.loads((Path(run) / "results.json").read_text())
    one, three = (d["port_up"][s]["plug_first"] for s in ("fathom-1", "fathom-3"))
    r = lambda k, q: three[k][q] / one[k][q]
    load = d["environment"].get("machine_at_start", {}).get("loadavg") or d["environment"].get("loadavg")
    rows.append((Path(run).name, one["up_ms"]["p50"], three["up_ms"]["p50"], r("up_ms", "p50"), r("up_ms", "p99"),
                 r("echo_ms", "p50"), r("echo_ms", "p99")))
    print(f"| {rows[-1][0]} | {rows[-1][1]:.0f} / {one['up_ms']['p99']:.0f}; {rows[-1][2]:.0f} / {three['up_ms']['p99']:.0f} "
          f"| {rows[-1][3]:.2f} / {rows[-1][4]:.2f} | {rows[-1][5]:.2f} / {rows[-1][6]:.2f} |")
for prefix in ("main", "hint"):
    got = [x for x in rows if x[0].startswith(prefix)]
    if got:
        print(prefix, "median ratios: active p50 %.2f p99 %.2f; echo p50 %.2f p99 %.2f" %
              tuple(statistics.median(x[i] for x in got) for i in (3, 4, 5, 6)), f"({len(got)} runs)")
