"""External networks, router gateways, SNAT and floating IPs: model -> br-int flows.

Centralised on the router's gateway node (the SONA design; docs/external.md says why): the gateway
node is the only node on the external network (its `ext0` port), holds every NAT binding of the
router in OVS conntrack and answers ARP for the router's gateway IP and its floating IPs, so the
upstream router learns exactly one location for each address. Compute nodes only carry a router's
outbound frames to the gateway node, in the frame's own tenant network (VXLAN or VLAN), addressed
to the router interface's MAC.

Per router with an external gateway G (hosted on node H), external network E:

- every node routing for the router (a local port on one of its networks), l3: IPv4 to the router
  MAC that no internal route claims → on H to snat, elsewhere to l2, whose flow for the router MAC
  sends it to H over the network's own path;
- H, classify: such frames arriving from other nodes (tunnel, uplink) → snat;
- H, snat: TTL − 1, MACs rewritten for E, `reg6` := E, `ct(commit, nat(src=…))`: the port's floating
  IP in the FIP's zone, else the gateway IP in the router's zone; then l2 of E → `ext0`;
- H, classify of `ext0` → nat-in: ARP for G's IP and the router's associated floating IPs answered;
  IPv4 to a floating IP → `ct(commit, zone=FIP, nat(dst=fixed IP))`; to G's IP → `ct(zone=router,
  nat)` (un-SNAT of replies; a new connection to G's IP finds no mapping and is dropped);
- H, nat-route (after conntrack, by `ct_zone`): the router's subnets → router interface MAC, TTL − 1,
  `reg6` := the tenant network; then l3-neighbor and l2 of the tenant network deliver it like any
  routed frame (the tenant compiler gives H those tables for every network of the router): so an
  inbound frame passes every stage a routed frame passes on its way to the port, ingress filtering
  included.

Each router and each floating IP has its own conntrack zone: tenants (and two routers with the
same private subnets) never share NAT state, and a floating IP's connections can be flushed alone
when it moves (fathom.controller.external).
"""
from __future__ import annotations

import ipaddress
from collections import defaultdict

from fathom.openflow.arp import ARP_REQUEST, ETH_TYPE_ARP, ETH_TYPE_IPV4, arp_reply_actions
from fathom.model import (
    EXTERNAL_INTERFACE, TUNNEL_INTERFACE, UPLINK_INTERFACE, FloatingIp, Network, Node, RouterGateway, Snapshot,
)
from fathom.model.routers import effective_modes
from fathom.openflow.spec import (
    OFPVID_NONE, OFPVID_PRESENT, Ct, DecTtl, FlowSpec, GotoTable, Nat, Output, PopVlan, PushVlan, SetField,
    SwitchState, set_tunnel_dst,
)
from fathom.pipeline import stages as st

PRIO_PORT = 100
PRIO_TO_GATEWAY = 110      # classify: above the tenant's per-network classification
PRIO_DEFAULT_ROUTE = 100   # l3: below every internal route (100 + prefix length, prefix length > 0)
PRIO_FLOATING = 200        # snat / nat-route: a port's floating IP before its subnet's SNAT
PRIO_SUBNET = 100          # + prefix length


def _cookie(kind: int, object_id: int) -> int:
    return st.cookie(st.APP_EXTERNAL, kind, object_id)


def unsupported_gateways(snapshot: Snapshot) -> dict[int, str]:
    """router id -> why its external gateway is not compiled (the API refuses these cases; a router
    moved behind the store's back still must not half work)."""
    modes = effective_modes(snapshot)
    return {gw.router_id: f"external gateways need mode distributed (router is {modes[gw.router_id].mode})"
            for gw in snapshot.router_gateways
            if gw.router_id in modes and modes[gw.router_id].mode != "distributed"}


def compile_external(snapshot: Snapshot) -> dict[str, SwitchState]:
    """Desired br-int flows of every node that has something of a router gateway, by node name."""
    nodes = {n.name: n for n in snapshot.nodes}
    networks = {n.id: n for n in snapshot.networks}
    subnets = {s.id: s for s in snapshot.subnets}
    skip = unsupported_gateways(snapshot)
    interfaces = defaultdict(list)
    for ri in sorted(snapshot.router_interfaces, key=lambda r: r.id):
        if ri.network_id in networks and ri.subnet_id in subnets:
            interfaces[ri.router_id].append(ri)
    local_networks = defaultdict(set)   # node -> networks with a bound port whose interface is there
    for p in snapshot.ports:
        node = nodes.get(p.node)
        if node is not None and node.ofport(p.interface) is not None:
            local_networks[node.name].add(p.network_id)
    fips = defaultdict(list)            # router id -> its associated floating IPs
    for f in sorted(snapshot.floating_ips, key=lambda f: f.id):
        if f.port_id is not None and f.router_id is not None and f.fixed_ip:
            fips[f.router_id].append(f)

    flows: dict[str, set[FlowSpec]] = defaultdict(set)
    for gw in sorted(snapshot.router_gateways, key=lambda g: g.router_id):
        host = nodes.get(gw.node)
        ext = networks.get(gw.network_id)
        if gw.router_id in skip or host is None or ext is None or host.ofport(EXTERNAL_INTERFACE) is None:
            continue
        legs = interfaces[gw.router_id]
        flows[host.name] |= _gateway_node_flows(host, ext, gw, legs, subnets, networks, fips[gw.router_id])
        for node in snapshot.nodes:
            routed = [ri for ri in legs if ri.network_id in local_networks[node.name]]
            flows[node.name] |= _default_route_flows(node, host, gw, routed, networks)
    return {name: SwitchState(frozenset(f)) for name, f in flows.items() if f}


def _vid(network: Network) -> int:
    return OFPVID_PRESENT | network.segmentation_id


def _gateway_node_flows(host: Node, ext: Network, gw: RouterGateway, legs, subnets, networks,
                        fips: list[FloatingIp]) -> set[FlowSpec]:
    ext_port = host.ofport(EXTERNAL_INTERFACE)
    c_net = _cookie(st.KIND_NETWORK, ext.id)
    c_gw = _cookie(st.KIND_ROUTER, gw.router_id)
    on_ext = {st.REG_NETWORK: ext.id}
    flows = set()

    # the external network on the gateway node: in through ext0, out to the upstream router
    if ext.type == "vlan":
        flows.add(FlowSpec(st.CLASSIFY, PRIO_PORT, {"in_port": ext_port, "vlan_vid": _vid(ext)},
                           (PopVlan(), SetField(st.REG_NETWORK, ext.id), GotoTable(st.NAT_IN)), c_net))
        to_ext = (PushVlan(0x8100), SetField("vlan_vid", _vid(ext)), SetField(st.REG_OUT_PORT, ext_port))
    else:
        flows.add(FlowSpec(st.CLASSIFY, PRIO_PORT, {"in_port": ext_port, "vlan_vid": OFPVID_NONE},
                           (SetField(st.REG_NETWORK, ext.id), GotoTable(st.NAT_IN)), c_net))
        to_ext = (SetField(st.REG_OUT_PORT, ext_port),)
    flows.add(FlowSpec(st.OUTPUT, PRIO_PORT, {st.REG_OUT_PORT: ext_port}, (Output(ext_port),), c_net))
    if ext.upstream_mac:
        flows.add(FlowSpec(st.L2, PRIO_PORT, {**on_ext, "eth_dst": ext.upstream_mac},
                           to_ext + (GotoTable(st.TAP_RECOVERY),), c_net))

    def arp(ip: str, cookie: int) -> FlowSpec:
        reply = arp_reply_actions(gw.mac_address, ip)
        if ext.type == "vlan":   # classify popped the tag: the reply goes back out tagged
            reply = reply[:-1] + (PushVlan(0x8100), SetField("vlan_vid", _vid(ext))) + reply[-1:]
        return FlowSpec(st.NAT_IN, PRIO_PORT, {**on_ext, "eth_type": ETH_TYPE_ARP, "arp_op": ARP_REQUEST,
                                               "arp_tpa": ip}, reply, cookie)

    def leaving(zone: int, nat_ip: str) -> tuple:
        return (DecTtl(), SetField("eth_src", gw.mac_address), SetField("eth_dst", ext.upstream_mac),
                SetField(st.REG_NETWORK, ext.id), Ct(zone, commit=True, nat=Nat("src", nat_ip)), GotoTable(st.L2))

    def entering(ri) -> tuple:
        return (DecTtl(), SetField("eth_src", ri.mac_address), SetField(st.REG_NETWORK, ri.network_id),
                GotoTable(st.L3_NEIGHBOR))

    ip = {"eth_type": ETH_TYPE_IPV4}
    # the router's own address: ARP, and replies to its SNAT
    flows.add(arp(gw.ip_address, c_gw))
    flows.add(FlowSpec(st.NAT_IN, PRIO_PORT, {**on_ext, **ip, "ipv4_dst": gw.ip_address},
                       (Ct(gw.ct_zone, table=st.NAT_ROUTE, nat=Nat()),), c_gw))
    for ri in legs:
        prefix = subnets[ri.subnet_id].prefix
        net = (str(prefix.network_address), str(prefix.netmask))
        flows.add(FlowSpec(st.NAT_ROUTE, PRIO_SUBNET + prefix.prefixlen,
                           {"ct_zone": gw.ct_zone, **on_ext, **ip, "ipv4_dst": net}, entering(ri), c_gw))
        # frames for the router from other nodes (carried in the tenant network to the router's MAC)
        for match, decap in _from_other_nodes(host, networks[ri.network_id]):
            flows.add(FlowSpec(st.CLASSIFY, PRIO_TO_GATEWAY, {**match, "eth_dst": ri.mac_address},
                               decap + (SetField(st.REG_NETWORK, ri.network_id), GotoTable(st.SNAT)), c_gw))
        if gw.snat and ext.upstream_mac:
            flows.add(FlowSpec(st.SNAT, PRIO_SUBNET + prefix.prefixlen,
                               {st.REG_NETWORK: ri.network_id, "eth_dst": ri.mac_address, **ip, "ipv4_src": net},
                               leaving(gw.ct_zone, gw.ip_address), c_gw))

    # floating IPs: 1:1, each in its own zone
    for f in fips:
        c = _cookie(st.KIND_FLOATING_IP, f.id)
        ri = next((r for r in legs if ipaddress.IPv4Address(f.fixed_ip) in subnets[r.subnet_id].prefix), None)
        if ri is None:   # the router lost the port's subnet: nothing to route to
            continue
        flows.add(arp(f.ip_address, c))
        flows.add(FlowSpec(st.NAT_IN, PRIO_PORT, {**on_ext, **ip, "ipv4_dst": f.ip_address},
                           (Ct(f.ct_zone, commit=True, table=st.NAT_ROUTE, nat=Nat("dst", f.fixed_ip)),), c))
        flows.add(FlowSpec(st.NAT_ROUTE, PRIO_FLOATING, {"ct_zone": f.ct_zone, **on_ext, **ip,
                                                         "ipv4_dst": f.fixed_ip}, entering(ri), c))
        if ext.upstream_mac:
            flows.add(FlowSpec(st.SNAT, PRIO_FLOATING, {st.REG_NETWORK: ri.network_id, "eth_dst": ri.mac_address,
                                                        **ip, "ipv4_src": f.fixed_ip},
                               leaving(f.ct_zone, f.ip_address), c))
    return flows


def _from_other_nodes(host: Node, net: Network) -> list[tuple[dict, tuple]]:
    """(match, decapsulating actions) of a network's frames arriving at the gateway node from others."""
    tunnel, uplink = host.ofport(TUNNEL_INTERFACE), host.ofport(UPLINK_INTERFACE)
    if net.type == "vxlan":
        return [({"in_port": tunnel, "tunnel_id": net.segmentation_id}, ())] if tunnel is not None else []
    if uplink is None:
        return []
    if net.type == "vlan":
        return [({"in_port": uplink, "vlan_vid": _vid(net)}, (PopVlan(),))]
    return [({"in_port": uplink, "vlan_vid": OFPVID_NONE}, ())]


def _default_route_flows(node: Node, host: Node, gw: RouterGateway, routed, networks) -> set[FlowSpec]:
    """On a node routing for the router: what no internal route claims goes to the gateway node."""
    c = _cookie(st.KIND_ROUTER, gw.router_id)
    flows = set()
    for ri in routed:
        to_router = {st.REG_NETWORK: ri.network_id, "eth_dst": ri.mac_address}
        if node.name == host.name:
            flows.add(FlowSpec(st.L3, PRIO_DEFAULT_ROUTE, {**to_router, "eth_type": ETH_TYPE_IPV4},
                               (GotoTable(st.SNAT),), c))
            continue
        carry = _towards(node, host, networks[ri.network_id])
        if carry is None:
            continue
        flows.add(FlowSpec(st.L3, PRIO_DEFAULT_ROUTE, {**to_router, "eth_type": ETH_TYPE_IPV4},
                           (GotoTable(st.L2),), c))
        flows.add(FlowSpec(st.L2, PRIO_PORT, to_router, carry + (GotoTable(st.TAP_RECOVERY),), c))
    return flows


def _towards(node: Node, host: Node, net: Network) -> tuple | None:
    """Actions carrying a frame of `net` from `node` to the gateway node (before output)."""
    tunnel, uplink = node.ofport(TUNNEL_INTERFACE), node.ofport(UPLINK_INTERFACE)
    if net.type == "vxlan":
        if tunnel is None or not host.tunnel_ip:
            return None
        return (SetField("tunnel_id", net.segmentation_id), set_tunnel_dst(host.tunnel_ip),
                SetField(st.REG_OUT_PORT, tunnel))
    if uplink is None:
        return None
    if net.type == "vlan":
        return (PushVlan(0x8100), SetField("vlan_vid", _vid(net)), SetField(st.REG_OUT_PORT, uplink))
    return (SetField(st.REG_OUT_PORT, uplink),)
