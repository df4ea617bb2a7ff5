"""A pass's read of the ports it was told of (fathom.store.snapshot._port_rows by id), alone: a
store of PORTS ports in one network filled as `fathom bench scale --part api` does, then blocks of
BLOCK reads of PER random ports each, alternating A (SQLAlchemy's expanding IN, its execution and
result layers) and B (one prepared statement with the ids as an array, on psycopg's cursor),
ROUNDS rounds. Prints this thread's CPU and the PostgreSQL backend's (schedstat) a read.
Args: PORTS PER BLOCK ROUNDS; run from outside the repository with PYTHONPATH=<tree>."""
import json, os, random, sys, time
from pathlib import Path

import fathom.bench.postgres as _pgmod
_pgmod.PREFIX = "fathom-pg-u9-"
from fathom.bench.postgres import PostgresServer
from fathom.bench.scale import api as api_bench
from fathom.bench.scale.common import Controller
from fathom.store import snapshot as sn
from fathom.store.db import make_engine, run_prepared
from sqlalchemy.orm import Session

PORTS, PER, BLOCK, ROUNDS = (int(a) for a in sys.argv[1:5])
pg = PostgresServer(durable=True).start()
url = pg.new_database()
ctl = Controller(Path(f"/run/fathom-bench/u9-read-{os.getpid()}"), url).start()
try:
    api_bench.api_rate(ctl, 8, PORTS, True, lambda *a: None)
finally:
    ctl.stop()
try:
    engine = make_engine(url)
    ways = {"A": lambda conn, ids: sn._joined(conn.execute(sn._ports_by_id(), {"ids": ids})),
            "B": lambda conn, ids: sn._joined(map(sn._ByIdRow._make, run_prepared(conn, sn._ports_by_id_sql(), {"ids": ids})))}
    rng = random.Random(1)
    out = {"A": [], "B": []}
    with Session(engine) as session:
        conn = session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
        ids_all = [r[0] for r in conn.exec_driver_sql("SELECT id FROM ports")]
        backend = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        stat = Path(f"/proc/{backend}/schedstat")
        for way in ways.values():      # warm: the statements prepared and cached
            for _ in range(10):
                way(conn, rng.sample(ids_all, PER))
        for _ in range(ROUNDS):
            for name, way in ways.items():
                reads = [rng.sample(ids_all, PER) for _ in range(BLOCK)]
                c0, s0 = time.thread_time(), int(stat.read_text().split()[0])
                for ids in reads:
                    got = way(conn, ids)
                c1, s1 = time.thread_time(), int(stat.read_text().split()[0])
                assert len(got[2]) == PER
                out[name].append(((c1 - c0) * 1000 / BLOCK, (s1 - s0) / 1e6 / BLOCK))
    print(json.dumps({"ports": PORTS, "ids_a_read": PER, "block": BLOCK, "rounds": ROUNDS,
                      "client_ms_a_read": {k: [round(c, 3) for c, _ in v] for k, v in out.items()},
                      "postgresql_ms_a_read": {k: [round(p, 3) for _, p in v] for k, v in out.items()}}))
finally:
    pg.stop()
