"""Host-local desired state of every node: a pure function of the model.

Not an OpenFlow app: its output is what each node's agent must hold on its host (router
namespaces of `network-node` routers, PPTMon attachments: the operator's, and those of port chains
measured with `pptmon`, fathom.apps.hostlocal.chains), as the typed objects of
fathom.model.hostlocal, each with its owner. `desired(snapshot, attachments)` gives
{node name: [object, ...]} for every node of the model (a node with nothing to hold gets []).
"""
from __future__ import annotations

import ipaddress

from fathom.apps.hostlocal.chains import chain_attachments
from fathom.model import Snapshot
from fathom.model.hostlocal import PptmonAttach, RouterLeg, RouterNamespace
from fathom.model.routers import network_node_legs


def router_namespaces(snapshot: Snapshot) -> dict[str, list[RouterNamespace]]:
    """gateway node -> the router namespaces it must hold (routers in `network-node` mode)."""
    subnets = {s.id: s for s in snapshot.subnets}
    out: dict[str, list[RouterNamespace]] = {}
    for node, interfaces in network_node_legs(snapshot).items():
        by_router: dict[int, list[RouterLeg]] = {}
        for ri in sorted(interfaces, key=lambda x: x.id):
            sub = subnets.get(ri.subnet_id)
            if sub is None:
                continue
            prefix = ipaddress.IPv4Network(sub.cidr).prefixlen
            by_router.setdefault(ri.router_id, []).append(RouterLeg(ri.id, ri.mac_address,
                                                                    f"{ri.ip_address}/{prefix}"))
        out[node] = [RouterNamespace(rid, tuple(legs)) for rid, legs in sorted(by_router.items())]
    return out


def desired(snapshot: Snapshot, attachments=()) -> dict[str, list]:
    """{node name: [host-local object]} for every node. `attachments`: the operator's PPTMon
    attachments (fathom.model.hostlocal.PptmonAttach) by node name, as (node, PptmonAttach) pairs;
    the port chains with `pptmon` add theirs (fathom.apps.hostlocal.chains)."""
    out: dict[str, list] = {n.name: [] for n in snapshot.nodes}
    for node, namespaces in router_namespaces(snapshot).items():
        if node in out:
            out[node].extend(namespaces)
    every = [*attachments, *chain_attachments(snapshot)]
    for node, attach in sorted(every, key=lambda x: (x[0], x[1].owner_kind, x[1].attachment_id)):
        if node in out:
            out[node].append(attach)
    return out


__all__ = ["desired", "router_namespaces", "PptmonAttach"]
