"""One API-rate run (`fathom.bench.scale.api.api_rate`: 8 writers, one network, 1 API process) on a
PostgreSQL with pg_stat_statements (track=all: the foreign keys' checks too): every statement's
calls, executor ms in all, rows (OUT/pgstat.txt), the database's commits and rollbacks
(OUT/xact.txt), the run's result (OUT/r.json). LOGALL: log_statement=all, the log in OUT. Run from the tree:
    PYTHONPATH=. python pgstat.py OUT PORTS [LOGALL]"""
import json, os, sys, time
from pathlib import Path
import fathom.bench.postgres as _pgmod
if os.environ.get("PREFIX"):
    _pgmod.PREFIX = f"fathom-pg-{os.environ['PREFIX']}-"
from fathom.bench.postgres import PostgresServer
from fathom.bench.scale.common import Controller
from fathom.bench.scale.api import api_rate

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
ports = int(sys.argv[2])
pg = PostgresServer(durable=True).start()
pg.halt(); pg._options += " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
if len(sys.argv) > 3:
    pg._options += " -c log_statement=all -c log_min_duration_statement=-1"
pg.resume()
url = pg.new_database()
ctl = Controller(Path(f"/run/fathom-bench/{os.environ.get('PREFIX', 'w0')}-pgstat"), url, api_workers=1).start()
import psycopg
dbname = url.split("@/")[1].split("?")[0]
try:
    with psycopg.connect(host=str(pg.socket_dir), port=5432, user="postgres", dbname=dbname, autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); c.execute("SELECT pg_stat_statements_reset()")
    os.system(f"wc -l {pg.base}/server.log > {out}/log-start.txt")
    r = api_rate(ctl, 8, ports, True, print, store_pid=pg.pid())
    (out / "r.json").write_text(json.dumps(r, indent=1))
    print(json.dumps({k: r[k] for k in ("ports_per_second", "control_plane_cpu_ms_per_port", "schedstat_ms_per_port", "n_errors")}, indent=1))
    with psycopg.connect(host=str(pg.socket_dir), port=5432, user="postgres", dbname=dbname, autocommit=True) as c:
        rows = c.execute("SELECT calls, round(total_exec_time::numeric,1), round(total_plan_time::numeric,1), plans, rows, query FROM pg_stat_statements WHERE query !~* '^ *(CREATE|ALTER|COMMENT)' ORDER BY calls DESC").fetchall()
        with open(out / "pgstat.txt", "w") as f:
            f.write("   calls  exec_ms  plan_ms   plans    rows query\n")
            for r_ in rows: f.write(f"{r_[0]:8d} {r_[1]:>8} {r_[2]:>8} {r_[3]:7d} {r_[4]:7d} {' '.join(r_[5].split())[:400]}\n")
        x = c.execute("SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname=%s", (dbname,)).fetchone()
        (out / "xact.txt").write_text(f"commits {x[0]} rollbacks {x[1]}\n")
    if len(sys.argv) > 3:
        os.system(f"cp {pg.base}/server.log {out}/server.log")
finally:
    ctl.stop(); pg.stop()
