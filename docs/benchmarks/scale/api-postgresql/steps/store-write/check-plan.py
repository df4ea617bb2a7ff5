"""The check read's plan as a pooled connection keeps it: prepared on a store with BEFORE ports, run 7
times (PostgreSQL's plan cache makes its generic plan at the sixth), then AFTER more ports created
(no ANALYZE between: autovacuum's first comes a minute later), and EXPLAIN ANALYZE EXECUTE'd.
PREFIX (environment): PostgreSQL's directories are named fathom-pg-PREFIX-*. Run from the tree:
    PYTHONPATH=. python check-plan.py BEFORE AFTER"""
import ipaddress, os, sys, re
sys.path.insert(0, ".")
import fathom.bench.postgres as _pgmod
if os.environ.get("PREFIX"):
    _pgmod.PREFIX = f"fathom-pg-{os.environ['PREFIX']}-"
from fathom.bench.postgres import PostgresServer
from fathom.store.db import open_store
from fathom.store import ops
from fathom.store.changes import TableChanges
from fathom.api.deps import Store
from fathom.api import request_ids, schemas as sc
from fathom.store.ops import Caller, Settings
import fathom.api.ports as ports_mod
async def direct(fn, *a, **k): return fn(*a, **k)
ports_mod.in_thread = direct
pg = PostgresServer(durable=True).start()
c = Caller()
url = pg.new_database()
engine = open_store(url)
TableChanges(engine)
st = Store(engine, Settings(), None)
net = st.write(lambda s: ops.create_network(s, c, Settings(), name="n", type="vxlan").id)
st.write(lambda s: ops.create_subnet(s, c, network_id=net, cidr=ipaddress.IPv4Network("10.0.0.0/16")) and None)
st.write(lambda s: ops.create_node(s, c, name="node1", management_ip="127.0.0.1", tunnel_ip="127.0.0.1") and None)
n = 0
def one():
    global n
    n += 1
    body = sc.PortCreate(network_id=net, name=f"p{n}", node="node1", interface_name=f"if{n}")
    tok = request_ids.PENDING.set(request_ids.Pending("scope", f"k{n}", "fp"))
    try:
        co = ports_mod.create_port(body, c, st)
        try: co.send(None)
        except StopIteration as e: assert e.value.status_code == 201, e.value.body
    finally: request_ids.PENDING.reset(tok)
import psycopg
from fathom.store.ops import _port_context_sql
conn = psycopg.connect(host=str(pg.socket_dir), port=5432, user="postgres", dbname=url.split("@/")[1].split("?")[0], autocommit=True)
sql, defaults = _port_context_sql(True, True, False, False, False)
names = []
def sub(m):
    if m.group(1) not in names: names.append(m.group(1))
    return f"${names.index(m.group(1)) + 1}"
psql = re.sub(r"%\((\w+)\)s", sub, sql)
params = {**defaults, "network_id": net, "project": None, "node": "node1", "interface_name": "ifx"}
vals = ", ".join(repr(params[k]) if not isinstance(params[k], str) else "'" + params[k] + "'" for k in names)
for _ in range(int(sys.argv[1])): one()
conn.execute("PREPARE q AS " + psql)
for _ in range(7): conn.execute(f"EXECUTE q({vals})")
for _ in range(int(sys.argv[2])): one()
print("\n".join(r[0] for r in conn.execute(f"EXPLAIN (ANALYZE) EXECUTE q({vals})").fetchall()))
print(conn.execute("SELECT name, generic_plans, custom_plans FROM pg_prepared_statements").fetchall())
engine.dispose(); pg.stop()
