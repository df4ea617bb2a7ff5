"""Host-local desired state of every node: a pure function of the model.

Not an OpenFlow app: its output is what each node's agent must hold on its host (router
namespaces of `network-node` routers, DHCP servers, PPTMon attachments: the operator's, and those
of port chains measured with `pptmon`, fathom.model.chains), as the typed objects of
fathom.model.hostlocal, each with its owner. `desired(snapshot, attachments)` gives
{node name: [object, ...]} for every node of the model (a node with nothing to hold gets []).
A caller that follows one store from snapshot to snapshot uses `Desired()`, which gives the same
but builds DHCP servers again only where ports changed (DhcpServers), so its cost follows the
change, not the cloud.
"""
from __future__ import annotations

import ipaddress

from fathom.model.chains import chain_attachments
from fathom.model import Snapshot
from fathom.model.hostlocal import (DhcpHost, DhcpServer, DhcpSubnet, PptmonAttach, RouterLeg,
                                    RouterNamespace)
from fathom.model.routers import network_node_legs
from fathom.model.views import Views, get


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


def dhcp_server_addresses(snapshot: Snapshot, views: Views | None = None) -> dict[int, str]:
    """subnet id -> the DHCP server's address on it, for every DHCP-enabled subnet (kept per
    snapshot: the tenant compiler answers ARP for these addresses; patched for a change of ports:
    the subnets of their addresses worked out again)."""
    return get(views, snapshot, "dhcp_server_addresses", _dhcp_server_addresses, _patch_dhcp_server_addresses)


def _dhcp_server_addresses(snap: Snapshot, views: Views | None) -> dict[int, str]:
    taken, networks = _taken(snap, views), {n.id for n in snap.networks}
    return {s.id: ip for s in sorted(snap.subnets, key=lambda x: x.id)
            if (ip := _server(s, networks, taken)) is not None}


def _patch_dhcp_server_addresses(servers: dict, snap: Snapshot, delta, views: Views) -> dict | None:
    if delta.fields & _ADDRESS_FIELDS:
        return None
    taken, networks = _taken(snap, views), {n.id for n in snap.networks}
    subnets = {s.id: s for s in snap.subnets}
    out = dict(servers)
    for subnet_id in {f.subnet_id for m in (delta.before, delta.after) for p in m.values() for f in p.fixed_ips}:
        out.pop(subnet_id, None)
        if subnet_id in subnets and (ip := _server(subnets[subnet_id], networks, taken)) is not None:
            out[subnet_id] = ip
    return dict(sorted(out.items()))


def _server(s, networks: set, taken: dict) -> str | None:
    if not s.enable_dhcp or s.network_id not in networks:
        return None
    return dhcp_server_ip(s, taken.get(s.id, {}).keys() | ({s.gateway_ip} if s.gateway_ip else set()))


_ADDRESS_FIELDS = frozenset({"networks", "subnets", "router_interfaces"})


def _taken(snapshot: Snapshot, views: Views | None) -> dict[int, dict[str, int]]:
    """subnet id -> address -> how many ports and router interfaces hold it (patched per change)."""
    return get(views, snapshot, "dhcp_taken", _count_taken, _patch_taken)


def _count_taken(snap: Snapshot, _views=None) -> dict[int, dict[str, int]]:
    taken: dict[int, dict[str, int]] = {}
    for p in snap.ports:
        for f in p.fixed_ips:
            held = taken.setdefault(f.subnet_id, {})
            held[f.ip_address] = held.get(f.ip_address, 0) + 1
    for ri in snap.router_interfaces:
        held = taken.setdefault(ri.subnet_id, {})
        held[ri.ip_address] = held.get(ri.ip_address, 0) + 1
    return taken


def _patch_taken(taken: dict, _snap: Snapshot, delta, _views=None) -> dict | None:
    if delta.fields & _ADDRESS_FIELDS:
        return None
    out = dict(taken)
    copied: set[int] = set()
    for m, step in ((delta.before, -1), (delta.after, 1)):
        for p in m.values():
            for f in p.fixed_ips:
                if f.subnet_id not in copied:
                    out[f.subnet_id] = dict(out.get(f.subnet_id, {}))
                    copied.add(f.subnet_id)
                held = out[f.subnet_id]
                held[f.ip_address] = held.get(f.ip_address, 0) + step
                if not held[f.ip_address]:
                    del held[f.ip_address]
    return out


def _dhcp_networks(snapshot: Snapshot, underlay_mtu: int,
                   views: Views | None = None) -> dict[int, tuple[int, tuple[DhcpSubnet, ...]]]:
    """network id -> (its MTU, its DHCP subnets in subnet id order), for every network with one."""
    networks = {n.id: n for n in snapshot.networks}
    subnets = {s.id: s for s in snapshot.subnets}
    of_network: dict[int, list[DhcpSubnet]] = {}
    for sid, server in sorted(dhcp_server_addresses(snapshot, views).items()):
        s = subnets[sid]
        of_network.setdefault(s.network_id, []).append(
            DhcpSubnet(s.id, s.cidr, f"{server}/{s.prefix.prefixlen}", s.gateway_ip,
                       tuple(s.dns_nameservers), tuple(tuple(r) for r in s.host_routes)))
    return {nid: (network_mtu(networks[nid].type, underlay_mtu), tuple(subs)) for nid, subs in of_network.items()}


class DhcpServers:
    """`dhcp_servers(snapshot)` kept from one snapshot to the next: a port that changed (a new
    Port object) rebuilds only the servers of its (node, network) before and after, and the
    others are the very objects of the last call (so the callers' digests and JSON of them,
    kept by object, are found again). A server that only new ports joined, each above every port it
    held, is the last one's hosts and theirs (not its every port sorted again). A change of any
    network's DHCP subnets, MTU or server address starts again from nothing. Equal to the pure
    function after any sequence of snapshots (tests/unit/test_hostlocal_kept.py)."""

    def __init__(self, underlay_mtu: int = UNDERLAY_MTU):
        self.underlay_mtu = underlay_mtu
        self._networks: dict | None = None            # _dhcp_networks of the last snapshot
        self._ports: dict[int, object] = {}           # port id -> its Port in the last snapshot
        self._members: dict[tuple[str, int], dict[int, tuple[DhcpHost, ...]]] = {}  # (node, net) -> port -> leases
        self._servers: dict[str, dict[int, DhcpServer]] = {}   # node -> network id -> server
        self._last: dict[tuple[str, int], int] = {}   # (node, net) -> the highest port id its server holds
        self.rebuilt = 0                              # (node, network) servers built by the last call

    def __call__(self, snapshot: Snapshot, views: Views | None = None) -> dict[str, list[DhcpServer]]:
        """`views`: those of the pass compiling `snapshot` (fathom.model.views), where the servers'
        addresses are kept (patched per change of ports, not counted over every port)."""
        networks = _dhcp_networks(snapshot, self.underlay_mtu, views)
        if networks != self._networks:
            self._networks, self._ports, self._members, self._servers, self._last = networks, {}, {}, {}, {}
        subnet_network = {sub.subnet_id: nid for nid, (_, subs) in networks.items() for sub in subs}
        dirty: set[tuple[str, int]] = set()
        whole: set[tuple[str, int]] = set()               # servers to build from all their ports
        joined: dict[tuple[str, int], list] = {}          # else: the leases of the ports that joined
        for p in snapshot.ports:
            old = self._ports.get(p.id)
            if old is p:
                continue
            if old is not None:
                self._leave(old, dirty, whole)
            self._ports[p.id] = p
            self._join(p, subnet_network, dirty, whole, joined)
        if len(self._ports) > len(snapshot.ports):   # some ports are gone
            present = {p.id for p in snapshot.ports}
            for pid in [pid for pid in self._ports if pid not in present]:
                self._leave(self._ports.pop(pid), dirty, whole)
        for key in dirty:
            node, nid = key
            leases = self._members.get(key)
            servers = self._servers.setdefault(node, {})
            if not leases:
                self._members.pop(key, None)
                self._last.pop(key, None)
                servers.pop(nid, None)
                continue
            if key in whole or nid not in servers:
                hosts = tuple(h for pid in sorted(leases) for h in leases[pid])
                self._last[key] = max(leases)
            elif key in joined:
                hosts = servers[nid].hosts + tuple(h for _, held in joined[key] for h in held)
            else:
                continue     # joined by ports with no lease of it: the server as it was
            mtu, subs = networks[nid]
            servers[nid] = DhcpServer(nid, dhcp_mac(nid), mtu, LEASE_TIME, subs, hosts)
        self.rebuilt = len(dirty)
        return {node: [servers[nid] for nid in sorted(servers)] for node, servers in sorted(self._servers.items())
                if servers}

    def _join(self, p, subnet_network: dict[int, int], dirty: set, whole: set, joined: dict) -> None:
        if not p.node:
            return
        key = (p.node, p.network_id)
        leases = tuple(DhcpHost(p.mac_address.lower(), f.ip_address, f.subnet_id, f"port-{p.id}")
                       for f in p.fixed_ips if subnet_network.get(f.subnet_id, -1) == p.network_id)
        dirty.add(key)
        if leases:
            self._members.setdefault(key, {})[p.id] = leases
            if p.id > self._last.get(key, p.id):      # past every port its server holds (joiners in id order)
                joined.setdefault(key, []).append((p.id, leases))
                self._last[key] = p.id
            else:
                whole.add(key)

    def _leave(self, p, dirty: set, whole: set) -> None:
        if not p.node:
            return
        key = (p.node, p.network_id)
        dirty.add(key)
        whole.add(key)
        self._members.get(key, {}).pop(p.id, None)


def dhcp_servers(snapshot: Snapshot, underlay_mtu: int = UNDERLAY_MTU) -> dict[str, list[DhcpServer]]:
    """node -> the DHCP servers it must run: one per network that has a DHCP-enabled subnet and
    a port bound to that node, answering exactly those local ports (static leases only)."""
    return DhcpServers(underlay_mtu)(snapshot)


class Desired:
    """`desired(snapshot, attachments)` whose DHCP servers are kept from one call to the next
    (DhcpServers): for a caller that follows one store from snapshot to snapshot."""

    def __init__(self):
        self.dhcp = DhcpServers()

    def __call__(self, snapshot: Snapshot, attachments=(), views: Views | None = None) -> dict[str, list]:
        return desired(snapshot, attachments, lambda s: self.dhcp(s, views))


def desired(snapshot: Snapshot, attachments=(), dhcp=dhcp_servers) -> dict[str, list]:
    """{node name: [host-local object]} for every node. `attachments`: the operator's PPTMon
    attachments (fathom.model.hostlocal.PptmonAttach) by node name, as (node, PptmonAttach) pairs;
    the port chains with `pptmon` add theirs (fathom.model.chains). `dhcp`: how the DHCP
    servers are worked out (`dhcp_servers`, or a DhcpServers kept by the caller)."""
    out: dict[str, list] = {n.name: [] for n in snapshot.nodes}
    for node, namespaces in router_namespaces(snapshot).items():
        if node in out:
            out[node].extend(namespaces)
    for node, servers in dhcp(snapshot).items():
        if node in out:
            out[node].extend(servers)
    every = [*attachments, *chain_attachments(snapshot)]
    for node, attach in sorted(every, key=lambda x: (x[0], x[1].owner_kind, x[1].attachment_id)):
        if node in out:
            out[node].append(attach)
    return out


__all__ = ["Desired", "DhcpServers", "desired", "dhcp_servers", "router_namespaces", "PptmonAttach"]
