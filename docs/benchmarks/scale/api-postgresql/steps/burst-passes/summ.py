"""summary.txt from `STEPCPU=1 ../prof-threads.py` runs (python summ.py DIR: every DIR/*.json, a run's OUT/r.json): ports/s, the
control plane's CPU ms a creation (cp) and its parts (the reconciler's thread, the store writes'
threads, the event loop, PostgreSQL's backends), passes, a pass's thread CPU by step (ms), the mean
over passes of wait + wall (from a pass's first event to its end: what that event waited for its
statuses), and the API calls' p50 / p99 (ms)."""
import json, sys, glob, os, re
rows = []
for d in sorted(glob.glob(sys.argv[1] + "/*.json")):
    name = os.path.basename(d)[:-5]; r = json.load(open(d))
    s = r["schedstat_ms_per_port"]; st = r["pass_steps_wall_ms_per_port"]; n = r["ports"]; p = r["passes"]
    rec = sum(v for k, v in s.items() if k.endswith("reconciler"))
    write = sum(v for k, v in s.items() if "store write" in k)
    loop = sum(v for k, v in s.items() if "event loop" in k)
    pg = s.get("postgresql backends", 0)
    per_pass = lambda k: st.get(k, 0) * n / p
    cpu = sum(v for k, v in st.items() if k not in ("wait", "wall"))
    print(f"{name:8s} {r['ports_per_second']:4.0f}/s cp {r['control_plane_cpu_ms_per_port']:.3f} rec {rec:.3f} write {write:.3f} loop {loop:.3f} pg {pg:.3f} "
          f"passes {p:3d} pass cpu {cpu * n / p:.2f} (read {per_pass('read'):.2f} compile {per_pass('compile'):.2f} statuses {per_pass('statuses'):.2f}) "
          f"wait+wall {per_pass('wait') + per_pass('wall'):.1f} ms; call p50 {r['per_call_ms']['p50']:.1f} p99 {r['per_call_ms']['p99']:.1f}")
