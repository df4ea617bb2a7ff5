"""A/B of a reconciler pass's statuses' write on PostgreSQL, port statuses only, as StatusWriter runs
it: A as main (a Session's transaction: set_config's statement, one UPDATE a row run as executemany
through SQLAlchemy, COMMIT), B the branch (fathom.store.status.write_statuses at once: one prepared
statement on psycopg's cursor, no BEGIN or COMMIT). BATCH statuses a write, blocks of 100 writes
alternating, ROUNDS rounds: this thread's CPU and PostgreSQL's backends' schedstat a write.
Run as PYTHONPATH=<branch tree> python status-once-ab.py [BATCH [ROUNDS]]"""
import ipaddress, os, sys, time
from sqlalchemy import text
from sqlalchemy.orm import Session
import fathom.bench.postgres as pgmod
from fathom.bench.postgres import PostgresServer
from fathom.store.db import AT_ONCE, open_store, session_factory
from fathom.store import ops, status
from fathom.store.changes import TableChanges
pgmod.PREFIX = f"fathom-pg-{os.environ.get('PREFIX', 'p0')}-"
pg = PostgresServer(durable=True).start()
engine = open_store(pg.new_database()); TableChanges(engine)
Sessions = session_factory(engine)
c = ops.Caller()
with Session(engine) as s, s.begin():
    net = ops.create_network(s, c, ops.Settings(), name="n", type="vxlan").id
    ops.create_subnet(s, c, network_id=net, cidr=ipaddress.IPv4Network("10.0.0.0/16"))
ids = []
for i in range(2000):
    with Session(engine) as s, s.begin():
        new = ops.new_port(s, c, network_id=net, name=f"p{i}", claim_at_insert=True)
        ids.append(ops.insert_port(s, new, [])[0])


def main_write(statuses):   # write_statuses as main runs it, in StatusWriter's transaction
    with Sessions() as session, session.begin():
        session.execute(text(f"SELECT set_config('lock_timeout', '{int(status.STATUS_LOCK_WAIT * 1000)}ms', true)"), {})
        by_kind = {}
        for (kind, object_id), value in statuses.items():
            by_kind.setdefault(kind, {})[object_id] = value
        for kind, values in by_kind.items():
            session.connection().execute(status._status_update(status.MODELS[kind].__table__),
                [{"row": i, "new_status": st, "new_reason": reason} for i, (st, reason) in values.items()])


def branch_write(statuses):   # as StatusWriter.write runs it on the branch
    with Sessions() as session, session.begin():
        if status.at_once_writes(statuses, {}):
            session.connection(execution_options=AT_ONCE)
        status.write_statuses(session, statuses, {}, ())


def ns_of(pid):
    try: return sum(int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0]) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError: return 0
def backends(): return [int(p) for p in os.popen(f"pgrep -P {pg.pid()}").read().split()]
BATCH = int(sys.argv[1]) if len(sys.argv) > 1 else 18
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 6
flip = 0
def one(fn, k):
    global flip
    flip += 1
    batch = ids[(k * BATCH) % (2000 - BATCH):][:BATCH]
    fn({("port", i): ("active" if flip % 2 else "error", None if flip % 2 else "switch gone") for i in batch})
res = {"A": [0, 0, 0], "B": [0, 0, 0]}
for r in range(ROUNDS):
    for name, fn in (("A", main_write), ("B", branch_write)) if r % 2 == 0 else (("B", branch_write), ("A", main_write)):
        b = backends(); b0 = {p: ns_of(p) for p in b}; t0 = time.thread_time_ns()
        for k in range(100): one(fn, k)
        res[name][0] += time.thread_time_ns() - t0; res[name][1] += sum(ns_of(p) - b0[p] for p in b); res[name][2] += 100
for name, (cli, srv, n) in res.items():
    print(f"{name}: client {cli/n/1e3:.0f} us  PostgreSQL {srv/n/1e3:.0f} us  a write of {BATCH} statuses ({n} writes)")
engine.dispose(); pg.stop()
