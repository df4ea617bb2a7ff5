"""One API-rate run (PostgreSQL, 8 writers) with per-part schedstat; optionally py-spy on the controller.
Args: OUT PORTS API_WORKERS [spy]"""
import json, os, subprocess, sys, time
from pathlib import Path
from fathom.bench.postgres import PostgresServer
from fathom.bench.scale.common import Controller
from fathom.bench.scale.api import api_rate

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
ports = int(sys.argv[2]); workers = int(sys.argv[3]); spy = len(sys.argv) > 4
pg = PostgresServer(durable=True).start()
if os.environ.get("PGSTAT"):
    pg.halt(); pg._options += " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"; pg.resume()
url = pg.new_database()
ctl = Controller(Path("/run/fathom-bench/c4-prof"), url, api_workers=workers).start()
try:
    sp = None
    if spy:
        sp = subprocess.Popen([sys.executable.replace("python", "py-spy"), "record", "--pid", str(ctl.proc.pid), "-r", "200",
                               "-f", "raw", "-o", str(out / "spy.txt"), "--nonblocking", "--threads", "--gil"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2)
    r = api_rate(ctl, 8, ports, True, print, store_pid=pg.pid())
    if sp:
        sp.send_signal(2); sp.wait(60)
    (out / "r.json").write_text(json.dumps(r, indent=1))
    print(json.dumps({k: r[k] for k in ("ports_per_second", "cpu_ms_per_port", "control_plane_cpu_ms_per_port",
                                        "schedstat_ms_per_port", "schedstat_threads_born", "schedstat_threads_ended", "n_errors")}, indent=1))
    if os.environ.get("PGSTAT"):
        import psycopg
        with psycopg.connect(host=str(pg.socket_dir), port=5432, user="postgres", dbname=url.split("@/")[1].split("?")[0], autocommit=True) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            rows = c.execute("SELECT calls, round(total_exec_time::numeric,1), round(total_plan_time::numeric,1), query FROM pg_stat_statements WHERE query !~* '^ *(CREATE|ALTER|COMMENT)' ORDER BY calls DESC").fetchall()
            with open(out / "pgstat.txt", "w") as f:
                for r_ in rows: f.write(f"{r_[0]:8d} {r_[1]:>10} {r_[2]:>8} {' '.join(r_[3].split())[:250]}\n")
finally:
    ctl.stop(); pg.stop()
