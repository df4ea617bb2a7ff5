"""Tenant networking compiler: store snapshot -> desired flows and groups of every node's br-int.

Pure: no I/O, no globals; the same snapshot always gives the same specs. What each stage does and
why is in docs/pipeline.md; in short, for node N:

- classify: a local port's frames get REG_NETWORK / REG_SRC_PORT; frames from the tunnel are
  classified by tunnel_id (VNI), from the uplink by VLAN id (untagged = the flat network), and go
  straight to l2: they were switched or routed by their first-hop node already.
- security: a port sends only from its MAC and, for IPv4 and ARP, from its fixed IPs.
- dhcp (in security): a local port's DHCP requests (udp 68 -> 67) go only to this node's DHCP
  port of its network (`dhp<network>`, the node agent's dnsmasq), straight to output: never
  flooded, never tunnelled; a port sending as a DHCP server (udp 67 -> 68) is dropped. Frames
  from the DHCP port enter the network at arp.
- arp: requests for any bound port's address or a router interface's address in the network are
  answered in the switch (the requester asking about its own address is left alone).
- l3 / l3-neighbor: a frame to a router interface's MAC, for a subnet on the same router, gets
  src MAC := the outgoing interface's MAC, TTL - 1, REG_NETWORK := the destination network, and
  dst MAC := the destination port's MAC; then l2 of the destination network switches it.
- l2: dst MAC -> local port, or the owning node's tunnel endpoint (tun_id = VNI), or the VLAN
  uplink; everything else is flooded through the network's group: local ports plus every other
  node hosting the network (VXLAN) or the uplink (VLAN, flat). A flow to a port on another node
  over the tunnel samples first when the port's project samples what its ports send (flow records:
  observation point tunnel-egress + the port, fathom.model.flow_records).
- output: REG_OUT_PORT -> output.

Nothing ever moves a frame from one network to another except an l3 route flow, which is how
isolation holds; tests/unit/test_compiler_tenant.py checks it by walking the compiled tables.
"""
from __future__ import annotations

import bisect
import ipaddress
from collections import defaultdict

from fathom.openflow.spec import (
    OFPVID_NONE, OFPVID_PRESENT, DecTtl, FlowSpec, GotoTable, Group, GroupSpec,
    Output, PopVlan, PushVlan, SetField, SwitchState, set_tunnel_dst,
)
from fathom.model import flow_records as fr
from fathom.model.hostlocal_desired import dhcp_mac, dhcp_server_addresses
from fathom.openflow.arp import ARP_REQUEST, ETH_TYPE_ARP, ETH_TYPE_IPV4, arp_reply_actions
from fathom.pipeline import stages as st
from fathom.pipeline.infrastructure import refused_ports
from fathom.pipeline.sampling import sample
from fathom.model import (
    TUNNEL_INTERFACE, UPLINK_INTERFACE, Network, Node, Port, RouterInterface, Snapshot,
)
from fathom.model.views import Views, get

# Priorities within a stage (higher wins).
PRIO_PORT = 100           # classify by in_port / tunnel / VLAN; l2 unicast; output
PRIO_SECURITY_ALLOW = 100
PRIO_DHCP = 120           # security: DHCP requests to the node's DHCP port, rogue servers dropped
UDP = 17
DHCP_SERVER_PORT, DHCP_CLIENT_PORT = 67, 68
PRIO_SECURITY_DENY = 90   # IPv4 / ARP from a port with a source address not its own
PRIO_SECURITY_OTHER = 80  # other ethertypes from the port's own MAC
PRIO_ARP_OWN = 110        # a port asking about its own address (DAD, gratuitous ARP): not answered
PRIO_ARP_REPLY = 100
PRIO_ROUTE_BASE = 100     # + prefix length: longest prefix wins
PRIO_ROUTER_DROP = 10     # to a router MAC but no route: drop rather than flood
PRIO_NEIGHBOR = 100
PRIO_FLOOD = 10           # l2: broadcast, multicast and unknown unicast

def compile_tenant(snapshot: Snapshot, only: frozenset | None = None,
                   views: Views | None = None) -> dict[str, SwitchState]:
    """Desired br-int state of every node in the snapshot, keyed by node name.

    The table-miss flows are the pipeline's, not the tenant's (fathom.apps.PIPELINE). Ports whose node or
    interface has no OpenFlow port number yet are left out; remote nodes are reached only when
    this node's tunnel / uplink port number is known.

    `only`: a set of owners (cookie kind, object id); then only the flows and groups those owners'
    cookies name are built (the incremental path: fathom.apps.tenant.compile_owners). The same
    code builds both, so the flows of an owner are the same whichever way they were asked for.
    """
    topo = topology(snapshot, views)
    rates = get(views, snapshot, "tenant_tunnel_rates", lambda s, _v: fr.ingress_rates(s.flow_sampling))
    return {node.name: _compile_node(topo, node, rates, only) for node in _nodes_of(snapshot, topo, only, views)}


def _nodes_of(snapshot: Snapshot, topo: "_Topology", only: frozenset | None, views: Views | None):
    """The nodes where the owners `only` may have flows (every node for None, or for an owner of a
    kind not told apart here): a port's flows and a network's are only on the nodes where that
    network is local, routed to or reached from a router's gateway (those whose `_compile_node`
    looks at it); a node's on itself. A new port's owners: the nodes of its network, not all."""
    if only is None:
        return snapshot.nodes
    networks, node_ids = set(), set()
    for kind, object_id in only:
        if kind == st.KIND_PORT:
            port = topo.ports.get(object_id)
            if port is not None:        # a port the topology leaves out has no flows anywhere
                networks.add(port.network_id)
        elif kind == st.KIND_NETWORK:
            networks.add(object_id)
        elif kind == st.KIND_NODE:
            node_ids.add(object_id)
        else:
            return snapshot.nodes
    scopes = node_scopes(snapshot, views)

    def reached(node: Node) -> bool:
        local, routed_to = scopes[node.name]
        return not networks.isdisjoint(local | routed_to | topo.gateway_networks.get(node.name, set()))
    return [n for n in snapshot.nodes if n.id in node_ids or reached(n)]


def node_scopes(snapshot: Snapshot, views: Views | None = None) -> dict[str, tuple[frozenset, frozenset]]:
    """node name -> (networks local to it: it has a plugged port there; networks it routes to).
    A node's flows for a network depend on the network's membership in these two sets: when they
    change, owners beyond the changed ports are touched (fathom.apps.tenant.touched). Once per
    snapshot; patched for a change of ports and nodes only (the nodes they are on worked out again)."""
    return get(views, snapshot, "tenant_scopes", _node_scopes, _patch_node_scopes)


def _node_scopes(snapshot: Snapshot, views: Views | None) -> dict[str, tuple[frozenset, frozenset]]:
    topo = topology(snapshot, views)
    return {node.name: _node_scope(topo, node) for node in snapshot.nodes}


def _node_scope(topo: "_Topology", node: Node) -> tuple[frozenset, frozenset]:
    return _scope(topo, {p.network_id for p, _ in topo.local_ports(node)})


def _scope(topo: "_Topology", local: set[int]) -> tuple[frozenset, frozenset]:
    """A node's scope from the networks local to it."""
    return frozenset(local), frozenset(_route_flows(topo, sorted(local), lambda k, o: False)[1])


def _patch_node_scopes(scopes: dict, snapshot: Snapshot, delta, views: Views) -> dict | None:
    if delta.fields & _TOPOLOGY_FIELDS:
        return None
    topo = topology(snapshot, views)
    out = dict(scopes)
    left = delta.nodes | {p.node for p in delta.before.values()}
    for name in delta.nodes | delta.port_nodes():
        scope = out.pop(name, None)
        if name not in topo.nodes:
            continue
        node = topo.nodes[name]
        if scope is not None and name not in left:
            # the node's ports were only joined by some (new ones, or ones moved here) and its port
            # numbers are the same: its local networks are those before and the joiners' (a look at
            # the changed ports, not at every port of the node)
            joined = {p.network_id for p in delta.after.values()
                      if p.node == name and p.id in topo.ports and node.ofport(p.interface) is not None}
            out[name] = scope if joined <= scope[0] else _scope(topo, scope[0] | joined)
        else:
            out[name] = _node_scope(topo, node)
    return out


def topology(snapshot: Snapshot, views: Views | None = None) -> "_Topology":
    """The tenant compiler's look-ups over `snapshot` (_Topology), once per snapshot; patched for a
    change of ports and nodes only."""
    return get(views, snapshot, "tenant_topology", _Topology, _Topology.patched)


def _tenant_cookie(kind: int, object_id: int) -> int:
    return st.cookie(st.APP_TENANT, kind, object_id)


def flood_group_id(network_id: int) -> int:
    return st.group_id(st.APP_TENANT, network_id)


_TOPOLOGY_FIELDS = frozenset({"networks", "subnets", "router_interfaces", "router_gateways"})


class _Topology:
    """Look-ups over a snapshot (built once per snapshot: the compile and `node_scopes` share it)."""

    def __init__(self, snapshot: Snapshot, views: Views | None = None):
        self.nodes = {n.name: n for n in snapshot.nodes}
        refused = refused_ports(snapshot, views)
        self.networks = {n.id: n for n in snapshot.networks}
        self.subnets = {s.id: s for s in snapshot.subnets}
        self.dhcp_servers = dhcp_server_addresses(snapshot, views)     # subnet id -> DHCP server address
        # Only bound ports take part in forwarding: an unbound port is nowhere.
        self.ports: dict[int, Port] = {}
        self.ports_by_network: dict[int, list[Port]] = defaultdict(list)
        self.ports_by_node: dict[str, list[Port]] = defaultdict(list)   # each in id order
        for p in sorted(snapshot.ports, key=lambda p: p.id):
            if self._takes_part(p, refused):
                self.ports[p.id] = p
                self.ports_by_network[p.network_id].append(p)
                self.ports_by_node[p.node].append(p)
        self.interfaces_by_router: dict[int, list[RouterInterface]] = defaultdict(list)
        self.interfaces_by_network: dict[int, list[RouterInterface]] = defaultdict(list)
        for ri in sorted(snapshot.router_interfaces, key=lambda r: r.id):
            if ri.network_id in self.networks and ri.subnet_id in self.subnets:
                self.interfaces_by_router[ri.router_id].append(ri)
                self.interfaces_by_network[ri.network_id].append(ri)
        # A router's gateway node routes frames from the external network into every network of
        # the router (fathom/apps/external): it needs their l3-neighbor and l2 flows.
        self.gateway_networks: dict[str, set[int]] = defaultdict(set)
        for gw in snapshot.router_gateways:
            if gw.node is not None:
                self.gateway_networks[gw.node] |= {ri.network_id for ri in self.interfaces_by_router[gw.router_id]}

    def _takes_part(self, p: Port, refused: dict) -> bool:
        return p.node in self.nodes and p.network_id in self.networks and p.id not in refused

    @classmethod
    def patched(cls, old: "_Topology", snapshot: Snapshot, delta, views: Views) -> "_Topology | None":
        """`old` (the snapshot before's) with the changed ports and nodes of `delta` (None when
        anything else the look-ups hold changed). What `old` holds is shared, not changed: the
        lists of a network or node a changed port is (or was) on are made again."""
        if delta.fields & _TOPOLOGY_FIELDS:
            return None
        topo = cls.__new__(cls)
        topo.__dict__.update(old.__dict__)
        topo.nodes = {n.name: n for n in snapshot.nodes}
        topo.dhcp_servers = dhcp_server_addresses(snapshot, views)
        refused = refused_ports(snapshot, views)
        topo.ports = dict(old.ports)
        by_network, by_node = defaultdict(list, old.ports_by_network), defaultdict(list, old.ports_by_node)
        networks, nodes = defaultdict(list), defaultdict(list)   # key -> the changed ports there now
        for port_id in delta.ports:
            p = topo.ports.pop(port_id, None)
            if p is not None:
                networks.setdefault(p.network_id, [])
                nodes.setdefault(p.node, [])
            p = delta.after.get(port_id)
            if p is not None and topo._takes_part(p, refused):
                topo.ports[port_id] = p
                networks[p.network_id].append(p)
                nodes[p.node].append(p)
        first = min(delta.ports, default=None)
        for index, changed in ((by_network, networks), (by_node, nodes)):
            for key, added in changed.items():
                kept = _replaced(index.get(key, []), first, delta.ports, added)
                if kept:
                    index[key] = kept
                else:
                    index.pop(key, None)
        topo.ports_by_network, topo.ports_by_node = by_network, by_node
        return topo

    def local_ports(self, node: Node) -> list[tuple[Port, int]]:
        """(port, ofport) of the ports bound to `node` whose interface is on its br-int, in id order
        (a look-up of that node's ports: a compile of every node costs O(ports), not nodes x ports)."""
        return [(p, ofport) for p in self.ports_by_node.get(node.name, ())
                if (ofport := node.ofport(p.interface)) is not None]


def _port_id(p: Port) -> int:
    return p.id


def _replaced(ports: list[Port], first: int, ids: frozenset, added: list[Port]) -> list[Port]:
    """A copy of `ports` (in id order) without the ports whose ids are in `ids` (`first`: the least
    of them) and with `added` (ports of those ids), in id order. The ports before `first` are kept
    as they are (a slice): a new port, whose id is above every other, costs no look at the others."""
    start = bisect.bisect_left(ports, first, key=_port_id)
    rest = [p for p in ports[start:] if p.id not in ids] + added
    rest.sort(key=_port_id)
    return ports[:start] + rest


def _everyone(_kind: int, _object_id: int) -> bool:
    return True


def _compile_node(topo: _Topology, node: Node, rates: dict[str, int], only: frozenset | None = None) -> SwitchState:
    """`only`: build just the flows and groups of these owners ((kind, object id)); None: all.
    `rates`: project -> the flow-records rate of what leaves through the tunnel to its ports."""
    want = _everyone if only is None else (lambda kind, object_id: (kind, object_id) in only)
    flows: set[FlowSpec] = set()
    groups: set[GroupSpec] = set()
    tunnel = node.ofport(TUNNEL_INTERFACE)
    uplink = node.ofport(UPLINK_INTERFACE)

    local = topo.local_ports(node)
    local_networks = sorted({p.network_id for p, _ in local})
    for port, ofport in local:
        if want(st.KIND_PORT, port.id):
            flows |= _local_port_flows(port, ofport)
            flows |= _dhcp_client_flows(port, node.ofport(dhcp_interface(port.network_id)))

    for network_id in local_networks:
        network = topo.networks[network_id]
        flows |= _arp_responder_flows(topo, network, want)
        if not want(st.KIND_NETWORK, network_id):
            continue
        flows |= _network_classify_flows(network, tunnel, uplink)
        dhcp = node.ofport(dhcp_interface(network_id))
        if dhcp is not None:
            flows |= _dhcp_port_flows(topo, network_id, dhcp)
        group = _flood_group(topo, node, network, local, tunnel, uplink)
        groups.add(group)
        flows.add(FlowSpec(st.L2, PRIO_FLOOD, {st.REG_NETWORK: network.id},
                           (Group(group.group_id),),
                           _tenant_cookie(st.KIND_NETWORK, network.id)))

    route_flows, routed_to = _route_flows(topo, local_networks, want)
    flows |= route_flows
    routed_to |= topo.gateway_networks.get(node.name, set())
    for network_id in sorted(routed_to):
        flows |= _neighbor_flows(topo, topo.networks[network_id], want)

    # l2 unicast for every network a frame can be in on this node: local ones and routed-to ones.
    for network_id in sorted(set(local_networks) | routed_to):
        flows |= _unicast_flows(topo, node, topo.networks[network_id], tunnel, uplink, rates, want)

    if want(st.KIND_NODE, node.id):
        for ofport in (tunnel, uplink):
            if ofport is not None:
                flows.add(FlowSpec(st.OUTPUT, PRIO_PORT, {st.REG_OUT_PORT: ofport}, (Output(ofport),),
                                   _tenant_cookie(st.KIND_NODE, node.id)))
    return SwitchState(frozenset(flows), frozenset(groups))


# ---------------------------------------------------------------------------------------------- ports


def _local_port_flows(port: Port, ofport: int) -> set[FlowSpec]:
    """classify, security, own-address ARP pass and output of one local port."""
    c = _tenant_cookie(st.KIND_PORT, port.id)
    src = {st.REG_SRC_PORT: port.id}
    flows = {
        FlowSpec(st.CLASSIFY, PRIO_PORT, {"in_port": ofport},
                 (SetField(st.REG_NETWORK, port.network_id), SetField(st.REG_SRC_PORT, port.id),
                  GotoTable(st.TAP_INGRESS)), c),
        FlowSpec(st.OUTPUT, PRIO_PORT, {st.REG_OUT_PORT: ofport}, (Output(ofport),), c),
    }
    to_arp = (GotoTable(st.ARP),)
    if not port.port_security:
        flows.add(FlowSpec(st.SECURITY, PRIO_SECURITY_OTHER, src, to_arp, c))
    else:
        mac = port.mac_address
        for fip in port.fixed_ips:
            ip = fip.ip_address
            flows.add(FlowSpec(st.SECURITY, PRIO_SECURITY_ALLOW,
                               {**src, "eth_src": mac, "eth_type": ETH_TYPE_IPV4, "ipv4_src": ip},
                               to_arp, c))
            flows.add(FlowSpec(st.SECURITY, PRIO_SECURITY_ALLOW,
                               {**src, "eth_src": mac, "eth_type": ETH_TYPE_ARP, "arp_spa": ip,
                                "arp_sha": mac}, to_arp, c))
        flows.add(FlowSpec(st.SECURITY, PRIO_SECURITY_DENY, {**src, "eth_type": ETH_TYPE_IPV4}, (), c))
        flows.add(FlowSpec(st.SECURITY, PRIO_SECURITY_DENY, {**src, "eth_type": ETH_TYPE_ARP}, (), c))
        flows.add(FlowSpec(st.SECURITY, PRIO_SECURITY_OTHER, {**src, "eth_src": mac}, to_arp, c))
    # A port asking about its own address (duplicate address detection, gratuitous ARP) must not
    # get an answer from the switch, or it would believe its address is taken.
    for fip in port.fixed_ips:
        flows.add(FlowSpec(st.ARP, PRIO_ARP_OWN,
                           {**src, "eth_type": ETH_TYPE_ARP, "arp_op": ARP_REQUEST,
                            "arp_tpa": fip.ip_address}, (GotoTable(st.SFC),), c))
    return flows


def dhcp_interface(network_id: int) -> str:
    """br-int interface of a network's DHCP server on a node (fathom.model.hostlocal.DhcpServer)."""
    return f"dhp{network_id}"


def _dhcp_client_flows(port: Port, dhcp_ofport: int | None) -> set[FlowSpec]:
    """A port's DHCP requests reach only its node's DHCP port of its network (dropped when the node
    has none); DHCP answers sent by the port (a rogue server) are dropped."""
    c = _tenant_cookie(st.KIND_PORT, port.id)
    src = {st.REG_SRC_PORT: port.id, "eth_type": ETH_TYPE_IPV4, "ip_proto": UDP}
    to_server = () if dhcp_ofport is None else (SetField(st.REG_OUT_PORT, dhcp_ofport), GotoTable(st.OUTPUT))
    return {
        FlowSpec(st.SECURITY, PRIO_DHCP,
                 {**src, "eth_src": port.mac_address, "udp_src": DHCP_CLIENT_PORT, "udp_dst": DHCP_SERVER_PORT},
                 to_server, c),
        FlowSpec(st.SECURITY, PRIO_DHCP, {**src, "udp_src": DHCP_SERVER_PORT, "udp_dst": DHCP_CLIENT_PORT}, (), c),
    }


def _dhcp_port_flows(topo: _Topology, network_id: int, ofport: int) -> set[FlowSpec]:
    """The node's DHCP port of a network: classified into the network (fathom's own port, trusted:
    no security stage), its output, and ARP for the server's address answered with its MAC (a
    client renews by unicast; the address and MAC are the same on every node, so this node's
    answer is right wherever the client is)."""
    c = _tenant_cookie(st.KIND_NETWORK, network_id)
    flows = {
        FlowSpec(st.CLASSIFY, PRIO_PORT, {"in_port": ofport},
                 (SetField(st.REG_NETWORK, network_id), GotoTable(st.ARP)), c),
        FlowSpec(st.OUTPUT, PRIO_PORT, {st.REG_OUT_PORT: ofport}, (Output(ofport),), c),
    }
    mac = dhcp_mac(network_id)
    for subnet_id, ip in topo.dhcp_servers.items():
        if topo.subnets[subnet_id].network_id == network_id:
            flows.add(FlowSpec(st.ARP, PRIO_ARP_REPLY,
                               {st.REG_NETWORK: network_id, "eth_type": ETH_TYPE_ARP, "arp_op": ARP_REQUEST,
                                "arp_tpa": ip}, arp_reply_actions(mac, ip), c))
    return flows


# ---------------------------------------------------------------------------------------------- networks


def _vlan_vid(network: Network) -> int:
    return OFPVID_PRESENT | network.segmentation_id


def _network_classify_flows(network: Network, tunnel: int | None, uplink: int | None) -> set[FlowSpec]:
    """Frames of `network` arriving from other nodes (tunnel) or the physical network (uplink)."""
    c = _tenant_cookie(st.KIND_NETWORK, network.id)
    set_network = SetField(st.REG_NETWORK, network.id)
    to_l2 = GotoTable(st.L2)
    if network.type == "vxlan" and tunnel is not None:
        return {FlowSpec(st.CLASSIFY, PRIO_PORT,
                         {"in_port": tunnel, "tunnel_id": network.segmentation_id},
                         (set_network, to_l2), c)}
    if network.type == "vlan" and uplink is not None:
        return {FlowSpec(st.CLASSIFY, PRIO_PORT, {"in_port": uplink, "vlan_vid": _vlan_vid(network)},
                         (PopVlan(), set_network, to_l2), c)}
    if network.type == "flat" and uplink is not None:
        return {FlowSpec(st.CLASSIFY, PRIO_PORT, {"in_port": uplink, "vlan_vid": OFPVID_NONE},
                         (set_network, to_l2), c)}
    return set()


def _arp_responder_flows(topo: _Topology, network: Network, want=_everyone) -> set[FlowSpec]:
    flows = set()

    def reply(ip: str, mac: str, c: int):
        flows.add(FlowSpec(st.ARP, PRIO_ARP_REPLY,
                           {st.REG_NETWORK: network.id, "eth_type": ETH_TYPE_ARP,
                            "arp_op": ARP_REQUEST, "arp_tpa": ip},
                           arp_reply_actions(mac, ip), c))

    for port in topo.ports_by_network[network.id]:
        if want(st.KIND_PORT, port.id):
            for fip in port.fixed_ips:
                reply(fip.ip_address, port.mac_address, _tenant_cookie(st.KIND_PORT, port.id))
    for ri in topo.interfaces_by_network[network.id]:
        if want(st.KIND_ROUTER_INTERFACE, ri.id):
            reply(ri.ip_address, ri.mac_address, _tenant_cookie(st.KIND_ROUTER_INTERFACE, ri.id))
    return flows


def _placement_actions(topo: _Topology, node: Node, network: Network, port: Port,
                       tunnel: int | None, uplink: int | None) -> tuple | None:
    """Actions that carry a frame to `port` from `node` (before output), or None if it can't."""
    if port.node == node.name:
        ofport = node.ofport(port.interface)
        return None if ofport is None else (SetField(st.REG_OUT_PORT, ofport),)
    if network.type == "vxlan":
        remote = topo.nodes[port.node]
        if tunnel is None or not remote.tunnel_ip:
            return None
        return (SetField("tunnel_id", network.segmentation_id), set_tunnel_dst(remote.tunnel_ip),
                SetField(st.REG_OUT_PORT, tunnel))
    if uplink is None:
        return None
    if network.type == "vlan":
        return (PushVlan(0x8100), SetField("vlan_vid", _vlan_vid(network)),
                SetField(st.REG_OUT_PORT, uplink))
    return (SetField(st.REG_OUT_PORT, uplink),)  # flat: untagged on the uplink


def _unicast_flows(topo: _Topology, node: Node, network: Network, tunnel: int | None, uplink: int | None,
                   rates: dict[str, int], want=_everyone) -> set[FlowSpec]:
    """l2: to each port of `network` (local, over the tunnel or the uplink). A flow into the tunnel
    is shared by every sender on this node: it samples at the port's project's rate."""
    flows = set()
    for port in topo.ports_by_network[network.id]:
        if not want(st.KIND_PORT, port.id):
            continue
        actions = _placement_actions(topo, node, network, port, tunnel, uplink)
        if actions is None:
            continue
        if port.node != node.name and network.type == "vxlan":
            actions = sample(rates.get(port.project_id, 0), fr.TUNNEL_EGRESS, port.id) + actions
        flows.add(FlowSpec(st.L2, PRIO_PORT,
                           {st.REG_NETWORK: network.id, "eth_dst": port.mac_address},
                           actions + (GotoTable(st.TAP_EGRESS),),
                           _tenant_cookie(st.KIND_PORT, port.id)))
    return flows


def _flood_group(topo: _Topology, node: Node, network: Network, local: list[tuple[Port, int]],
                 tunnel: int | None, uplink: int | None) -> GroupSpec:
    """Broadcast / unknown unicast of `network`: every local port, and every other node hosting it.

    The bucket towards the port (or tunnel, or uplink) a frame came in on is harmless: OpenFlow
    never outputs a frame to its in_port unless told to with IN_PORT.
    """
    buckets = [(Output(ofport),) for p, ofport in local if p.network_id == network.id]
    if network.type == "vxlan":
        if tunnel is not None:
            remote_ips = sorted(
                {topo.nodes[p.node].tunnel_ip for p in topo.ports_by_network[network.id]
                 if p.node != node.name and topo.nodes[p.node].tunnel_ip},
                key=ipaddress.ip_address)
            buckets += [(SetField("tunnel_id", network.segmentation_id), set_tunnel_dst(ip),
                         Output(tunnel)) for ip in remote_ips]
    elif uplink is not None:
        if network.type == "vlan":
            buckets.append((PushVlan(0x8100), SetField("vlan_vid", _vlan_vid(network)),
                            Output(uplink)))
        else:
            buckets.append((Output(uplink),))
    return GroupSpec(flood_group_id(network.id), "all", tuple(buckets),
                     _tenant_cookie(st.KIND_NETWORK, network.id))


# ---------------------------------------------------------------------------------------------- routing


def _route_flows(topo: _Topology, local_networks: list[int], want=_everyone) -> tuple[set[FlowSpec], set[int]]:
    """l3 flows for every router with an interface on a local network (those of owners `want`
    accepts); also the networks routed to (always all of them)."""
    flows: set[FlowSpec] = set()
    routed_to: set[int] = set()
    local = set(local_networks)
    for router_id, interfaces in sorted(topo.interfaces_by_router.items()):
        for src in interfaces:
            if src.network_id not in local:
                continue
            # A frame to the router that no route claims is dropped, not flooded.
            if want(st.KIND_ROUTER_INTERFACE, src.id):
                flows.add(FlowSpec(st.L3, PRIO_ROUTER_DROP,
                                   {st.REG_NETWORK: src.network_id, "eth_dst": src.mac_address}, (),
                                   _tenant_cookie(st.KIND_ROUTER_INTERFACE, src.id)))
            for dst in interfaces:
                if dst.subnet_id == src.subnet_id:
                    continue
                routed_to.add(dst.network_id)
                if not want(st.KIND_ROUTER_INTERFACE, dst.id):
                    continue
                prefix = topo.subnets[dst.subnet_id].prefix
                flows.add(FlowSpec(
                    st.L3, PRIO_ROUTE_BASE + prefix.prefixlen,
                    {st.REG_NETWORK: src.network_id, "eth_dst": src.mac_address,
                     "eth_type": ETH_TYPE_IPV4,
                     "ipv4_dst": (str(prefix.network_address), str(prefix.netmask))},
                    (SetField("eth_src", dst.mac_address), DecTtl(),
                     SetField(st.REG_NETWORK, dst.network_id), GotoTable(st.L3_NEIGHBOR)),
                    _tenant_cookie(st.KIND_ROUTER_INTERFACE, dst.id)))
    return flows, routed_to


def _neighbor_flows(topo: _Topology, network: Network, want=_everyone) -> set[FlowSpec]:
    """Routed frames in `network`: destination IP -> destination MAC."""
    flows = set()
    for port in topo.ports_by_network[network.id]:
        if not want(st.KIND_PORT, port.id):
            continue
        for fip in port.fixed_ips:
            flows.add(FlowSpec(st.L3_NEIGHBOR, PRIO_NEIGHBOR,
                               {st.REG_NETWORK: network.id, "eth_type": ETH_TYPE_IPV4,
                                "ipv4_dst": fip.ip_address},
                               (SetField("eth_dst", port.mac_address), GotoTable(st.L2)),
                               _tenant_cookie(st.KIND_PORT, port.id)))
    return flows
