"""Where each router runs, as the switches realise it now: pure functions of the model.

Router modes: `distributed` (default; every first-hop br-int routes), `fabric` (the fabric switch routes),
`network-node` (a namespace on a gateway node routes; its interfaces are ports of the gateway node's
br-int). The tenant and vTAP apps read `tenant_view`, the fabric app and the network-node router
agent read `effective_modes` and `network_node_legs`. docs/fabric.md explains the modes.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import NamedTuple

from fathom.model import FabricState, FixedIp, Port, Snapshot
from fathom.model.views import Views, get


def router_port_interface(leg_id: int) -> str:
    """br-int interface of a network-node router interface on the gateway node (its namespace holds qr-N)."""
    return f"qrp{leg_id}"


def fabric_state(snapshot: Snapshot) -> FabricState:
    return snapshot.fabric if snapshot.fabric is not None else FabricState()


def effective_modes(snapshot: Snapshot) -> dict:
    """router id -> the Mode the switches realise now (routers absent: distributed).

    Make before break: a router moved to `network-node` keeps being routed `distributed` until every
    one of its interfaces is an interface on the gateway node's br-int (the namespace is built first);
    then one pass switches all nodes to it.
    """
    fab = fabric_state(snapshot)
    nodes = {n.name: n for n in snapshot.nodes}
    out = {}
    for md in fab.modes:
        if md.mode == "network-node":
            gw = nodes.get(md.gateway_node)
            interfaces = [ri for ri in snapshot.router_interfaces if ri.router_id == md.router_id]
            if gw is None or any(gw.ofport(router_port_interface(ri.id)) is None for ri in interfaces):
                continue
        out[md.router_id] = md
    return out


class RouterPath(NamedTuple):
    """Where the switches route a router's traffic now: its effective mode, the gateway node of a
    `network-node` router, the networks it joins, and every node whose switch carries its routed
    traffic (those with a port bound on one of its networks, and the gateway node)."""
    mode: str
    gateway: str | None
    networks: frozenset[int]
    nodes: frozenset[str]

    def rerouted(self, other: "RouterPath | None") -> bool:
        """Whether traffic takes another path under `other` (None: the router is gone)."""
        return other is None or (self.mode, self.gateway, self.networks) != (other.mode, other.gateway, other.networks)


def router_paths(snapshot: Snapshot) -> dict[int, RouterPath]:
    """router id -> its RouterPath."""
    modes = effective_modes(snapshot)
    networks: dict[int, set[int]] = defaultdict(set)
    for ri in snapshot.router_interfaces:
        networks[ri.router_id].add(ri.network_id)
    nodes_of: dict[int, set[str]] = defaultdict(set)
    for p in snapshot.ports:
        if p.node:
            nodes_of[p.network_id].add(p.node)
    out = {}
    for r in snapshot.routers:
        md = modes.get(r.id)
        mode = md.mode if md is not None else "distributed"
        gateway = md.gateway_node if md is not None and mode == "network-node" else None
        nodes = {gateway} if gateway else set()
        for net in networks[r.id]:
            nodes |= nodes_of[net]
        out[r.id] = RouterPath(mode, gateway, frozenset(networks[r.id]), frozenset(nodes))
    return out


def tenant_view(snapshot: Snapshot, views: Views | None = None) -> Snapshot:
    """What the tenant compiler must see: routers not in `distributed` mode are hidden from it; the
    interfaces of `network-node` routers become ports bound to their gateway node. Computed once per
    snapshot (the tenant and vTAP apps and the fabric switch all read it)."""
    return get(views, snapshot, "tenant_view", _tenant_view)


def _tenant_view(snapshot: Snapshot, _views=None) -> Snapshot:
    other = {rid: md for rid, md in effective_modes(snapshot).items() if md.mode != "distributed"}
    if not other:
        return snapshot
    keep, extra = [], []
    for ri in snapshot.router_interfaces:
        md = other.get(ri.router_id)
        if md is None:
            keep.append(ri)
        elif md.mode == "network-node" and md.gateway_node:
            extra.append(Port(ri.id, f"router-{ri.router_id}", "", ri.network_id, ri.mac_address,
                              (FixedIp(ri.subnet_id, ri.ip_address),), md.gateway_node,
                              router_port_interface(ri.id), port_security=False))
    return replace(snapshot, router_interfaces=tuple(keep), ports=snapshot.ports + tuple(extra))


def network_node_legs(snapshot: Snapshot) -> dict[str, list]:
    """gateway node name -> router interfaces (RouterInterface) it must realise in a router namespace."""
    fab = fabric_state(snapshot)
    out: dict[str, list] = defaultdict(list)
    for ri in snapshot.router_interfaces:
        md = fab.mode_of(ri.router_id)
        if md.mode == "network-node" and md.gateway_node:
            out[md.gateway_node].append(ri)
    return dict(out)
