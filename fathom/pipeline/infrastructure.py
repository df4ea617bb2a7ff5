"""Which br-int interfaces belong to the fabric itself, and so can never be a tenant's port.

fathom creates on every node: the VXLAN tunnel port (`vxlan0`), the patch pair to br-phy
(`patch-phy` / `patch-int`), the bridges' own internal ports (`br-int`, `br-phy`, `br-fabric`),
the br-int legs of network-node routers (`qrp<N>`), the DHCP ports of networks (`dhp<N>`) and a
gateway node's external port (`ext0`). A port bound to one of them would
classify what arrives there (every tenant's tunnelled or uplink traffic) into one network, so
the API refuses such a binding and the tenant compiler refuses to compile one (both use this).
The prefixes are reserved as a whole, so that a tunnel type or router leg added later is covered.
"""
from __future__ import annotations

import re

from fathom.model import Port, Snapshot
from fathom.model.views import Views, get
from fathom.openflow.spec import OFPP_MAX

RESERVED = re.compile(r"^(vxlan|genev|gre[0-9]|patch-|br-|qrp[0-9]|dhp[0-9]|ovs-|ext[0-9])", re.IGNORECASE)


def is_infrastructure_interface(name: str | None) -> bool:
    return bool(name) and RESERVED.match(name) is not None


def refused_ports(snapshot: Snapshot, views: Views | None = None) -> dict[int, str]:
    """Port id -> why it is not compiled: bound to an interface of the fabric itself (the tunnel,
    the uplink, a patch port, a bridge, a router leg: RESERVED above), by name or
    by OpenFlow port number. Such a port would pull every tenant's traffic arriving there into its
    own network; the reconciler marks it `error` with this reason. Worked out once per snapshot
    (the reconciler, the tenant and the security groups ask it): not to be changed."""
    return get(views, snapshot, "refused_ports", _refused_ports, _patch_refused_ports)


def _refused_ports(snapshot: Snapshot, _views=None) -> dict[int, str]:
    nodes = {n.name: n for n in snapshot.nodes}
    infra: dict[str, set[int]] = {}   # node name -> OpenFlow port numbers of the fabric's interfaces
    return {p.id: why for p in snapshot.ports if (why := _refusal(p, nodes, infra)) is not None}


def _patch_refused_ports(refused: dict, snapshot: Snapshot, delta, _views=None) -> dict | None:
    nodes = {n.name: n for n in snapshot.nodes}
    infra: dict[str, set[int]] = {}
    return delta.patched(refused, lambda p: _refusal(p, nodes, infra))


def _refusal(p: Port, nodes: dict, infra: dict) -> str | None:
    """Why `p` is refused, or None; `infra` caches each node's fabric port numbers."""
    node = nodes.get(p.node)
    if node is None or not p.interface or p.interface == f"qrp{p.id}":
        # qrp<id>: the leg of a network-node router, a port fathom made for itself
        # (fathom.pipeline.fabric.tenant_view); a tenant port's id is never a leg's
        return None
    ofport = node.ofport(p.interface)
    if node.name not in infra:
        infra[node.name] = {o for name, o in node.ofports.items() if is_infrastructure_interface(name)}
    if is_infrastructure_interface(p.interface) or (ofport is not None and (ofport in infra[node.name]
                                                                            or ofport >= OFPP_MAX)):
        return (f"interface {p.interface!r} on node {p.node!r} belongs to the fabric "
                "(tunnel, uplink or patch port): refused as a tenant port")
    return None
