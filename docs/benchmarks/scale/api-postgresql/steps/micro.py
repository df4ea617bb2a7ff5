"""Store write of a port creation, in one thread: the 3-insert path vs the CTE, alternating blocks;
this thread's CPU + the PG backend's schedstat, per creation."""
import ipaddress, sys, time
sys.path.insert(0, ".")   # run from the repository
from fathom.bench.postgres import PostgresServer
from fathom.store.db import open_store
from fathom.store import ops, secgroups, changes
from fathom.store.base import utcnow
from fathom.store.changes import TableChanges
from fathom.api.deps import Store
from fathom.store.ops import Caller, Settings
from sqlalchemy import text

pg = PostgresServer(durable=True).start()
engine = open_store(pg.new_database())
tracker = TableChanges(engine)
c = Caller()
st = Store(engine, Settings(), None)
net = st.write(lambda s: ops.create_network(s, c, Settings(), name="n", type="vxlan").id)
st.write(lambda s: ops.create_subnet(s, c, network_id=net, cidr=ipaddress.IPv4Network("10.0.0.0/16")) and None)
st.write(lambda s: ops.create_node(s, c, name="node1", management_ip="127.0.0.1", tunnel_ip="127.0.0.1") and None)

def old_insert(session, new, group_ids):
    conn = session.connection()
    created = utcnow()
    port_id = conn.scalar(ops._INSERT_PORT, {**new.values, "created_at": created})
    changes.port_inserted(conn, port_id)
    if new.addresses:
        conn.execute(ops._INSERT_ADDRESS, [{"port_id": port_id, "subnet_id": s_, "network_id": new.values["network_id"], "ip_address": ip} for s_, ip in new.addresses])
    if group_ids:
        conn.execute(ops._INSERT_LINK, [{"port_id": port_id, "group_id": g} for g in group_ids])
    return port_id, created

backend = {}
def make(insert, i):
    def create(s):
        if not backend:
            backend["pid"] = s.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar()
        new = ops.new_port(s, c, network_id=net, name=f"p{i}", node="node1", interface_name=f"if{i}")
        groups = secgroups.new_port_groups(s, new.values["project_id"], new.values["port_security"], None)
        return insert(s, new, groups)
    return create

engine.pool._pool  # noqa
# one connection only: pool_size irrelevant, sequential
def ns(pid):
    return sum(int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0]) for t in __import__("os").listdir(f"/proc/{pid}/task"))
st.write(make(old_insert, -1)); 
res = {"old": [0, 0, 0], "cte": [0, 0, 0]}
i = 0
N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
for rnd in range(6):
    for name, fn in (("old", old_insert), ("cte", ops.insert_port)):
        b0 = {p: ns(p) for p in [backend["pid"]]}
        t0 = time.thread_time_ns()
        for _ in range(N):
            i += 1
            st.write(make(fn, i))
        res[name][0] += time.thread_time_ns() - t0
        res[name][1] += sum(ns(p) - b0[p] for p in b0)
        res[name][2] += N
for name, (cli, srv, n) in res.items():
    print(f"{name}: client {cli/n/1e6:.3f} ms  PG backend {srv/n/1e6:.3f} ms  per creation ({n})")
print("tracker saw", len([t for t in tracker.take() if isinstance(t, tuple)]), "port tokens")
engine.dispose(); pg.stop()
