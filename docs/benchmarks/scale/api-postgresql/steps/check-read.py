"""The checks' read of a port's creation (fathom.store.ops._port_context, as the driver runs it) on a
young table: two databases with 2,000 ports on one node, A with the ports' indexes of network_id and
node_id (as before migration 0021), B without; 500 reads of each, alternately twice, and the plan of
the interface check. Run from the repository: python check-read.py"""
import ipaddress, sys, time
sys.path.insert(0, ".")
from sqlalchemy.orm import Session
from fathom.bench.postgres import PostgresServer
from fathom.store.db import open_store
from fathom.store import ops

pg = PostgresServer(durable=True).start()
c = ops.Caller()
A_SQL = ("CREATE INDEX ix_ports_network_id ON ports (network_id)", "CREATE INDEX ix_ports_node_id ON ports (node_id)")
stores = {}
for name, statements in (("A", A_SQL), ("B", ())):
    engine = open_store(pg.new_database())
    with engine.begin() as conn:
        for statement in statements:
            conn.exec_driver_sql(statement)
    with Session(engine) as s, s.begin():
        net = ops.create_network(s, c, ops.Settings(), name="n", type="vxlan").id
        ops.create_subnet(s, c, network_id=net, cidr=ipaddress.IPv4Network("10.0.0.0/16"))
        ops.create_node(s, c, name="node1", management_ip="127.0.0.1", tunnel_ip="127.0.0.1")
    for i in range(2000):
        with Session(engine) as s, s.begin():
            new = ops.new_port(s, c, network_id=net, name=f"p{i}", node="node1", interface_name=f"if{i}",
                               claim_at_insert=True)
            ops.insert_port(s, new, [])
    stores[name] = engine, net
statement, defaults = ops._port_context_sql(True, True, False, False, False)
for name in ("A", "B", "A", "B"):
    engine, net = stores[name]
    raw = engine.raw_connection()
    driver = raw.driver_connection
    params = {**defaults, "network_id": net, "project": None, "node": "node1", "interface_name": "free",
              "mac_address": None, "external_id": None}
    with driver.cursor() as cur:
        for _ in range(20):
            cur.execute(statement, params, prepare=True)
            cur.fetchall()
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(500):
            cur.execute(statement, params, prepare=True)
            cur.fetchall()
        wall = (time.perf_counter() - t0) / 500 * 1000
        cur.execute("EXPLAIN (ANALYZE) SELECT 1 FROM ports, nodes WHERE ports.node_id = nodes.id "
                    "AND nodes.name = 'node1' AND ports.interface_name = 'free' LIMIT 1")
        plan = [r[0].strip() for r in cur.fetchall() if "on ports" in r[0] or "Removed" in r[0]]
    driver.rollback()
    raw.close()
    print(f"{name}: {wall:.3f} ms a read (wall); interface check: {' / '.join(plan)}")
for engine, _ in stores.values():
    engine.dispose()
pg.stop()
