"""Mean CPU per batch of 50 ports over DIR/{before,after}-N.json (threads.py): the control plane's
(as the bench reads it) and the controller's threads by role, told from `py-spy dump` (OUT.dump).
A thread that ended before the dump (an idle pool thread) counts as "ended"."""
import glob
import json
import re
import statistics
import sys

ROLES = (("reconciler", "reconciler (passes)"), ("MainThread", "API: event loop"),
         ("AnyIO worker thread", "API: worker threads"), ("Connection.run", "OVSDB replicas"),
         ("os_ken", "OpenFlow (os-ken)"), ("apply_", "bundles to other switches"))


def role(block: str) -> str:
    for mark, name in ROLES:
        if mark in block:
            return name
    return "other"


for side in ("before", "after"):
    rows: dict[str, list[float]] = {}
    for path in sorted(glob.glob(f"{sys.argv[1]}/{side}-*.json")):
        roles = {m.group(1): role(m.group(0))
                 for m in re.finditer(r"Thread (\d+) \(\w+\): \"[^\"]*\"\n(?:    .*\n?)*", open(path[:-5] + ".dump").read())}
        for batch in json.load(open(path)).values():
            total = {"control plane": batch["grow"]["cpu_s_to_all_up"]["control_plane"]["total"]}
            for tid, s in batch["threads_s"].items():
                name = roles.get(tid, "ended")
                total[name] = total.get(name, 0.0) + s
            for name in set(rows) | set(total):
                rows.setdefault(name, []).append(total.get(name, 0.0))
    if rows:
        print(f"{side} ({len(rows['control plane'])} batches):")
        for name, values in sorted(rows.items(), key=lambda kv: -statistics.mean(kv[1])):
            print(f"  {name:28} {statistics.mean(values):.3f} s  ({' '.join(f'{x:.2f}' for x in values)})")
