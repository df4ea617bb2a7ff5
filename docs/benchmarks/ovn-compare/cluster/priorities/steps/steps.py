# the 3 replicas minus one controller, step by step, for each run of ovn-compare --replicas 3 given: steps.py RUN...
import json, sys, pathlib, statistics as st
keys = ["api_answered_ms", "pass_start_ms", "pass_ms", "read_ms", "compile_ms", "make_ms", "revalidate_ms", "statuses_ms", "active_after_pass_ms"]
rows = {}
for d in sys.argv[1:]:
    p = pathlib.Path(d, "results.json")
    if not p.exists(): continue
    r = json.loads(p.read_text())
    t = r["timeline"]
    one, three = t["fathom-1"]["all"], t["fathom-3"]["all"]
    up1, up3 = r["port_up"]["fathom-1"]["plug_first"]["up_ms"]["p50"], r["port_up"]["fathom-3"]["plug_first"]["up_ms"]["p50"]
    diff = {k: three[k] - one[k] for k in keys}
    print(f"{pathlib.Path(d).name:4s} up {up1:5.1f} {up3:5.1f} d {up3-up1:+5.1f} | " + " ".join(f"{k[:-3].replace('_ms','')[:10]} {diff[k]:+.1f}" for k in keys))
    for k in keys: rows.setdefault(k, []).append(diff[k])
    rows.setdefault("up", []).append(up3 - up1)
print("median 3-1:", " ".join(f"{k[:12]} {st.median(v):+.2f}" for k, v in rows.items()))
