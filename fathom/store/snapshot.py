"""The store builds the model: `load_snapshot(session)` reads every table in one transaction into a
fathom.model.Snapshot, the only input of the compilers."""
from __future__ import annotations

from sqlalchemy import select

from fathom.model import FixedIp, Network, Node, Port, Router, RouterInterface, Snapshot, Subnet, TapPolicy
from fathom.store import models as m
from fathom.store.db import READ_ONLY
from fathom.store.fabric import load_fabric


def load_snapshot(session) -> Snapshot:
    """Read the whole store into a Snapshot, consistently (one transaction; reads only).

    Call with a fresh Session: `with Session(engine) as s: snap = load_snapshot(s)`.
    """
    def run():
        node_names = {}
        nodes = []
        for n in session.scalars(select(m.Node).order_by(m.Node.id)):
            node_names[n.id] = n.name
            nodes.append(Node(n.id, n.name, n.role, n.tunnel_ip, n.management_ip, n.state))
        networks = tuple(Network(n.id, n.name, n.project_id, n.type, n.segmentation_id)
                         for n in session.scalars(select(m.Network).order_by(m.Network.id)))
        subnets = tuple(Subnet(s.id, s.name, s.project_id, s.network_id, s.cidr, s.gateway_ip)
                        for s in session.scalars(select(m.Subnet).order_by(m.Subnet.id)))
        # ports and their addresses are most of a large store: read as rows, not ORM objects
        allocations: dict[int, list[FixedIp]] = {}
        a = m.IpAllocation
        for port_id, subnet_id, ip in session.execute(
                select(a.port_id, a.subnet_id, a.ip_address).order_by(a.id)):
            allocations.setdefault(port_id, []).append(FixedIp(subnet_id, ip))
        ports, interfaces = [], []
        p = m.Port
        for row in session.execute(select(p.id, p.name, p.project_id, p.network_id, p.mac_address, p.node_id,
                                          p.interface_name, p.port_security, p.router_id).order_by(p.id)):
            fixed = tuple(allocations.get(row.id, ()))
            if row.router_id is not None:
                for fip in fixed[:1]:
                    interfaces.append(RouterInterface(row.id, row.router_id, fip.subnet_id, row.network_id,
                                                      fip.ip_address, row.mac_address))
                continue
            ports.append(Port(row.id, row.name, row.project_id, row.network_id, row.mac_address, fixed,
                              node_names.get(row.node_id), row.interface_name, row.port_security))
        routers = tuple(Router(r.id, r.name, r.project_id)
                        for r in session.scalars(select(m.Router).order_by(m.Router.id)))
        taps = tuple(TapPolicy(t.id, t.name, t.project_id, t.sender_port_id, t.receiver_port_id,
                               t.receiver_is_port, t.receiver_mac, t.receiver_ip,
                               (t.monitor_port_id,) + ((t.monitor2_port_id,) if t.has_monitor2 else ()),
                               t.direction, t.priority, tuple(sorted((t.filters or {}).items())),
                               t.truncate, t.rate_pps)
                     for t in session.scalars(select(m.TapPolicy).order_by(m.TapPolicy.id)))
        return Snapshot(tuple(nodes), networks, subnets, tuple(ports), routers, tuple(interfaces),
                        tap_policies=taps, fabric=load_fabric(session))

    if session.in_transaction():
        return run()
    with session.begin():
        options = dict(READ_ONLY)
        if session.get_bind().dialect.name == "postgresql":
            # Several SELECTs must see one state: READ COMMITTED (the default) would not.
            options["isolation_level"] = "REPEATABLE READ"
        session.connection(execution_options=options)
        return run()
