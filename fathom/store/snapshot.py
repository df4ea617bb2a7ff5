"""The store builds the model: `load_snapshot(session)` reads every table in one transaction into a
fathom.model.Snapshot, the only input of the compilers."""
from __future__ import annotations

from sqlalchemy import select

from fathom.model import (
    ChainPptmon, FixedIp, FloatingIp, FlowClassifier, Network, Node, Port, PortChain, PortPair, PortPairGroup,
    Router, RouterGateway, RouterInterface, SecurityGroup, SecurityGroupRule, Snapshot, Subnet, TapPolicy,
)
from fathom.store import models as m
from fathom.store import sfc_models as sm
from fathom.store.agent_models import NodeAgent
from fathom.store.agents import recommended_datapath
from fathom.store.external_models import FloatingIp as FloatingIpRow
from fathom.store.external_models import RouterGateway as RouterGatewayRow
from fathom.store.db import READ_ONLY
from fathom.store.fabric import load_fabric
from fathom.store.status import dhcp_status_value


def load_snapshot(session, statuses: dict | None = None) -> Snapshot:
    """Read the whole store into a Snapshot, consistently (one transaction; reads only).

    Call with a fresh Session: `with Session(engine) as s: snap = load_snapshot(s)`. With
    `statuses`, the stored (status, reason) of every object is put there too, keyed like
    fathom.controller.status.decide's answer ((kind, id); nodes also ("node_state", id)), so the
    reconciler writes only the statuses that differ.
    """
    seen = statuses if statuses is not None else {}
    def run():
        node_names = {}
        nodes = []
        reported = {a.node_id: recommended_datapath(a.facts or {}) for a in session.scalars(select(NodeAgent))}
        for n in session.scalars(select(m.Node).order_by(m.Node.id)):
            node_names[n.id] = n.name
            seen[("node", n.id)] = (n.status, n.status_reason)
            seen[("node_state", n.name)] = n.state
            nodes.append(Node(n.id, n.name, n.role, n.tunnel_ip, n.management_ip, n.state,
                              datapath_type=n.datapath_type or reported.get(n.id)))
        networks, subnets = [], []
        for n in session.scalars(select(m.Network).order_by(m.Network.id)):
            seen[("network", n.id)] = (n.status, n.status_reason)
            networks.append(Network(n.id, n.name, n.project_id, n.type, n.segmentation_id, n.external, n.upstream_mac))
        for s in session.scalars(select(m.Subnet).order_by(m.Subnet.id)):
            seen[("subnet", s.id)] = (s.status, s.status_reason)
            seen[("subnet_dhcp", s.id)] = dhcp_status_value(s.dhcp_status)
            subnets.append(Subnet(s.id, s.name, s.project_id, s.network_id, s.cidr, s.gateway_ip,
                                  bool(s.enable_dhcp), tuple(s.dns_nameservers or ()),
                                  tuple((r["destination"], r["nexthop"]) for r in s.host_routes or ())))
        allocations: dict[int, list[FixedIp]] = {}
        for a in session.scalars(select(m.IpAllocation).order_by(m.IpAllocation.id)):
            allocations.setdefault(a.port_id, []).append(FixedIp(a.subnet_id, a.ip_address))
        memberships: dict[int, list[int]] = {}
        for link in session.scalars(select(m.PortSecurityGroup).order_by(m.PortSecurityGroup.port_id,
                                                                         m.PortSecurityGroup.group_id)):
            memberships.setdefault(link.port_id, []).append(link.group_id)
        ports, interfaces, address_ports = [], [], {}
        address_port_ids = set(session.scalars(select(RouterGatewayRow.address_port_id))) | \
            set(session.scalars(select(FloatingIpRow.address_port_id)))
        for p in session.scalars(select(m.Port).order_by(m.Port.id)):
            fixed = tuple(allocations.get(p.id, ()))
            seen[("router_interface" if p.router_id is not None else "port", p.id)] = (p.status, p.status_reason)
            if p.id in address_port_ids:   # holds a router gateway's or floating IP's address: not a workload
                address_ports[p.id] = (p, fixed)
                continue
            if p.router_id is not None:
                for fip in fixed[:1]:
                    interfaces.append(RouterInterface(p.id, p.router_id, fip.subnet_id, p.network_id,
                                                      fip.ip_address, p.mac_address))
                continue
            ports.append(Port(p.id, p.name, p.project_id, p.network_id, p.mac_address, fixed,
                              node_names.get(p.node_id), p.interface_name, p.port_security,
                              tuple(memberships.get(p.id, ()))))
        routers = []
        for r in session.scalars(select(m.Router).order_by(m.Router.id)):
            seen[("router", r.id)] = (r.status, r.status_reason)
            routers.append(Router(r.id, r.name, r.project_id))
        for t in session.scalars(select(m.TapPolicy)):
            seen[("tap_policy", t.id)] = (t.status, t.status_reason)
        taps = tuple(TapPolicy(t.id, t.name, t.project_id, t.sender_port_id, t.receiver_port_id,
                               t.receiver_is_port, t.receiver_mac, t.receiver_ip,
                               (t.monitor_port_id,) + ((t.monitor2_port_id,) if t.has_monitor2 else ()),
                               t.direction, t.priority, tuple(sorted((t.filters or {}).items())),
                               t.truncate, t.rate_pps)
                     for t in session.scalars(select(m.TapPolicy).order_by(m.TapPolicy.id)))
        groups = tuple(SecurityGroup(g.id, g.name, g.project_id)
                       for g in session.scalars(select(m.SecurityGroup).order_by(m.SecurityGroup.id)))
        rules = tuple(SecurityGroupRule(r.id, r.group_id, r.direction, r.ethertype, r.protocol, r.port_range_min,
                                        r.port_range_max, r.remote_ip_prefix, r.remote_group_id)
                      for r in session.scalars(select(m.SecurityGroupRule).order_by(m.SecurityGroupRule.id)))
        gateways = []
        for g in session.scalars(select(RouterGatewayRow).order_by(RouterGatewayRow.router_id)):
            port, fixed = address_ports[g.address_port_id]
            gateways.append(RouterGateway(g.router_id, g.network_id, fixed[0].subnet_id, fixed[0].ip_address,
                                          port.mac_address, node_names.get(g.node_id), g.ct_zone, g.snat,
                                          g.address_port_id))
        fips = []
        for f in session.scalars(select(FloatingIpRow).order_by(FloatingIpRow.id)):
            seen[("floating_ip", f.id)] = (f.status, f.status_reason)
            fips.append(FloatingIp(f.id, f.project_id, f.network_id, f.ip_address, f.ct_zone, f.port_id,
                                   f.fixed_ip if f.port_id is not None else None,
                                   f.router_id if f.port_id is not None else None, f.address_port_id))
        return Snapshot(tuple(nodes), tuple(networks), tuple(subnets), tuple(ports), tuple(routers), tuple(interfaces),
                        tap_policies=taps, security_groups=groups, security_group_rules=rules,
                        router_gateways=tuple(gateways), floating_ips=tuple(fips),
                        fabric=load_fabric(session), **_chains(session))

    if session.in_transaction():
        return run()
    with session.begin():
        options = dict(READ_ONLY)
        if session.get_bind().dialect.name == "postgresql":
            # Several SELECTs must see one state: READ COMMITTED (the default) would not.
            options["isolation_level"] = "REPEATABLE READ"
        session.connection(execution_options=options)
        return run()


def _range(low, high) -> tuple[int, int] | None:
    return None if low is None else (low, high)


def _chains(session) -> dict:
    """Port pairs, groups (members in id order), flow classifiers and chains (groups in order)."""
    pairs = list(session.scalars(select(sm.PortPair).order_by(sm.PortPair.id)))
    groups = list(session.scalars(select(sm.PortPairGroup).order_by(sm.PortPairGroup.id)))
    fcs = list(session.scalars(select(sm.FlowClassifier).order_by(sm.FlowClassifier.id)))
    chains = list(session.scalars(select(sm.PortChain).order_by(sm.PortChain.id)))
    return {
        "port_pairs": tuple(PortPair(p.id, p.name, p.project_id, p.ingress_port_id, p.egress_port_id) for p in pairs),
        "port_pair_groups": tuple(PortPairGroup(g.id, g.name, g.project_id,
                                                tuple(p.id for p in pairs if p.group_id == g.id)) for g in groups),
        "flow_classifiers": tuple(FlowClassifier(
            f.id, f.name, f.project_id, f.logical_source_port_id, f.logical_destination_port_id, f.protocol,
            f.source_ip_prefix, f.destination_ip_prefix, _range(f.source_port_range_min, f.source_port_range_max),
            _range(f.destination_port_range_min, f.destination_port_range_max)) for f in fcs),
        "port_chains": tuple(PortChain(
            c.id, c.name, c.project_id,
            tuple(g.id for g in sorted((g for g in groups if g.chain_id == c.id), key=lambda g: g.position)),
            tuple(f.id for f in fcs if f.chain_id == c.id), c.symmetric,
            ChainPptmon(int(c.pptmon["period_ns"])) if c.pptmon else None) for c in chains),
    }
