"""commit_parts.py TRACE RUN...: where the commit of each port creation's store write goes, for the one controller
and the cluster's master of each run of ../run.sh (its logs gzipped), their last 60 creations, from the followers
hook's marks and the bpftrace lines of ./pg.bt (TRACE, gzipped; both on the host's monotonic clock). The creation's
backend is the one whose WAL flush ended last in the commit (from SQLAlchemy's "commit" event to the write's end).
Medians in ms, JSON on stdout:
  to_commit         the "commit" event → the backend's commit starts (PreCommit_Notify; no notification: its flush)
  notify_lock       the notification queue's lock taken in PreCommit_Notify (its wait, when other commits hold it)
  flush             the commit's WAL flush
  lock_sleep        heavyweight and lightweight lock sleeps in the commit (ProcSleep, PGSemaphoreLock)
  end_to_ready      ProcArrayEndTransaction's end → ReadyForQuery (the commit's rest: AtCommit_Notify signals
                    every listening backend)
  at_commit_notify  AtCommit_Notify alone
  ready_to_end      ReadyForQuery → the write's end in the API's thread (the answer's way back, the thread's wake)
  commit_to_end     the whole: the "commit" event → the write's end
with the hook's "committed" marks (runs after 19:05 UTC), besides:
  ready_to_committed  ReadyForQuery → the Session's "after_commit" (the driver has the answer)
  committed_to_end    "after_commit" → the write's end (the Session's close, the request id, the reconciler's wake)
  commit_cpu          the API thread's CPU from the "commit" event to "after_commit"
  after_commit_cpu    its CPU from "after_commit" to the write's end"""
import bisect
import collections
import gzip
import json
import statistics
import sys
from pathlib import Path

events = collections.defaultdict(list)      # name -> [(start s, end s, pid)], by start
for line in gzip.open(sys.argv[1], "rt"):
    parts = line.split()
    if len(parts) == 4 and parts[1].isdigit():
        start = int(parts[2]) / 1e9
        events[parts[0]].append((start, start + int(parts[3]) / 1e9, int(parts[1])))
starts = {}
for name, found in events.items():
    found.sort()
    starts[name] = [e[0] for e in found]


def within(name, a, b, pid=None):
    """`name`'s calls that overlap [a, b] (of backend `pid`)."""
    found, i = events.get(name, []), bisect.bisect_left(starts.get(name, []), a - 0.01)
    return [e for e in found[i:] if e[0] <= b and e[1] >= a and (pid is None or e[2] == pid)] if found else []


def took(found):
    return sum(e[1] - e[0] for e in found)


out = {}
for run in sys.argv[2:]:
    for log in sorted(Path(run, "log").glob("*.log.gz")):
        lines = [json.loads(x) for x in gzip.decompress(log.read_bytes()).decode().splitlines()]
        creations = [x for x in lines[1:] if "req" in x and None not in x["req"] and x.get("w", {}).get("commit_at")]
        if len(creations) < 30:
            continue
        parts = collections.defaultdict(list)
        for x in creations[-60:]:
            a, b = x["w"]["commit_at"], x["req"][1]
            flushes = [e for e in within("XLogFlush", a, b) if e[1] <= b and e[1] - e[0] > 20e-6]
            if not flushes:
                continue
            flush = max(flushes, key=lambda e: e[1])
            pid = flush[2]
            ended = within("ProcArrayEndTransaction", flush[1], b, pid)
            end = ended[0][1] if ended else flush[1]
            pre = within("PreCommit_Notify", a, end, pid)
            ready = within("ReadyForQuery", end, b, pid)
            parts["to_commit"].append((pre[0][0] if pre else flush[0]) - a)
            parts["notify_lock"].append(took(within("LockSharedObject", a, end, pid)) if pre else None)
            parts["flush"].append(flush[1] - flush[0])
            parts["lock_sleep"].append(took(within("ProcSleep", a, end, pid) + within("PGSemaphoreLock", a, end, pid)))
            parts["end_to_ready"].append(ready[0][0] - end if ready else None)
            parts["at_commit_notify"].append(took(within("AtCommit_Notify", end, b, pid)))
            parts["ready_to_end"].append(b - ready[0][0] if ready else None)
            parts["commit_to_end"].append(b - a)
            w = x["w"]
            if w.get("committed"):      # the hook's later marks: the Session's "after_commit", thread CPU
                parts["ready_to_committed"].append(w["committed"] - ready[0][0] if ready else None)
                parts["committed_to_end"].append(b - w["committed"])
                parts["commit_cpu"].append(w["committed_cpu"] - w["commit_cpu"])
                parts["after_commit_cpu"].append(w["cpu"] - w["committed_cpu"])
        who = "cluster master" if "--cluster" in lines[0]["argv"] else "one controller"
        out[f"{Path(run).name} {who}"] = {
            "creations": len(parts["flush"]),
            **{k: round(statistics.median([v for v in vs if v is not None]) * 1000, 3) for k, vs in parts.items()}}
json.dump(out, sys.stdout, indent=1)
print()
