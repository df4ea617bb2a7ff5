"""Fabric compiler: the model -> desired state of the fabric switches, of every node's
br-phy, and the additions to br-int; plus the tenant compiler's view of routers that do not run
distributed. Pure, like fathom/apps/tenant/compiler.py. docs/fabric.md explains the design.

Router modes:
- `distributed` (default): the tenant compiler routes in every first-hop br-int.
- `fabric`: the fabric switch is the router (SVIs): it answers ARP for the gateway addresses and routes
  between the router's VLAN subnets (MAC rewrite, TTL - 1, VLAN change). The tenant compiler does
  not see the router; br-int only sends frames for the gateway MAC up the VLAN trunk.
- `network-node`: a Linux namespace on the gateway node routes (ip_forward), as Neutron's L3 agent.
  Each router interface becomes a port of its network bound to the gateway node (interface
  `router_port_interface(interface)`), so every node switches to it like to any VM.

The fabric switch (br-fabric) and br-phy pipelines are declared in fathom/pipeline/catalogue.py.

A VLAN is allowed on a trunk port exactly while the node behind the port hosts a port of the
network or its br-int can send frames tagged with it (a node routing into the network: a
distributed router with an interface on a network the node hosts). The second set is read from the
node's compiled br-int state (`vlans_sent`), so whatever the node's pipeline can put on its trunk
the fabric switch lets in. Ingress: the trunk-in flow; egress: the VLAN's flood group bucket and the l2 flows.
docs/fabric.md, "Routing and VLAN trunks", says why.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Mapping

from fathom.openflow.spec import (
    OFPP_IN_PORT, OFPVID_PRESENT, DecTtl, FlowSpec, GotoTable,
    Group, GroupSpec, Output, PushVlan, SetField, SwitchState,
)
from fathom.pipeline import stages as st
from fathom.pipeline.catalogue import BR_PHY, FABRIC_SWITCH
from fathom.openflow.arp import ARP_REQUEST, ETH_TYPE_ARP, ETH_TYPE_IPV4, arp_reply_actions
from fathom.model import UPLINK_INTERFACE, Snapshot
from fathom.model.routers import effective_modes, fabric_state, tenant_view
from fathom.model.views import Views

# the fabric switch's tables (fathom/pipeline/catalogue.py declares them)
FABRIC_TRUNK_IN = FABRIC_SWITCH.number("trunk-in")
FABRIC_SVI = FABRIC_SWITCH.number("svi")
FABRIC_SVI_NEIGH = FABRIC_SWITCH.number("svi-neigh")
FABRIC_L2 = FABRIC_SWITCH.number("l2")

PRIO_ALLOW = 100
PRIO_SVI_ARP = 200
PRIO_ROUTE_BASE = 100
PRIO_SVI_DROP = 10
PRIO_L2_HAIRPIN = 110
PRIO_L2 = 100
PRIO_FLOOD = 10
PRIO_PHY_TRUNK = 100

# br-phy's only table, and its ends of the trunk: the patch to br-int, the underlay port facing the fabric switch
PHY_NORMAL = BR_PHY.number("normal")
PHY_PATCH = "patch-int"
PHY_UNDERLAY = "ul0"


def _c(kind: int, obj: int) -> int:
    return st.cookie(st.APP_FABRIC, kind, obj)


def _vid(vlan: int) -> int:
    return OFPVID_PRESENT | vlan


# ---------------------------------------------------------------------------------------------- br-int and br-phy


def compile_edges(snapshot: Snapshot) -> dict[str, SwitchState]:
    """Fabric additions to br-int: frames for a fabric router's gateway MAC go up the VLAN trunk."""
    modes = effective_modes(snapshot)
    networks = {n.id: n for n in snapshot.networks}
    fabric_legs = [ri for ri in snapshot.router_interfaces if ri.router_id in modes
                   and modes[ri.router_id].mode == "fabric"
                   and networks.get(ri.network_id) is not None and networks[ri.network_id].type == "vlan"]
    out: dict[str, SwitchState] = {}
    if not fabric_legs:
        return out
    for node in snapshot.nodes:
        uplink = node.ofport(UPLINK_INTERFACE)
        local_nets = {p.network_id for p in snapshot.ports if p.node == node.name and node.ofport(p.interface)}
        flows = set()
        for ri in fabric_legs:
            if uplink is None or ri.network_id not in local_nets:
                continue
            net = networks[ri.network_id]
            flows.add(FlowSpec(st.L2, PRIO_L2, {st.REG_NETWORK: net.id, "eth_dst": ri.mac_address},
                               (PushVlan(0x8100), SetField("vlan_vid", _vid(net.segmentation_id)),
                                SetField(st.REG_OUT_PORT, uplink), GotoTable(st.TAP_RECOVERY)),
                               _c(st.KIND_ROUTER_INTERFACE, ri.id)))
        if flows:
            out[node.name] = SwitchState(frozenset(flows))
    return out


def compile_phy(snapshot: Snapshot) -> dict[str, SwitchState]:
    """br-phy of every node beyond its skeleton (NORMAL switching for the underlay, LLDP to the
    controller; fathom/pipeline/catalogue.py BR_PHY): the trunk between br-int and the fabric switch as a fixed
    pipe, for each node whose br-phy port numbers (`Node.phy_ofports`) are known.

    The pipe keeps br-phy from learning tenant MACs: a distributed router sends routed frames from
    its gateway MAC out of every node that routes, so a learning br-phy would place that MAC behind
    its own patch port and drop the frames a VM later sends to it over the trunk (router moved to
    the fabric or a network node) until the entry ages out.
    """
    out = {}
    for node in snapshot.nodes:
        flows = set()
        patch, underlay = node.phy_ofports.get(PHY_PATCH), node.phy_ofports.get(PHY_UNDERLAY)
        if patch is not None and underlay is not None:
            # everything br-int sends goes to the fabric switch; tagged frames from the fabric switch go to br-int
            flows.add(FlowSpec(PHY_NORMAL, PRIO_PHY_TRUNK, {"in_port": patch}, (Output(underlay),),
                               _c(st.KIND_STAGE, 0x102)))
            flows.add(FlowSpec(PHY_NORMAL, PRIO_PHY_TRUNK,
                               {"in_port": underlay, "vlan_vid": (OFPVID_PRESENT, OFPVID_PRESENT)},
                               (Output(patch),), _c(st.KIND_STAGE, 0x102)))
        out[node.name] = SwitchState(frozenset(flows))
    return out


# ---------------------------------------------------------------------------------------------- fabric switch


def vlans_sent(state: SwitchState | None) -> set[int]:
    """VLAN ids a br-int state tags frames with (flows and group buckets).

    br-int tags a frame only to send it up the trunk (its VM ports are access ports, and classify
    pops the tag of what comes in), so this is the set of VLANs the node can put on its trunk. It
    works on compiled states and on flows read back from a switch alike.
    """
    if state is None:
        return set()
    return set().union(*[f.vlans_set for f in state.flows if f.vlans_set],
                       *[g.vlans_set for g in state.groups if g.vlans_set])


def fabric_vlans(snapshot: Snapshot, brint: Mapping[str, SwitchState],
              views: Views | None = None) -> dict[str, dict[str, set[int]]]:
    """switch name -> {fabric switch port name: VLAN ids allowed on it}; `brint` is every node's compiled br-int."""
    view = tenant_view(snapshot, views)
    fab = fabric_state(snapshot)
    out = {}
    for sw in fab.switches:
        out[sw.name] = {port: set(vlans) for port, (_, vlans) in _trunks(view, fab, sw, brint).items()}
    return out


def _trunks(view: Snapshot, fab, sw, brint: Mapping[str, SwitchState]) -> dict[str, tuple[int | None, dict[int, int]]]:
    """port name -> (ofport, {VLAN id: network id}) for the trunk ports of switch `sw`: the VLAN
    networks with a port bound to the node behind the port, and every VLAN its br-int can send."""
    networks = {n.id: n for n in view.networks}
    vlan_net = {n.segmentation_id: n.id for n in view.networks if n.type == "vlan"}
    faces = fab.node_ports(sw)
    out = {port: (ofport, {}) for port, ofport in faces.values()}
    for p in view.ports:
        net = networks.get(p.network_id)
        if net is None or net.type != "vlan" or p.node not in faces:
            continue
        port, _ = faces[p.node]
        out[port][1][net.segmentation_id] = net.id
    for node, (port, _) in faces.items():
        for vlan in vlans_sent(brint.get(node)):
            if vlan in vlan_net:
                out[port][1][vlan] = vlan_net[vlan]
    return out


def compile_fabric_switches(snapshot: Snapshot, brint: Mapping[str, SwitchState],
                views: Views | None = None) -> dict[str, SwitchState]:
    """Desired state of every fabric switch, keyed by switch name. `brint`: the compiled br-int of
    every node (every app's part, fathom.apps.compile_all), which decides the VLANs on its trunk."""
    fab = fabric_state(snapshot)
    view = tenant_view(snapshot, views)
    return {sw.name: _compile_switch(snapshot, view, fab, sw, brint) for sw in fab.switches}


def _compile_switch(snapshot: Snapshot, view: Snapshot, fab, sw, brint: Mapping[str, SwitchState]) -> SwitchState:
    networks = {n.id: n for n in view.networks}
    subnets = {s.id: s for s in view.subnets}
    faces = fab.node_ports(sw)
    trunks = _trunks(view, fab, sw, brint)
    flows: set[FlowSpec] = set()
    groups: set[GroupSpec] = set()

    # trunk-in: VLAN allowed on a port; the flood group of each VLAN lists its ports
    ports_of_vlan: dict[int, list[int]] = defaultdict(list)
    for port_name, (ofport, vlans) in sorted(trunks.items()):
        if ofport is None:
            continue
        for vlan, net_id in sorted(vlans.items()):
            flows.add(FlowSpec(FABRIC_TRUNK_IN, PRIO_ALLOW, {"in_port": ofport, "vlan_vid": _vid(vlan)},
                               (GotoTable(FABRIC_SVI),), _c(st.KIND_NETWORK, net_id)))
            ports_of_vlan[vlan].append(ofport)
    vlan_net = {n.segmentation_id: n for n in networks.values() if n.type == "vlan"}
    for vlan, ofports in sorted(ports_of_vlan.items()):
        net = vlan_net[vlan]
        gid = st.group_id(st.APP_FABRIC, net.id)
        groups.add(GroupSpec(gid, "all", tuple((Output(p),) for p in sorted(ofports)),
                             _c(st.KIND_NETWORK, net.id)))
        flows.add(FlowSpec(FABRIC_L2, PRIO_FLOOD, {"vlan_vid": _vid(vlan)}, (Group(gid),), _c(st.KIND_NETWORK, net.id)))

    # l2: every port of a VLAN network behind a trunk port (also hairpin back out of its in_port)
    for p in view.ports:
        net = networks.get(p.network_id)
        if net is None or net.type != "vlan" or p.node not in faces or faces[p.node][1] is None:
            continue
        ofport = faces[p.node][1]
        m = {"vlan_vid": _vid(net.segmentation_id), "eth_dst": p.mac_address}
        flows.add(FlowSpec(FABRIC_L2, PRIO_L2, m, (Output(ofport),), _c(st.KIND_PORT, p.id)))
        flows.add(FlowSpec(FABRIC_L2, PRIO_L2_HAIRPIN, {**m, "in_port": ofport}, (Output(OFPP_IN_PORT),),
                           _c(st.KIND_PORT, p.id)))

    # svi: routers in fabric mode, on interfaces on VLAN networks
    interfaces_by_router = defaultdict(list)
    modes = effective_modes(snapshot)
    for ri in snapshot.router_interfaces:
        net = networks.get(ri.network_id)
        if ri.router_id in modes and modes[ri.router_id].mode == "fabric" and net is not None and net.type == "vlan" \
                and ri.subnet_id in subnets:
            interfaces_by_router[ri.router_id].append(ri)
    routed_to = set()
    for router_id, interfaces in sorted(interfaces_by_router.items()):
        for src in interfaces:
            vsrc = networks[src.network_id].segmentation_id
            c = _c(st.KIND_ROUTER_INTERFACE, src.id)
            flows.add(FlowSpec(FABRIC_SVI, PRIO_SVI_ARP,
                               {"vlan_vid": _vid(vsrc), "eth_type": ETH_TYPE_ARP, "arp_op": ARP_REQUEST,
                                "arp_tpa": src.ip_address}, arp_reply_actions(src.mac_address, src.ip_address), c))
            flows.add(FlowSpec(FABRIC_SVI, PRIO_SVI_DROP, {"vlan_vid": _vid(vsrc), "eth_dst": src.mac_address}, (), c))
            for dst in interfaces:
                if dst.subnet_id == src.subnet_id:
                    continue
                prefix = subnets[dst.subnet_id].prefix
                vdst = networks[dst.network_id].segmentation_id
                flows.add(FlowSpec(
                    FABRIC_SVI, PRIO_ROUTE_BASE + prefix.prefixlen,
                    {"vlan_vid": _vid(vsrc), "eth_dst": src.mac_address, "eth_type": ETH_TYPE_IPV4,
                     "ipv4_dst": (str(prefix.network_address), str(prefix.netmask))},
                    (SetField("eth_src", dst.mac_address), DecTtl(), SetField("vlan_vid", _vid(vdst)),
                     GotoTable(FABRIC_SVI_NEIGH)), _c(st.KIND_ROUTER_INTERFACE, dst.id)))
                routed_to.add(dst.network_id)
    # svi-neigh: host entries of the networks routed to (the controller knows every port's address)
    for p in view.ports:
        if p.network_id not in routed_to:
            continue
        vlan = networks[p.network_id].segmentation_id
        for fip in p.fixed_ips:
            flows.add(FlowSpec(FABRIC_SVI_NEIGH, PRIO_L2,
                               {"vlan_vid": _vid(vlan), "eth_type": ETH_TYPE_IPV4, "ipv4_dst": fip.ip_address},
                               (SetField("eth_dst", p.mac_address), GotoTable(FABRIC_L2)), _c(st.KIND_PORT, p.id)))
    return SwitchState(frozenset(flows), frozenset(groups))
