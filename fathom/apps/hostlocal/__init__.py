"""Host-local desired state of every node: a pure function of the model.

Not an OpenFlow app: its output is what each node's agent must hold on its host (router
namespaces of `network-node` routers, DHCP servers, PPTMon attachments: the operator's, and those
of port chains measured with `pptmon`, fathom.apps.hostlocal.chains), as the typed objects of
fathom.model.hostlocal, each with its owner. `desired(snapshot, attachments)` gives
{node name: [object, ...]} for every node of the model (a node with nothing to hold gets []).
"""
from __future__ import annotations

import ipaddress

from fathom.apps.hostlocal.chains import chain_attachments
from fathom.model import Snapshot
from fathom.model.hostlocal import (DhcpHost, DhcpServer, DhcpSubnet, PptmonAttach, RouterLeg,
                                    RouterNamespace)
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


# DHCP: the MTU a VM must use on a network with a 1500-byte underlay. VXLAN adds 50 bytes
# (outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8) that must fit in the underlay's 1500.
UNDERLAY_MTU = 1500
VXLAN_OVERHEAD = 50
LEASE_TIME = 86400


def network_mtu(network_type: str, underlay_mtu: int = UNDERLAY_MTU) -> int:
    return underlay_mtu - VXLAN_OVERHEAD if network_type == "vxlan" else underlay_mtu


def dhcp_mac(network_id: int) -> str:
    """The DHCP server's MAC on a network: the same on every node (a locally administered
    address built from the network id), so an ARP for the server answered by several nodes'
    servers is answered identically."""
    b = network_id.to_bytes(4, "big")
    return "0e:dc:" + ":".join(f"{x:02x}" for x in b)


def dhcp_server_ip(subnet, taken: set[str]) -> str | None:
    """The server's address on `subnet`: the highest host address no port, router interface or
    gateway holds (the same on every node: a function of the whole subnet, not of one node)."""
    net = subnet.prefix
    if net.num_addresses < 4:
        return None
    ip = net.broadcast_address - 1
    while ip > net.network_address:
        if str(ip) not in taken:
            return str(ip)
        ip -= 1
    return None


def dhcp_server_addresses(snapshot: Snapshot) -> dict[int, str]:
    """subnet id -> the DHCP server's address on it, for every DHCP-enabled subnet (memoised per
    snapshot: the tenant compiler answers ARP for these addresses)."""
    def make(snap: Snapshot) -> dict[int, str]:
        networks = {n.id for n in snap.networks}
        taken: dict[int, set[str]] = {}
        for p in snap.ports:
            for f in p.fixed_ips:
                taken.setdefault(f.subnet_id, set()).add(f.ip_address)
        for ri in snap.router_interfaces:
            taken.setdefault(ri.subnet_id, set()).add(ri.ip_address)
        out = {}
        for s in sorted(snap.subnets, key=lambda x: x.id):
            if s.enable_dhcp and s.network_id in networks:
                ip = dhcp_server_ip(s, taken.get(s.id, set()) | ({s.gateway_ip} if s.gateway_ip else set()))
                if ip is not None:
                    out[s.id] = ip
        return out
    return snapshot.memo("dhcp_server_addresses", make)


def dhcp_servers(snapshot: Snapshot, underlay_mtu: int = UNDERLAY_MTU) -> dict[str, list[DhcpServer]]:
    """node -> the DHCP servers it must run: one per network that has a DHCP-enabled subnet and
    a port bound to that node, answering exactly those local ports (static leases only)."""
    networks = {n.id: n for n in snapshot.networks}
    subnets = {s.id: s for s in snapshot.subnets}
    dhcp_subnets: dict[int, DhcpSubnet] = {}
    of_network: dict[int, list[DhcpSubnet]] = {}   # network id -> its DHCP subnets, in subnet id order
    for sid, server in dhcp_server_addresses(snapshot).items():
        s = subnets[sid]
        dhcp_subnets[s.id] = DhcpSubnet(s.id, s.cidr, f"{server}/{s.prefix.prefixlen}", s.gateway_ip,
                                        tuple(s.dns_nameservers), tuple(tuple(r) for r in s.host_routes))
        of_network.setdefault(s.network_id, []).append(dhcp_subnets[s.id])
    hosts: dict[tuple[str, int], list[DhcpHost]] = {}
    for p in sorted(snapshot.ports, key=lambda x: x.id):
        if not p.node:
            continue
        for f in p.fixed_ips:
            if f.subnet_id in dhcp_subnets and subnets[f.subnet_id].network_id == p.network_id:
                hosts.setdefault((p.node, p.network_id), []).append(
                    DhcpHost(p.mac_address.lower(), f.ip_address, f.subnet_id, f"port-{p.id}"))
    out: dict[str, list[DhcpServer]] = {}
    for (node, nid), hs in sorted(hosts.items()):
        out.setdefault(node, []).append(DhcpServer(nid, dhcp_mac(nid), network_mtu(networks[nid].type, underlay_mtu),
                                                   LEASE_TIME, tuple(of_network[nid]), tuple(hs)))
    return out


def desired(snapshot: Snapshot, attachments=()) -> dict[str, list]:
    """{node name: [host-local object]} for every node. `attachments`: the operator's PPTMon
    attachments (fathom.model.hostlocal.PptmonAttach) by node name, as (node, PptmonAttach) pairs;
    the port chains with `pptmon` add theirs (fathom.apps.hostlocal.chains)."""
    out: dict[str, list] = {n.name: [] for n in snapshot.nodes}
    for node, namespaces in router_namespaces(snapshot).items():
        if node in out:
            out[node].extend(namespaces)
    for node, servers in dhcp_servers(snapshot).items():
        if node in out:
            out[node].extend(servers)
    every = [*attachments, *chain_attachments(snapshot)]
    for node, attach in sorted(every, key=lambda x: (x[0], x[1].owner_kind, x[1].attachment_id)):
        if node in out:
            out[node].append(attach)
    return out


__all__ = ["desired", "dhcp_servers", "router_namespaces", "PptmonAttach"]
