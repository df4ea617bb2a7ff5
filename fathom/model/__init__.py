"""The model the compilers read: plain immutable values, no SQLAlchemy, no I/O.

A `Snapshot` is one consistent view of the store (fathom.store.snapshot.load_snapshot builds it in
one transaction) plus facts that live in the switches, not in the store: the OpenFlow port numbers
of each br-int (`Snapshot.with_ofports`), of each br-phy (`Snapshot.with_phy_ofports`) and of each
fabric switch (`FabricState.with_ofports`), added by the controller before compiling. Datapath ids of every switch fathom programs are defined here too, so
compilers, the controller and tests name switches the same way.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace
from typing import Mapping

from fathom.model.flow_records import FlowSampling

# Interface names on br-int that the node bootstrap creates.
TUNNEL_INTERFACE = "vxlan0"      # flow-based VXLAN port: options remote_ip=flow, key=flow
UPLINK_INTERFACE = "patch-phy"   # patch port to br-phy: the VLAN / flat uplink
# A gateway node's port on the external (provider) network, plugged into its br-int by the operator
# (in the lab: a veth to the upstream host). Frames on it belong to external networks only.
EXTERNAL_INTERFACE = "ext0"


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
    # Runtime, the same for the node's br-phy (its patch to br-int and its underlay port).
    phy_ofports: Mapping[str, int] = field(default_factory=dict, hash=False)
    # OVS datapath of its bridges: the operator's choice, else what its agent reported (system where
    # the kernel module is loaded, netdev otherwise); None while neither is known
    datapath_type: str | None = None

    def ofport(self, interface: str | None) -> int | None:
        return self.ofports.get(interface) if interface else None


@dataclass(frozen=True)
class Network:
    id: int
    name: str
    project_id: str
    type: str                      # vxlan | vlan | flat
    segmentation_id: int | None    # VNI (vxlan), VLAN id (vlan), None (flat)
    external: bool = False         # a provider network reaching the gateway nodes (router:external)
    upstream_mac: str | None = None  # external networks: MAC of the provider router (the subnet's gateway_ip)


@dataclass(frozen=True)
class Subnet:
    id: int
    name: str
    project_id: str
    network_id: int
    cidr: str                      # e.g. "10.0.0.0/24"
    gateway_ip: str | None
    # DHCP: answered on each node by its agent (fathom.model.hostlocal_desired.dhcp_servers)
    enable_dhcp: bool = True
    dns_nameservers: tuple[str, ...] = ()
    host_routes: tuple[tuple[str, str], ...] = ()    # (destination cidr, nexthop)

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
    port_security: bool = True     # only its own MAC and IPs may be sent from it; security groups apply
    security_groups: tuple[int, ...] = ()   # ids of its security groups (fathom/apps/secgroups)


@dataclass(frozen=True)
class Router:
    id: int
    name: str
    project_id: str


@dataclass(frozen=True)
class RouterInterface:
    """A router's interface on one subnet; `id` is the id of the port that holds its address."""
    id: int
    router_id: int
    subnet_id: int
    network_id: int
    ip_address: str                # the gateway address of the subnet on this router
    mac_address: str


@dataclass(frozen=True)
class RouterGateway:
    """A router's external gateway: its address on an external network, hosted on one gateway node,
    where the router's SNAT and floating IPs are realised (fathom/apps/external)."""
    router_id: int
    network_id: int                # the external network
    subnet_id: int
    ip_address: str
    mac_address: str
    node: str | None               # name of the gateway node
    ct_zone: int                   # conntrack zone of the router's SNAT
    snat: bool = True              # ports without a floating IP reach out through the gateway IP
    address_port_id: int = 0       # the unbound port of the external network holding ip_address


@dataclass(frozen=True)
class FloatingIp:
    """An address of an external network mapped 1:1 to a port's fixed IP (when `port_id` is set)."""
    id: int
    project_id: str
    network_id: int
    ip_address: str
    ct_zone: int                   # conntrack zone of this floating IP's connections
    port_id: int | None = None
    fixed_ip: str | None = None
    router_id: int | None = None   # the router joining the port's subnet to the external network
    address_port_id: int = 0       # the unbound port of the external network holding ip_address


@dataclass(frozen=True)
class TapPolicy:
    """A vTAP policy (fathom/apps/vtap compiles it). A `*_port_id` of None means the port
    was deleted under the policy (or, for the sender, that it is "*": anyone, `sender_is_port`
    False); `filters` is a sorted tuple of (field, value) pairs."""
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
    sender_is_port: bool = True      # False: sender "*", what the receiver port receives from anyone


@dataclass(frozen=True)
class SecurityGroup:
    id: int
    name: str
    project_id: str


@dataclass(frozen=True)
class SecurityGroupRule:
    """One rule of a security group (Neutron semantics): what a port of the group may send (egress)
    or receive (ingress). `protocol` is an IP protocol number, None for any; for TCP, UDP and SCTP
    `port_min`..`port_max` is the destination port range, for ICMP(v6) they are type and code
    (None = any). At most one of `remote_prefix` (a CIDR) and `remote_group_id` is set; neither
    means any address of the ethertype."""
    id: int
    group_id: int
    direction: str                 # ingress | egress
    ethertype: str                 # IPv4 | IPv6
    protocol: int | None = None
    port_min: int | None = None
    port_max: int | None = None
    remote_prefix: str | None = None
    remote_group_id: int | None = None
# ---------------------------------------------------------------------------------------------- service chains
@dataclass(frozen=True)
class PortPair:
    """A VNF instance (networking-sfc's port pair): traffic enters it on `ingress_port_id` and
    leaves on `egress_port_id` (two ports of one network; fathom/apps/sfc steers through it)."""
    id: int
    name: str
    project_id: str
    ingress_port_id: int
    egress_port_id: int


@dataclass(frozen=True)
class PortPairGroup:
    """Interchangeable instances of one VNF: a flow goes through one of them (by a hash of its
    5-tuple). `port_pair_ids` in id order: the order of the select group's buckets."""
    id: int
    name: str
    project_id: str
    port_pair_ids: tuple[int, ...]


@dataclass(frozen=True)
class FlowClassifier:
    """Which traffic enters a chain: IPv4 sent by `logical_source_port_id` (to
    `logical_destination_port_id` when given) matching the L3/L4 fields; None = any.
    Port ranges are inclusive (low, high)."""
    id: int
    name: str
    project_id: str
    logical_source_port_id: int
    logical_destination_port_id: int | None = None
    protocol: int | None = None
    source_ip_prefix: str | None = None
    destination_ip_prefix: str | None = None
    source_port_range: tuple[int, int] | None = None
    destination_port_range: tuple[int, int] | None = None


@dataclass(frozen=True)
class ChainPptmon:
    """PPTMon on a chain: the first group's instances sample one packet every `period_ns` (0 = every
    packet), every VNF of the chain adds its processing time (fathom.model.chains.chain_pptmon)."""
    period_ns: int


@dataclass(frozen=True)
class PortChain:
    """Classified traffic goes through each group of `port_pair_group_ids` in order, then on to its
    destination; `symmetric`: replies (classified by the mirrored classifiers at the destination
    port) go back through the same instances in reverse order. `pptmon`: measured by PPTMon, or
    None (off)."""
    id: int
    name: str
    project_id: str
    port_pair_group_ids: tuple[int, ...]
    flow_classifier_ids: tuple[int, ...]
    symmetric: bool = False
    pptmon: ChainPptmon | None = None


# ---------------------------------------------------------------------------------------------- fabric
@dataclass(frozen=True)
class FabricSwitch:
    id: int
    name: str
    management_ip: str
    bridge: str
    vlan_min: int
    vlan_max: int


@dataclass(frozen=True)
class Link:
    switch_id: int
    port_name: str
    ofport: int | None
    node: str            # node name
    source: str          # lldp | declared
    last_seen: float | None = None


@dataclass(frozen=True)
class Mode:
    router_id: int
    mode: str
    gateway_node: str | None = None


@dataclass(frozen=True)
class FabricState:
    switches: tuple[FabricSwitch, ...] = ()
    links: tuple[Link, ...] = ()
    modes: tuple[Mode, ...] = ()
    # runtime (filled in by the controller): switch name -> {port name: OpenFlow port number}
    ofports: Mapping[str, Mapping[str, int]] = field(default_factory=dict, hash=False)

    def mode_of(self, router_id: int) -> Mode:
        for md in self.modes:
            if md.router_id == router_id:
                return md
        return Mode(router_id, "distributed")

    def with_ofports(self, ofports: Mapping[str, Mapping[str, int]]) -> "FabricState":
        return replace(self, ofports={k: dict(v) for k, v in ofports.items()})

    def node_ports(self, switch: FabricSwitch) -> dict[str, tuple[str, int | None]]:
        """node name -> (fabric switch port name, ofport) for the nodes behind `switch`.

        An LLDP-learned link wins over a declared one for the same node (the declared wiring is
        only a fallback); among several, the most recently seen.
        """
        best: dict[str, Link] = {}
        for link in self.links:
            if link.switch_id != switch.id:
                continue
            have = best.get(link.node)
            rank = (link.source == "lldp", link.last_seen or 0)
            if have is None or rank > (have.source == "lldp", have.last_seen or 0):
                best[link.node] = link
        ports = self.ofports.get(switch.name, {})
        return {n: (l.port_name, ports.get(l.port_name, l.ofport)) for n, l in best.items()}


# ---------------------------------------------------------------------------------------------- snapshot


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[Node, ...] = ()
    networks: tuple[Network, ...] = ()
    subnets: tuple[Subnet, ...] = ()
    ports: tuple[Port, ...] = ()
    routers: tuple[Router, ...] = ()
    router_interfaces: tuple[RouterInterface, ...] = ()
    tap_policies: tuple[TapPolicy, ...] = ()
    security_groups: tuple[SecurityGroup, ...] = ()
    security_group_rules: tuple[SecurityGroupRule, ...] = ()
    port_pairs: tuple[PortPair, ...] = ()
    port_pair_groups: tuple[PortPairGroup, ...] = ()
    flow_classifiers: tuple[FlowClassifier, ...] = ()
    port_chains: tuple[PortChain, ...] = ()
    router_gateways: tuple[RouterGateway, ...] = ()
    floating_ips: tuple[FloatingIp, ...] = ()
    # flow records' sampling rates per project and port (fathom.model.flow_records)
    flow_sampling: tuple[FlowSampling, ...] = ()
    # fabric switches, their links, router modes. None when built without it: compilers treat None
    # as "no fabric, every router distributed".
    fabric: "FabricState | None" = None
    # (views derived from a snapshot are kept apart from it: fathom.model.views)

    def with_ofports(self, ofports: Mapping[str, Mapping[str, int]]) -> "Snapshot":
        """A copy whose nodes carry br-int port numbers: {node name: {interface: ofport}}."""
        nodes = tuple(replace(n, ofports=dict(ofports.get(n.name, n.ofports))) for n in self.nodes)
        return replace(self, nodes=nodes)

    def with_phy_ofports(self, ofports: Mapping[str, Mapping[str, int]]) -> "Snapshot":
        """A copy whose nodes carry br-phy port numbers: {node name: {interface: ofport}}."""
        nodes = tuple(replace(n, phy_ofports=dict(ofports.get(n.name, n.phy_ofports))) for n in self.nodes)
        return replace(self, nodes=nodes)


# ---------------------------------------------------------------------------------------------- switches
# Datapath ids: the kind of switch in the top byte, the store id of its node or fabric switch below.


def datapath_id(node_id: int) -> int:
    """br-int of a node: fixed per node, so a reconnecting switch is recognised."""
    return 0xFA00_0000_0000_0000 | node_id


def datapath_id_fabric(switch_id: int) -> int:
    return 0xFB00_0000_0000_0000 | switch_id


def datapath_id_phy(node_id: int) -> int:
    return 0xFC00_0000_0000_0000 | node_id
