"""Measurement only (docs/benchmarks/ovn-compare/cluster/prepared, ports-200/to-master*): `fathom bench
ovn-compare --replicas 3 --stop-others` with its stop left out, so every call goes to the master of c1's
br-int while the other replicas run on; with `--prefix tn`, their threads at nice 19 (set every 0.5 s,
so threads started later too); with `--prefix tp`, their PostgreSQL sessions too (the server processes
whose application_name names them: fathom.store.db.connect_args); with `--prefix ti`, their threads (not their
PostgreSQL sessions) under SCHED_IDLE instead: they run only on a core nothing else wants; with `--prefix tq`, their
pools' PostgreSQL sessions too (`fathom controller <id>`; not their change feed's or lease rounds'); with `--prefix tf`,
their threads and every PostgreSQL session of theirs, the change feed's and lease rounds' too. Run as the
fathom CLI: `python to_master.py bench ovn-compare ...`. The runs' summary.md keeps the bench's own sentence that the other
replicas were stopped: here they were not. LOCK_WAITS=1: PostgreSQL logs each lock wait of 1 ms or more,
its log kept as server.log beside the results, and what the master's pool sessions wait on while active is
sampled every 5 ms (SAMPLE_MS; waits.json beside the results); STOP_OTHERS=1: the others stopped, as the bench does."""
import collections
import json
import os
import shutil
import sys
import threading
import time

import psycopg
from sqlalchemy import create_engine

from fathom.bench import ovncompare
from fathom.cluster.feed import libpq_conninfo
from fathom.bench.postgres import PostgresServer


def keep_only(self, master, _stop=ovncompare.FathomSystem.keep_only):
    if os.environ.get("STOP_OTHERS"):     # the bench's own --stop-others, with this script's samples
        return _stop(self, master)
    self.callees, self.api = [master], self.apis[master]
    return []


def alone(self, s):
    master = s.note((0, None, "c1"))["master"]
    s.keep_only(master)
    replicas = s.lab.state()["controller"]["replicas"]
    ids = {r["id"]: r["address"].endswith(f":{replicas[master]['api_port']}") for r in s.api.get("/cluster")["replicas"]}
    master_id, others = next(i for i, m in ids.items() if m), [i for i, m in ids.items() if not m]
    conninfo = libpq_conninfo(create_engine(s.db))
    if os.environ.get("LOCK_WAITS"):     # PostgreSQL logs every lock wait of 1 ms or more (server.log in -o's directory)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET log_lock_waits = on")
            conn.execute("ALTER SYSTEM SET deadlock_timeout = '1ms'")
            conn.execute("ALTER SYSTEM SET log_line_prefix = '%m [%p] %a: '")
            conn.execute("SELECT pg_reload_conf()")

        def sample():     # what the master's pool sessions wait on while active, every SAMPLE_MS (5) ms
            seen, out = collections.Counter(), sys.argv[sys.argv.index("-o") + 1]
            with psycopg.connect(conninfo, autocommit=True) as conn:
                for n in range(10 ** 9):
                    for row in conn.execute("SELECT coalesce(wait_event_type, 'CPU'), coalesce(wait_event, '') "
                                            "FROM pg_stat_activity WHERE state = 'active' AND application_name = %s",
                                            (f"fathom controller {master_id}",)):
                        seen[" ".join(row)] += 1
                    if n % 200 == 0:
                        with open(f"{out}/waits.json", "w") as f:
                            json.dump(dict(seen.most_common()), f, indent=1)
                    time.sleep(float(os.environ.get("SAMPLE_MS", "5")) / 1000)
        threading.Thread(target=sample, daemon=True).start()
    idle = "ti" in sys.argv or "tq" in sys.argv or "tf" in sys.argv
    if "tn" in sys.argv or "tp" in sys.argv or idle:
        pids = [r["pid"] for i, r in enumerate(replicas) if i != master]
        print(f"niced replicas other than {master}: {pids} ({others})", file=sys.stderr, flush=True)

        def sessions():
            if "tp" not in sys.argv and "tq" not in sys.argv and "tf" not in sys.argv:
                return []
            kinds = ("fathom controller ",) if "tq" in sys.argv else ("fathom ",)
            with psycopg.connect(conninfo) as conn:
                return [pid for pid, name in conn.execute("SELECT pid, application_name FROM pg_stat_activity")
                        if name.startswith(kinds) and name.rsplit(" ", 1)[-1] in others]

        def renice():
            first = True
            while True:
                tids = [int(t) for pid in pids if os.path.exists(f"/proc/{pid}/task")
                        for t in os.listdir(f"/proc/{pid}/task")]
                backends = sessions()
                if first:
                    print(f"niced: {len(tids)} threads, {len(backends)} PostgreSQL sessions", file=sys.stderr, flush=True)
                    first = False
                for tid in tids + backends:
                    try:
                        if idle:
                            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                        else:
                            os.setpriority(os.PRIO_PROCESS, tid, 19)
                    except OSError:
                        pass
                time.sleep(0.5)
        threading.Thread(target=renice, daemon=True).start()
    return []


def stop_keeping_log(self, _stop=PostgresServer.stop):
    out = sys.argv[sys.argv.index("-o") + 1]
    if os.environ.get("LOCK_WAITS") and (self.base / "server.log").exists():
        shutil.copy(self.base / "server.log", f"{out}/server.log")
    _stop(self)


PostgresServer.stop = stop_keeping_log
ovncompare.FathomSystem.keep_only = keep_only
ovncompare.ClusterBench.alone = alone
from fathom.cli.main import cli  # noqa: E402
cli()
