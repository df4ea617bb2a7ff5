"""The fabric: the fabric switch's VLAN trunks and SVIs, the trunk pipe through br-phy, and the br-int flows
that send a fabric router's traffic up the trunk. The fabric switch is derived: a trunk port carries every
VLAN the node behind it can send, read from that node's desired br-int.

Incremental as far as telling that a change does not concern it: without fabric switches and
without a router in fabric mode it has no flows whatever else changes; otherwise a change that
leaves what `compile` reads (READS; of the ports, the networks plugged per node) as it was touches
nothing of it, and any other is compiled whole (logged and counted).
The fabric switch's part (`derive`) follows the br-int states and is derived again on every pass."""
from __future__ import annotations

from fathom.apps.base import BR_INT, BR_PHY, FABRIC_SWITCH, App, Reads, SwitchKey
from fathom.apps.fabric import compiler as fc
from fathom.apps.incremental import declared_facts, local_networks
from fathom.model.routers import tenant_view
from fathom.pipeline.cookies import APP_FABRIC


def compile(model, views=None) -> dict:
    out = {SwitchKey(BR_INT, node): state for node, state in fc.compile_edges(model).items()}
    if model.fabric is not None and model.fabric.switches:
        out.update({SwitchKey(BR_PHY, node): state for node, state in fc.compile_phy(model).items()})
    return out


def derive(model, desired, views=None) -> dict:
    if model.fabric is None or not model.fabric.switches:
        return {}
    brint = {k.name: state for k, state in desired.items() if k.bridge == BR_INT}
    return {SwitchKey(FABRIC_SWITCH, name): state for name, state in fc.compile_fabric_switches(model, brint, views).items()}


def _inputs(model, views) -> tuple:
    return declared_facts(model, READS, without=frozenset({"ports"})), local_networks(model, views)


def touched(before, after, views=None):
    quiet = [m.fabric is None or (not m.fabric.switches and not m.fabric.modes) for m in (before, after)]
    if all(quiet):
        return set()
    return set() if _inputs(before, views) == _inputs(after, views) else "fabric, nodes, networks or routers changed"


# What `compile` reads (checked). `touched` is written by hand: of the ports, only which networks are
# plugged on each node matters (fathom.apps.incremental.local_networks), which the declaration
# cannot say: from it, every port plugged would compile the app whole.
READS = Reads({
    "nodes": frozenset({"name", "ofports", "phy_ofports"}),
    "networks": frozenset({"id", "type", "segmentation_id"}),
    "ports": frozenset({"network_id", "node", "interface", "ofport"}),
    "router_interfaces": frozenset({"id", "router_id", "network_id", "mac_address"}),
    "fabric": frozenset({"switches", "modes"}),
})


def reach(model, write):
    """The nodes a port's write may change the fabric's state on: a fabric router's br-int flows
    and br-phy follow each node's own ports (compile_edges, compile_phy), so its own nodes; a
    fabric switch follows the ports of VLAN networks and the VLANs each br-int sends, which a port
    of a VXLAN network whose routers route only VXLAN networks leaves as they are. A port of any
    other network, with fabric switches: any switch (None)."""
    if model.fabric is None or not model.fabric.switches:
        return write.nodes
    view = tenant_view(model)
    routers = {ri.router_id for ri in view.router_interfaces if ri.network_id == write.network}
    networks = {write.network} | {ri.network_id for ri in view.router_interfaces if ri.router_id in routers}
    types = {n.id: n.type for n in view.networks if n.id in networks}
    return write.nodes if types.keys() == networks and set(types.values()) == {"vxlan"} else None


APP = App("fabric", APP_FABRIC,
          {BR_INT: ("l2",), BR_PHY: ("normal",), FABRIC_SWITCH: ("trunk-in", "svi", "svi-neigh", "l2")},
          compile, derive, touched=touched, reads=READS,
          reach=reach)
