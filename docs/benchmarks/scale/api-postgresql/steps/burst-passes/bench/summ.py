"""The API bench's control-plane CPU ms a creation by configuration (python summ.py DIR...: each DIR/results.json)."""
import json, sys, os
for d in sys.argv[1:]:
    r = json.load(open(os.path.join(d, "results.json")))
    out = []
    for a in r["api"]:
        s = a["schedstat_ms_per_port"]
        rec = s.get("controller other threads", 0)
        out.append(f"{a['api_workers']}w {'one' if a['shared_network'] else 'each'}: {a['ports_per_second']:.0f}/s cp {a['control_plane_cpu_ms_per_port']:.2f} "
                   f"(loop {s.get('controller event loop', 0):.2f} other {rec:.2f} workers {s.get('api workers', 0):.2f} pg {s.get('postgresql backends', 0):.2f})")
    print(f"{os.path.basename(d.rstrip('/'))} {r['environment']['date_utc']}:\n  " + "\n  ".join(out))
