"""A consistent, immutable snapshot of the store: the only input of the pure compilers.

`load_snapshot(session)` reads every table in one transaction. Runtime facts that live in the
switches, not in the store (the OpenFlow port numbers of br-int), are added by the controller with
`Snapshot.with_ofports()` before compiling.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace
from typing import Mapping

# Interface names on br-int that the node bootstrap creates.
TUNNEL_INTERFACE = "vxlan0"      # flow-based VXLAN port: options remote_ip=flow, key=flow
UPLINK_INTERFACE = "patch-phy"   # patch port to br-phy: the VLAN / flat uplink


@dataclass(frozen=True)
class Node:
    id: int
    name: str
    role: str                      # compute | gateway
    tunnel_ip: str | None          # VXLAN endpoint address (on br-phy)
    management_ip: str | None      # where the controller reaches its OVSDB
    state: str = "init"            # bootstrap: init | device_created | complete | error
    # Runtime, filled in by the controller: br-int interface name -> OpenFlow port number.
    ofports: Mapping[str, int] = field(default_factory=dict, hash=False)

    def ofport(self, interface: str | None) -> int | None:
        return self.ofports.get(interface) if interface else None


@dataclass(frozen=True)
class Network:
    id: int
    name: str
    project_id: str
    type: str                      # vxlan | vlan | flat
    segmentation_id: int | None    # VNI (vxlan), VLAN id (vlan), None (flat)


@dataclass(frozen=True)
class Subnet:
    id: int
    name: str
    project_id: str
    network_id: int
    cidr: str                      # e.g. "10.0.0.0/24"
    gateway_ip: str | None

    @property
    def prefix(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.cidr)


@dataclass(frozen=True)
class FixedIp:
    subnet_id: int
    ip_address: str


@dataclass(frozen=True)
class Port:
    """A workload port (VM, VNF). Router interfaces are `RouterInterface`s, not `Port`s."""
    id: int
    name: str
    project_id: str
    network_id: int
    mac_address: str
    fixed_ips: tuple[FixedIp, ...] = ()
    node: str | None = None        # name of the node the port is bound to
    interface: str | None = None   # OVS interface name of the port on that node's br-int
    port_security: bool = True     # only its own MAC and IPs may be sent from it


@dataclass(frozen=True)
class Router:
    id: int
    name: str
    project_id: str


@dataclass(frozen=True)
class RouterInterface:
    """A router's leg on one subnet; `id` is the id of the port that holds its address."""
    id: int
    router_id: int
    subnet_id: int
    network_id: int
    ip_address: str                # the gateway address of the subnet on this router
    mac_address: str


@dataclass(frozen=True)
class TapPolicy:
    """A vTAP policy (fathom/pipeline/vtap.py compiles it). A `*_port_id` of None means the port
    was deleted under the policy; `filters` is a sorted tuple of (field, value) pairs."""
    id: int
    name: str
    project_id: str
    sender_port_id: int | None
    receiver_port_id: int | None
    receiver_is_port: bool
    receiver_mac: str
    receiver_ip: str
    monitor_port_ids: tuple[int | None, ...]
    direction: str = "forward"       # forward (sender -> receiver) | both
    priority: int = 100
    filters: tuple = ()
    truncate: int | None = None
    rate_pps: int | None = None


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[Node, ...] = ()
    networks: tuple[Network, ...] = ()
    subnets: tuple[Subnet, ...] = ()
    ports: tuple[Port, ...] = ()
    routers: tuple[Router, ...] = ()
    router_interfaces: tuple[RouterInterface, ...] = ()
    tap_policies: tuple[TapPolicy, ...] = ()
    # Fabric: fabric switches, their links, router modes (fathom.store.fabric.FabricState).
    # None when loaded without it; compilers treat None as "no fabric, every router distributed".
    fabric: object | None = None

    def with_ofports(self, ofports: Mapping[str, Mapping[str, int]]) -> "Snapshot":
        """A copy whose nodes carry br-int port numbers: {node name: {interface: ofport}}."""
        nodes = tuple(replace(n, ofports=dict(ofports.get(n.name, n.ofports))) for n in self.nodes)
        return replace(self, nodes=nodes)


def load_snapshot(session) -> Snapshot:
    """Read the whole store into a Snapshot, consistently (one transaction; reads only).

    Call with a fresh Session: `with Session(engine) as s: snap = load_snapshot(s)`.
    """
    from sqlalchemy import select

    from fathom.store import models as m

    def run():
        node_names = {}
        nodes = []
        for n in session.scalars(select(m.Node).order_by(m.Node.id)):
            node_names[n.id] = n.name
            nodes.append(Node(n.id, n.name, n.role, n.tunnel_ip, n.management_ip, n.state))
        networks = tuple(Network(n.id, n.name, n.project_id, n.type, n.segmentation_id)
                         for n in session.scalars(select(m.Network).order_by(m.Network.id)))
        subnets = tuple(Subnet(s.id, s.name, s.project_id, s.network_id, s.cidr, s.gateway_ip)
                        for s in session.scalars(select(m.Subnet).order_by(m.Subnet.id)))
        allocations: dict[int, list[FixedIp]] = {}
        for a in session.scalars(select(m.IpAllocation).order_by(m.IpAllocation.id)):
            allocations.setdefault(a.port_id, []).append(FixedIp(a.subnet_id, a.ip_address))
        ports, interfaces = [], []
        for p in session.scalars(select(m.Port).order_by(m.Port.id)):
            fixed = tuple(allocations.get(p.id, ()))
            if p.router_id is not None:
                for fip in fixed[:1]:
                    interfaces.append(RouterInterface(p.id, p.router_id, fip.subnet_id, p.network_id,
                                                      fip.ip_address, p.mac_address))
                continue
            ports.append(Port(p.id, p.name, p.project_id, p.network_id, p.mac_address, fixed,
                              node_names.get(p.node_id), p.interface_name, p.port_security))
        routers = tuple(Router(r.id, r.name, r.project_id)
                        for r in session.scalars(select(m.Router).order_by(m.Router.id)))
        taps = tuple(TapPolicy(t.id, t.name, t.project_id, t.sender_port_id, t.receiver_port_id,
                               t.receiver_is_port, t.receiver_mac, t.receiver_ip,
                               (t.monitor_port_id,) + ((t.monitor2_port_id,) if t.has_monitor2 else ()),
                               t.direction, t.priority, tuple(sorted((t.filters or {}).items())),
                               t.truncate, t.rate_pps)
                     for t in session.scalars(select(m.TapPolicy).order_by(m.TapPolicy.id)))
        from fathom.store.fabric import load_fabric  # fabric switches, links, router modes
        return Snapshot(tuple(nodes), networks, subnets, tuple(ports), routers, tuple(interfaces),
                        tap_policies=taps, fabric=load_fabric(session))

    if session.in_transaction():
        return run()
    from fathom.store.db import READ_ONLY

    with session.begin():
        options = dict(READ_ONLY)
        if session.get_bind().dialect.name == "postgresql":
            # Several SELECTs must see one state: READ COMMITTED (the default) would not.
            options["isolation_level"] = "REPEATABLE READ"
        session.connection(execution_options=options)
        return run()
