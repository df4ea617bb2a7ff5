"""A/B, tried and dropped: a pass's port statuses written as today's executemany (A) or as one
UPDATE ... FROM unnest(ids, statuses, reasons) (B), K ports a pass; client and PostgreSQL CPU per
status. Run from the repository: python micro-statuses.py K ROUNDS"""
import ipaddress, os, sys, time
sys.path.insert(0, ".")
from sqlalchemy.orm import Session
from fathom.bench.postgres import PostgresServer
from fathom.store.db import open_store
from fathom.store import ops, status
from fathom.api.deps import Store
from fathom.store.ops import Caller, Settings
pg = PostgresServer(durable=True).start()
engine = open_store(pg.new_database()); c = Caller(); st = Store(engine, Settings(), None)
net = st.write(lambda s: ops.create_network(s, c, Settings(), name="n", type="vxlan").id)
st.write(lambda s: ops.create_subnet(s, c, network_id=net, cidr=ipaddress.IPv4Network("10.0.0.0/16")) and None)
ids = st.write(lambda s: [ops.create_port(s, c, network_id=net).id for _ in range(2000)])
K = int(sys.argv[1]); R = int(sys.argv[2])
from sqlalchemy import text
UNNEST = text("UPDATE ports AS t SET status = v.status, status_reason = v.reason FROM unnest("
              "CAST(:rows AS integer[]), CAST(:statuses AS varchar[]), CAST(:reasons AS varchar[])) "
              "AS v(id, status, reason) WHERE t.id = v.id "
              "AND (t.status IS DISTINCT FROM v.status OR t.status_reason IS DISTINCT FROM v.reason)"
              ).execution_options(model_unchanged=True)
def ns_of(pid):
    try: return sum(int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0]) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError: return 0
def backends(): return [int(p) for p in os.popen(f"pgrep -P {pg.pid()}").read().split()]
res = {"A": [0, 0, 0], "B": [0, 0, 0]}
flip = 0
for r in range(R):
    for v in ("A", "B"):
        b = backends(); b0 = {p: ns_of(p) for p in b}; t0 = time.thread_time_ns()
        for j in range(0, len(ids), K):
            flip += 1
            chunk = {("port", i): ("active" if flip % 2 else "pending", None) for i in ids[j:j + K]}
            with Session(engine) as s, s.begin():
                if v == "A":
                    s.execute(text("SET LOCAL lock_timeout = '2000ms'"))
                    s.connection().execute(status._status_update(status.MODELS["port"].__table__),
                        [{"row": i, "new_status": st_, "new_reason": reason} for (_, i), (st_, reason) in chunk.items()])
                else:
                    s.execute(text("SET LOCAL lock_timeout = '2000ms'"))
                    s.connection().execute(UNNEST, {"rows": [i for _, i in chunk],
                                                    "statuses": [v[0] for v in chunk.values()],
                                                    "reasons": [v[1] for v in chunk.values()]})
        res[v][0] += time.thread_time_ns() - t0; res[v][1] += sum(ns_of(p) - b0[p] for p in b); res[v][2] += len(ids)
for v, (cli, srv, n) in res.items():
    print(f"{v}: K={K} client {cli/n/1e6:.3f} ms  PG {srv/n/1e6:.3f} ms  per port status")
engine.dispose(); pg.stop()
