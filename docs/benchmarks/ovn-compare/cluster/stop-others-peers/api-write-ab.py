"""A port creation's API call in-process on PostgreSQL 15 (fathom.bench.postgres), one at a time: as one
controller's API (no change feed), as a replica's (every write notifies the feed: notify_commits)
with 3 other processes listening, and the same with the replica's own feed listener running
(feed.follow, as `fathom controller --cluster` runs it). 500 calls on a new database each, the
first 50 left out; the median call in ms (FastAPI's TestClient: its own overhead is in every mode
alike). Four rounds, the modes in turn. Run from the repository: .venv/bin/python THIS > api-write-ab.json"""
import json, sys, time, statistics, subprocess, os
sys.path.insert(0, "tests/unit"); sys.path.insert(0, ".")
from fastapi.testclient import TestClient
from fathom.api import create_app
from fathom.bench.postgres import PostgresServer
from fathom.cluster import feed
from auth import headers_for

LISTEN = r'''
import sys, psycopg
conn = psycopg.connect(sys.argv[1], autocommit=True)
conn.execute("LISTEN fathom_store"); conn.execute("LISTEN fathom_status")
for n in conn.notifies(): pass
'''

def run(server, mode, listeners, n=500):
    url = server.new_database(migrated=True)
    app = create_app(url)
    lis = None
    if mode.startswith("feed"):
        feed.notify_commits(app.state.engine, "me")
    if mode == "feed+own":
        lis = feed.follow(app.state.engine, "me", lambda w: None, lambda s, c: None)
    procs = [subprocess.Popen([sys.executable, "-c", LISTEN, feed.libpq_conninfo(app.state.engine)]) for _ in range(listeners)]
    time.sleep(0.5)
    c = TestClient(app, headers=headers_for(app))
    net = c.post("/v1/networks", json={"name": "b", "type": "vxlan"}).json()
    c.post("/v1/subnets", json={"network_id": net["id"], "cidr": "198.19.0.0/20", "name": "s"})
    lat = []
    for i in range(n):
        t = time.perf_counter()
        r = c.post("/v1/ports", json={"network_id": net["id"], "name": f"p{i}"})
        lat.append((time.perf_counter() - t) * 1000)
        assert r.status_code == 201, r.text
    for p in procs: p.kill()
    if lis: lis.stop()
    c.close(); app.state.engine.dispose()
    lat = lat[50:]
    return statistics.median(lat)

server = PostgresServer().start()
try:
    res = {}
    for rnd in range(4):
        for mode, l in (("single", 0), ("feed", 3), ("feed+own", 3)):
            res.setdefault((mode, l), []).append(run(server, mode, l))
    print(json.dumps({"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "calls": 500, "left_out": 50,
                      "median_call_ms": {f"{m}, {l} other listeners": [round(x, 3) for x in v] for (m, l), v in res.items()}},
                     indent=1))
finally:
    server.stop()
