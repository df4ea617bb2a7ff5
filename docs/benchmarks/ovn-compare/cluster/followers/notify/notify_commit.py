"""notify_commit.py: how long a transaction that NOTIFYs takes to COMMIT with no other session LISTENing, with two
whose clients read their notifications, and with two whose client processes are stopped (SIGSTOP), in three rounds
of 1,500 commits each on one PostgreSQL the script starts (durable, fsync on); JSON on stdout."""
import json, os, signal, statistics, subprocess, sys, time
import psycopg
from fathom.bench.postgres import PostgresServer

LISTENER = r'''
import psycopg, select, sys
c = psycopg.connect(sys.argv[1], autocommit=True); c.execute("LISTEN fathom_store")
print("ready", flush=True)
while True:
    if select.select([c.pgconn.socket], [], [], 1.0)[0]:
        for n in c.notifies(timeout=0):
            pass
'''
pg = PostgresServer(durable=True).start()
try:
    conninfo = pg.new_database().replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo, autocommit=True) as c:
        c.execute("CREATE TABLE t (id serial primary key, v text)")
    payload = "x" * 300
    def run(n=1500):
        times = []
        with psycopg.connect(conninfo) as c:
            for i in range(n):
                c.execute("INSERT INTO t (v) VALUES ('a')")
                c.execute("SELECT pg_notify('fathom_store', %s)", (payload,))
                t0 = time.perf_counter(); c.commit(); times.append(time.perf_counter() - t0)
                time.sleep(0.002)
        times.sort()
        return {"p50_ms": round(statistics.median(times) * 1000, 3), "mean_ms": round(statistics.mean(times) * 1000, 3),
                "p90_ms": round(times[int(0.9 * len(times))] * 1000, 3)}
    out = {}
    for rnd in range(3):
        out.setdefault("none", []).append(run())
        ls = [subprocess.Popen([sys.executable, "-c", LISTENER, conninfo], stdout=subprocess.PIPE, text=True) for _ in range(2)]
        for p in ls: p.stdout.readline()
        out.setdefault("2 running", []).append(run())
        for p in ls: os.kill(p.pid, signal.SIGSTOP)
        out.setdefault("2 stopped", []).append(run())
        for p in ls: os.kill(p.pid, signal.SIGCONT); p.kill(); p.wait()
        time.sleep(0.5)
    print(json.dumps(out, indent=1))
finally:
    pg.stop()
