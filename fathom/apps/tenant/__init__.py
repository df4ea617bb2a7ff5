"""Tenant networking: networks, subnets, ports and distributed routers in every node's br-int.

Incremental: a change of ports (created, deleted, rebound, plugged or unplugged, or their network's
DHCP port on their node plugged or unplugged) touches the ports themselves and their networks (flood groups, classification), plus, when it makes a network local
to a node or routed to from it for the first time (or the last), everything of that network and of
the routers on it. A change of the flow-records rates touches the ports of the projects whose
ingress rate changed (their tunnel-egress samples). Any other change (nodes, networks changed,
subnets, routers, router interfaces, a router's gateway node) is not handled: the app is compiled whole.
"""
from __future__ import annotations

from collections import defaultdict

from fathom.apps.base import BR_INT, App, Owner, Reads, SwitchKey
from fathom.apps.incremental import per_model
from fathom.apps.tenant.compiler import compile_tenant, dhcp_interface, node_scopes
from fathom.model import TUNNEL_INTERFACE, UPLINK_INTERFACE
from fathom.model import flow_records as fr
from fathom.model.routers import tenant_view
from fathom.model.views import get
from fathom.pipeline import cookies as ck
from fathom.pipeline.cookies import APP_TENANT


def compile(model, views=None) -> dict:
    return {SwitchKey(BR_INT, node): state
            for node, state in compile_tenant(tenant_view(model, views), views=views).items()}


def compile_owners(model, owners, views=None) -> dict:
    only = frozenset((o.kind, o.id) for o in owners if o.app == APP_TENANT)
    if not only:
        return {}
    compiled = compile_tenant(tenant_view(model, views), only, views)
    return {SwitchKey(BR_INT, node): state for node, state in compiled.items()
            if state.flows or state.groups}


def _node_facts(model):
    return tuple((n.id, n.name, n.tunnel_ip, n.ofport(TUNNEL_INTERFACE), n.ofport(UPLINK_INTERFACE))
                 for n in model.nodes)


def tenant_ports(model, views=None) -> dict:
    """port id -> what its flows depend on: the port, its OpenFlow port number on its node, and
    that of its network's DHCP port there (`dhp<network>`, plugged by the node's agent: when it
    comes or goes, the port's DHCP flows and its network's DHCP-port flows change). Once per
    snapshot, patched for the ports a change touched."""
    return get(views, model, "tenant_ports", _ports, _patch_ports)


def _facts(p, nodes: dict) -> tuple:
    node = nodes.get(p.node)
    if node is None:
        return (p, None, None)
    return (p, node.ofport(p.interface), node.ofport(dhcp_interface(p.network_id)))


def _ports(model, _views=None) -> dict:
    nodes = {n.name: n for n in model.nodes}
    return {p.id: _facts(p, nodes) for p in model.ports}


def _patch_ports(facts: dict, model, delta, _views=None) -> dict:
    nodes = {n.name: n for n in model.nodes}
    return delta.patched(facts, lambda p: _facts(p, nodes))


def _gateway_nodes(model) -> set:
    return {(g.router_id, g.node) for g in model.router_gateways}


def touched(before, after, views=None):
    b, a = tenant_view(before, views), tenant_view(after, views)
    if _node_facts(b) != _node_facts(a):
        return "nodes changed"
    if b.subnets != a.subnets:
        return "subnets changed"
    if b.routers != a.routers or b.router_interfaces != a.router_interfaces:
        return "routers changed"
    # a router's gateway node routes into every network of the router (its neighbours and l2)
    if _gateway_nodes(b) != _gateway_nodes(a):
        return "router gateway nodes changed"
    owners: set = set()
    nets_b, nets_a = {n.id: n for n in b.networks}, {n.id: n for n in a.networks}
    for nid in set(nets_b) | set(nets_a):
        if nid in nets_b and nid in nets_a and nets_b[nid] != nets_a[nid]:
            return f"network {nid} changed"
        if nets_b.get(nid) != nets_a.get(nid):
            owners.add(Owner(APP_TENANT, ck.KIND_NETWORK, nid))
    ports_b, ports_a = tenant_ports(b, views), tenant_ports(a, views)
    # the ports whose facts may differ: those the delta names, else every one
    delta = views.delta_from(b, a) if views is not None else None
    for pid in (delta.ports if delta is not None else set(ports_b) | set(ports_a)):
        old, new = ports_b.get(pid), ports_a.get(pid)
        if old != new:
            owners.add(Owner(APP_TENANT, ck.KIND_PORT, pid))
            for p in (old, new):
                if p is not None:
                    owners.add(Owner(APP_TENANT, ck.KIND_NETWORK, p[0].network_id))
    owners |= _sampling_touched(b, a, views)
    if not owners:
        return owners
    # a network that became (or stopped being) local to a node, or routed to from it: every flow
    # of it and of the routers on it may appear or leave there
    scopes_b, scopes_a = node_scopes(b, views), node_scopes(a, views)
    moved: set[int] = set()
    for node in set(scopes_b) | set(scopes_a):
        none = (frozenset(), frozenset())
        (lb, rb), (la, ra) = scopes_b.get(node, none), scopes_a.get(node, none)
        moved |= (lb ^ la) | (rb ^ ra)
    if moved:
        routers = {ri.router_id for ri in a.router_interfaces if ri.network_id in moved}
        owners |= {Owner(APP_TENANT, ck.KIND_NETWORK, n) for n in moved}
        owners |= {Owner(APP_TENANT, ck.KIND_PORT, pid) for m in (b, a)
                   for pid, (p, *_) in tenant_ports(m, views).items() if p.network_id in moved}
        owners |= {Owner(APP_TENANT, ck.KIND_ROUTER_INTERFACE, ri.id) for ri in a.router_interfaces
                   if ri.network_id in moved or ri.router_id in routers}
    return owners


def _sampling_touched(b, a, views=None) -> set[Owner]:
    """The ports whose tunnel-egress samples a change of the flow-records rates moves: those of the
    projects whose ingress rate changed (the rate of the l2 flows to their ports on other nodes)."""
    if b.flow_sampling == a.flow_sampling:
        return set()
    before, after = fr.ingress_rates(b.flow_sampling), fr.ingress_rates(a.flow_sampling)
    projects = {p for p in set(before) | set(after) if before.get(p, 0) != after.get(p, 0)}
    return {Owner(APP_TENANT, ck.KIND_PORT, pid) for pid, (p, *_) in tenant_ports(a, views).items()
            if p.project_id in projects}


# What `compile` reads (checked). `touched` is written by hand: a port plugged or gone can make its
# network local to a node (or no longer), which touches every owner of that network and of its
# routers there, and a port's flows follow its network's DHCP port number on its node; the
# declaration (an object's own owner, or owners naming it) cannot say either.
READS = Reads({
    "nodes": frozenset({"id", "name", "tunnel_ip", "ofports"}),
    "networks": frozenset({"id", "type", "segmentation_id"}),
    "subnets": frozenset({"id", "network_id", "cidr", "gateway_ip", "enable_dhcp"}),
    "ports": frozenset({"id", "project_id", "network_id", "mac_address", "fixed_ips", "node", "interface",
                        "port_security", "ofport"}),
    "router_interfaces": frozenset({"id", "router_id", "subnet_id", "network_id", "ip_address", "mac_address"}),
    "router_gateways": frozenset({"router_id", "node"}),
    "fabric": frozenset({"modes"}),
    # the tunnel-egress samples: the ports' projects' ingress rate
    "flow_sampling": frozenset({"project_id", "port_id", "ingress"}),
})


def reach(model, write) -> frozenset:
    """The nodes a port's write may change the tenant's flows on: its own, and those where its
    network, or one sharing a router with it, has a bound port, or that are the gateway node of
    a router on its network (a network's flows and its ports' are only where it is local, routed
    to or reached from a router's gateway: compiler._nodes_of)."""
    nodes_of, routers_of, networks_of, gateways_of = _reach_index(model)
    routers = routers_of.get(write.network, set())
    networks = {write.network}.union(*(networks_of[r] for r in routers))
    return frozenset(write.nodes.union(*(nodes_of.get(n, ()) for n in networks),
                                       *(gateways_of.get(r, ()) for r in routers)))


@per_model
def _reach_index(model) -> tuple[dict, dict, dict, dict]:
    """`reach`'s look-ups: network -> the nodes of its bound ports; network -> its routers; router
    -> its networks; router -> its gateway nodes."""
    view = tenant_view(model)
    nodes_of, routers_of, networks_of, gateways_of = (defaultdict(set) for _ in range(4))
    for p in view.ports:
        if p.node is not None:
            nodes_of[p.network_id].add(p.node)
    for ri in view.router_interfaces:
        routers_of[ri.network_id].add(ri.router_id)
        networks_of[ri.router_id].add(ri.network_id)
    for g in view.router_gateways:
        if g.node is not None:
            gateways_of[g.router_id].add(g.node)
    return nodes_of, routers_of, networks_of, gateways_of


APP = App("tenant", APP_TENANT,
          {BR_INT: ("classify", "security", "arp", "l3", "l3-neighbor", "l2", "output")}, compile,
          touched=touched, compile_owners=compile_owners, reads=READS, reach=reach)
