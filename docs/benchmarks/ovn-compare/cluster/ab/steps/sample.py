"""Sample the schedstat run time (ns) of every thread of the PREFIX labs' controllers (the
environment's PREFIX, default a6: /run/fathom/a6{1,3}/controller*.pid) and of the PostgreSQL processes of the bench's own server
(the postmaster whose data directory is /tmp/fathom-pg-*: its children; a backend is put to a lab
by its database, fathom_test_1 the lab of one controller, fathom_test_2 the cluster's), every
0.2 s, one JSON line a sample. Usage: sample.py OUT.jsonl (until killed)."""
import glob
import json
import os
import sys
import time

PREFIX = os.environ.get("PREFIX", "a6")
LABS = {"fathom_test_1": PREFIX + "1", "fathom_test_2": PREFIX + "3"}


def threads(pid: int) -> dict:
    out = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            comm = open(task + "/comm").read().strip()
            out[comm + ":" + os.path.basename(task)] = int(open(task + "/schedstat").read().split()[0])
        except (OSError, ValueError):
            pass
    return out


def main(path: str) -> None:
    out = open(path, "w")
    while True:
        rec = {"t": time.time(), "ctrl": {}, "pg": {}}
        for lab in LABS.values():
            for f in glob.glob(f"/run/fathom/{lab}/controller*.pid"):
                try:
                    rec["ctrl"][f"{lab}/{os.path.basename(f)[:-4]}"] = threads(int(open(f).read()))
                except (OSError, ValueError):
                    pass
        procs, posts = {}, set()
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                pid = int(stat.split("/")[2])
                ppid = int(open(stat).read().rsplit(")", 1)[1].split()[1])
                cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
            except (OSError, ValueError, IndexError):
                continue
            procs[pid] = (ppid, cmd)
            if "postgres" in cmd and "-D /tmp/fathom-pg-" in cmd:
                posts.add(pid)
        for pid, (ppid, cmd) in procs.items():
            if ppid in posts:
                words = cmd.split()
                lab = LABS.get(words[2] if len(words) > 2 else "", "aux")
                try:
                    rec["pg"][f"{lab}:{pid}"] = int(open(f"/proc/{pid}/schedstat").read().split()[0])
                except (OSError, ValueError):
                    pass
        out.write(json.dumps(rec) + "\n")
        out.flush()
        time.sleep(0.2)


if __name__ == "__main__":
    main(sys.argv[1])
