"""CPU a port by thread of a `fathom controller` during the API part of `fathom bench scale`
(docs/benchmarks/scale/api-postgresql/threads/README.md). Arguments: OUT API_PROCESSES PORTS one|each."""
import os, subprocess, sys, time, json
from pathlib import Path
from fathom.bench.postgres import PostgresServer
from fathom.bench.scale.common import Controller
from fathom.bench.scale.api import api_rate
from fathom.bench import procs

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
workers = int(sys.argv[2]) if len(sys.argv) > 2 else 1
ports = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
shared = (sys.argv[4] if len(sys.argv) > 4 else "one") == "one"
pg = PostgresServer(durable=True).start()
if os.environ.get("QC_PGSTAT"):
    pg.halt(); pg._options += " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"; pg.resume()
url = pg.new_database()
ctl = Controller(out / "run", url, api_workers=workers).start()
try:
    pids = [ctl.proc.pid, *procs.children(ctl.proc.pid)]
    spies = []
    if os.environ.get("QC_SPY", "1") == "1":
        for p in pids:
            spies.append(subprocess.Popen([sys.executable.replace("python", "py-spy"), "record", "--pid", str(p), "-r", "250",
                                           "-f", "raw", "-o", str(out / f"spy-{p}.txt"), "--nonblocking", *(["--gil"] if os.environ.get("QC_GIL") else [])],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(2)
    import re as _re
    def ns():
        d = {}
        for p in pids:
            for t in Path(f"/proc/{p}/task").iterdir():
                try: d[int(t.name)] = int((t / "schedstat").read_text().split()[0])
                except OSError: pass
        return d
    th0 = ns()
    r = api_rate(ctl, 8, ports, shared, print, store_pid=pg.pid())
    th1 = ns()
    names = {}
    for p in pids:
        dump = subprocess.run([sys.executable.replace("python", "py-spy"), "dump", "--pid", str(p)], capture_output=True, text=True).stdout
        for m in _re.finditer(r'Thread (\d+) \(\w+\): "([^"]*)"', dump):
            names[int(m.group(1))] = m.group(2)
    agg = {}
    for tid, v in th1.items():
        n = names.get(tid, "?")
        n = "AnyIO workers" if n.startswith("AnyIO") else n
        agg[n] = agg.get(n, 0) + v - th0.get(tid, 0)
    r["threads_ms_per_port"] = {k: v / 1e6 / r["ports"] for k, v in agg.items()}
    for k, v in sorted(agg.items(), key=lambda kv: -kv[1]):
        if v > 1e6: print(f"thread {k:28s} {v/1e6/r['ports']:6.2f} ms/port")
    for s in spies:
        s.send_signal(2)
    for s in spies:
        s.wait(60)
    print(json.dumps({k: r[k] for k in ("ports_per_second", "cpu_ms_per_port", "n_errors")}))
    (out / "r.json").write_text(json.dumps(r))
    if os.environ.get("QC_PGSTAT"):
        import psycopg
        with psycopg.connect(host=str(pg.socket_dir), port=5432, user="postgres", dbname=url.split("@/")[1].split("?")[0], autocommit=True) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            rows = c.execute("SELECT calls, round(total_exec_time::numeric,1), query FROM pg_stat_statements ORDER BY calls DESC LIMIT 40").fetchall()
            with open(out / "pgstat.txt", "w") as f:
                for r_ in rows: f.write(f"{r_[0]:8d} {r_[1]:>10} {' '.join(r_[2].split())[:220]}\n")
finally:
    ctl.stop()
    pg.stop()
