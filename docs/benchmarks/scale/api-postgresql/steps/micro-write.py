"""A/B of a port creation's store write (the create route's closure, its answer and Idempotency-Key)
in one thread, alternating blocks: this thread's CPU and the PostgreSQL backends' schedstat per
creation. Run from the repository: python micro-write.py claim|ctx BLOCK ROUNDS
  claim: the address taken by a statement of its own (A) / in the rows' statement (B, NewPort.claim)
  ctx:   the checks' read loading ORM objects (A, the query before) / the columns in Core (B)"""
import ipaddress, os, sys, time, asyncio
sys.path.insert(0, ".")
from fathom.bench.postgres import PostgresServer
from fathom.store.db import open_store
from fathom.store import ops, secgroups
from fathom.store.changes import TableChanges
from fathom.api.deps import Store, answer_with
from fathom.api import request_ids, schemas as sc
from fathom.store.ops import Caller, Settings

pg = PostgresServer(durable=True).start()
engine = open_store(pg.new_database())
tracker = TableChanges(engine)
c = Caller()
st = Store(engine, Settings(), None)
net = st.write(lambda s: ops.create_network(s, c, Settings(), name="n", type="vxlan").id)
st.write(lambda s: ops.create_subnet(s, c, network_id=net, cidr=ipaddress.IPv4Network("10.0.0.0/16")) and None)
st.write(lambda s: ops.create_node(s, c, name="node1", management_ip="127.0.0.1", tunnel_ip="127.0.0.1") and None)
CREATED = answer_with(sc.PortOut, 201)

def variant(claim):
    def run(body):
        def create(s):
            new = ops.new_port(s, c, network_id=body.network_id, name=body.name, mac_address=body.mac_address,
                               fixed_ips=None, node=body.node, interface_name=body.interface_name,
                               port_security=body.port_security, project_id=body.project_id,
                               external_id=body.external_id, claim_at_insert=claim)
            v = new.values
            groups = secgroups.new_port_groups(s, v["project_id"], v["port_security"], body.security_groups, new.default_group)
            port_id, created = ops.insert_port(s, new, groups)
            return sc.PortOut(id=port_id, external_id=v["external_id"], name=v["name"], project_id=v["project_id"],
                              network_id=v["network_id"], mac_address=v["mac_address"],
                              fixed_ips=[sc.FixedIpOut(subnet_id=subnet_id, ip_address=ip) for subnet_id, ip in new.addresses],
                              node=new.node.name if new.node is not None else None,
                              interface_name=v["interface_name"], port_security=v["port_security"],
                              security_groups=groups, router_id=v["router_id"], status=v["status"], status_reason=None,
                              created_at=created)
        return st.write(create, answer=CREATED)
    return run
from fathom.store import models as m
from sqlalchemy import select, bindparam, null, false
from sqlalchemy.orm import aliased
import functools
@functools.cache
def old_query(node, interface, mac, external_id, project):
    other, bound_node = aliased(m.Port), aliased(m.Node)
    def taken(*where):
        return select(other.id).where(*where).limit(1).scalar_subquery()
    checks = [
        taken(other.node_id == bound_node.id, bound_node.name == bindparam("node"),
              other.interface_name == bindparam("interface_name")).correlate_except(other, bound_node)
        if node and interface else null(),
        taken(other.network_id == bindparam("network_id"), other.mac_address == bindparam("mac_address"))
        if mac else null(),
        taken(other.external_id == bindparam("external_id")) if external_id else null()]
    return (select(m.Network, m.Subnet, m.Node, m.DefaultSecurityGroup, *checks).select_from(m.Network)
            .outerjoin(m.Subnet, m.Subnet.network_id == m.Network.id)
            .outerjoin(m.Node, m.Node.name == bindparam("node") if node else false())
            .outerjoin(m.DefaultSecurityGroup, m.DefaultSecurityGroup.project_id ==
                       (bindparam("project") if project else m.Network.project_id))
            .where(m.Network.id == bindparam("network_id")).order_by(m.Subnet.id))
def old_ctx(session, caller, network_id, project_id, mac_address, node, interface_name, external_id):
    project = project_id if project_id is not None else (None if caller.admin else caller.project)
    query = old_query(node is not None, interface_name is not None, mac_address is not None, external_id is not None, project is not None)
    rows = session.execute(query, {"network_id": network_id, "project": project, "node": node,
                                   "interface_name": interface_name, "mac_address": mac_address,
                                   "external_id": external_id}).all()
    first = rows[0]
    ops.keep(session, first[3])
    return ops._PortContext(first[0], [r[1] for r in rows if r[1] is not None], first[2],
                        first[4] is not None, first[5] is not None, first[6] is not None, None)
new_ctx = ops._port_context
def with_ctx(ctx, fn):
    def run(body):
        ops._port_context = ctx
        return fn(body)
    return run
VARIANTS = ({"A": variant(False), "B": variant(True)} if sys.argv[1] == "claim" else
            {"A": with_ctx(old_ctx, variant(True)), "B": with_ctx(new_ctx, variant(True))})
n = 0
def one(fn):
    global n
    n += 1
    body = sc.PortCreate(network_id=net, name=f"p{n}", node="node1", interface_name=f"if{n}")
    tok = request_ids.PENDING.set(request_ids.Pending("scope", f"k{n}", "fp"))
    try:
        return fn(body)
    finally:
        request_ids.PENDING.reset(tok)
def ns_of(pid):
    try: return sum(int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0]) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError: return 0
def backends():
    return [int(p) for p in os.popen(f"pgrep -P {pg.pid()}").read().split()]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 200
R = int(sys.argv[3]) if len(sys.argv) > 3 else 5
for fn in VARIANTS.values():
    for _ in range(30): one(fn)
res = {k: [0, 0, 0] for k in VARIANTS}
for r in range(R):
    for k, fn in VARIANTS.items():
        b = backends(); b0 = {p: ns_of(p) for p in b}
        t0 = time.thread_time_ns()
        for _ in range(N): one(fn)
        res[k][0] += time.thread_time_ns() - t0
        res[k][1] += sum(ns_of(p) - b0[p] for p in b)
        res[k][2] += N
for k, (cli, srv, cnt) in res.items():
    print(f"{k}: client {cli/cnt/1e6:.3f} ms  PG {srv/cnt/1e6:.3f} ms  per creation ({cnt})")
engine.dispose(); pg.stop()
