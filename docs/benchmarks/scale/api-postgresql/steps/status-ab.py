"""A/B of fathom.store.status.write_statuses on PostgreSQL, ports' statuses only: A one UPDATE a row
(executemany, as the store writes them), B one UPDATE of them all (their values as arrays, unnest);
BATCH statuses a transaction, blocks of 100 transactions alternating, 6 rounds: this thread's CPU and
PostgreSQL's backends' schedstat a status. Run from the repository: python status-ab.py [BATCH]"""
import ipaddress, os, sys, time; sys.path.insert(0, ".")
from sqlalchemy.orm import Session
from fathom.bench.postgres import PostgresServer
from fathom.store.db import open_store
from fathom.store import ops, status
from fathom.store.changes import TableChanges
pg = PostgresServer(durable=True).start()
engine = open_store(pg.new_database()); TableChanges(engine)
c = ops.Caller()
with Session(engine) as s, s.begin():
    net = ops.create_network(s, c, ops.Settings(), name="n", type="vxlan").id
    ops.create_subnet(s, c, network_id=net, cidr=ipaddress.IPv4Network("10.0.0.0/16"))
ids = []
for i in range(2000):
    with Session(engine) as s, s.begin():
        new = ops.new_port(s, c, network_id=net, name=f"p{i}", claim_at_insert=True)
        ids.append(ops.insert_port(s, new, [])[0])

def new_fn(session, statuses, node_states={}):
    session.execute(status.text(f"SET LOCAL lock_timeout = '{int(status.STATUS_LOCK_WAIT * 1000)}ms'"))
    session.connection().execute(UNNEST, {"rows": [i for _, i in statuses],
                                          "statuses": [st for st, _ in statuses.values()],
                                          "reasons": [reason for _, reason in statuses.values()]})


UNNEST = (status.text("UPDATE ports SET status = v.status, status_reason = v.reason FROM unnest("
                      "CAST(:rows AS integer[]), CAST(:statuses AS varchar[]), CAST(:reasons AS varchar[])) "
                      "AS v(id, status, reason) WHERE ports.id = v.id AND (ports.status IS DISTINCT FROM v.status "
                      "OR ports.status_reason IS DISTINCT FROM v.reason)")
          .execution_options(model_unchanged=True))


def old_fn(session, statuses, node_states={}):
    if session.get_bind().dialect.name == "postgresql":
        session.execute(status.text(f"SET LOCAL lock_timeout = '{int(status.STATUS_LOCK_WAIT * 1000)}ms'"))
    by_kind = {}
    for (kind, object_id), value in statuses.items():
        by_kind.setdefault(kind, {})[object_id] = value
    for kind, values in by_kind.items():
        session.connection().execute(status._status_update(status.MODELS[kind].__table__),
            [{"row": i, "new_status": st, "new_reason": reason} for i, (st, reason) in values.items()])
def ns_of(pid):
    try: return sum(int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0]) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError: return 0
def backends(): return [int(p) for p in os.popen(f"pgrep -P {pg.pid()}").read().split()]
BATCH = int(sys.argv[1]) if len(sys.argv) > 1 else 12
flip = 0
def one(fn, k):
    global flip
    flip += 1
    batch = ids[(k * BATCH) % 1980:][:BATCH]
    with Session(engine) as s, s.begin():
        fn(s, {("port", i): ("active" if flip % 2 else "pending", None) for i in batch})
res = {"A": [0, 0, 0], "B": [0, 0, 0]}
for r in range(6):
    for name, fn in (("A", old_fn), ("B", new_fn)):
        b = backends(); b0 = {p: ns_of(p) for p in b}; t0 = time.thread_time_ns()
        for k in range(100): one(fn, k)
        res[name][0] += time.thread_time_ns() - t0; res[name][1] += sum(ns_of(p) - b0[p] for p in b); res[name][2] += 100 * BATCH
for name, (cli, srv, n) in res.items():
    print(f"{name}: client {cli/n/1e3:.1f} us  PG {srv/n/1e3:.1f} us  per status ({n}, {BATCH} a pass)")
engine.dispose(); pg.stop()
