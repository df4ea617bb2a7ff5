# measurement only (docs/benchmarks/ovn-compare/cluster/prepared): in every `fathom controller` process,
# how often psycopg ran a statement prepared (YES), not (NO) or prepared it then (SHOULD), and each time it
# forgot a connection's prepared statements (a rollback: clear_True), with the fathom frames that did
# it; written every 2 s to $PREP_LOG/<pid>.json
import os, sys
if "controller" in " ".join(sys.argv) and os.environ.get("PREP_LOG"):
    import collections, json, threading, time, traceback
    import psycopg._preparing as preparing
    counts, where = collections.Counter(), collections.Counter()
    get, clear = preparing.PrepareManager.get, preparing.PrepareManager.clear

    def counted_get(self, query, prepare=None):
        decision = get(self, query, prepare)
        counts[decision[0].name] += 1
        return decision

    def counted_clear(self):
        cleared = clear(self)
        counts[f"clear_{cleared}"] += 1
        if cleared:
            frames = [f"{f.filename.split('/fathom/')[-1]}:{f.lineno}:{f.name}" for f in traceback.extract_stack()[:-1]
                      if "/fathom/" in f.filename and "site-packages" not in f.filename]
            where[" <- ".join(reversed(frames[-5:]))] += 1
        return cleared
    preparing.PrepareManager.get, preparing.PrepareManager.clear = counted_get, counted_clear

    def dump():
        while True:
            time.sleep(2)
            os.makedirs(os.environ["PREP_LOG"], exist_ok=True)
            with open(f"{os.environ['PREP_LOG']}/{os.getpid()}.json", "w") as f:
                json.dump({"argv": " ".join(sys.argv), "counts": counts, "where": where.most_common(12)}, f, indent=1)
    threading.Thread(target=dump, daemon=True).start()
