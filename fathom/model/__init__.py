"""The model the compilers read: plain immutable values, no SQLAlchemy, no I/O.

A `Snapshot` is one consistent view of the store (fathom.store.snapshot.load_snapshot builds it in
one transaction) plus facts that live in the switches, not in the store: the OpenFlow port numbers
of each br-int (`Snapshot.with_ofports`), of each br-phy (`Snapshot.with_phy_ofports`) and of each
fabric switch (`FabricState.with_ofports`), added by the controller before compiling. Datapath ids of every switch fathom programs are defined here too, so
compilers, the controller and tests name switches the same way.
"""
from __future__ import annotations

import ipaddress
import operator
import weakref
from dataclasses import dataclass, field, fields, replace
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
    # DHCP: answered on each node by its agent (fathom.apps.hostlocal.dhcp_servers)
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
    packet), every VNF of the chain adds its processing time (fathom.apps.hostlocal.chain_pptmon)."""
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
class Switch:
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
    switches: tuple[Switch, ...] = ()
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

    def node_ports(self, switch: Switch) -> dict[str, tuple[str, int | None]]:
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


_ITSELF = object()     # Snapshot.memo: the view made is the snapshot itself
DELTA_PORTS = 256      # Snapshot.delta: a change of more ports than this (and an eighth) is not patched


@dataclass(frozen=True)
class Delta:
    """What changed from one snapshot to the next (Snapshot.delta): what views are patched by.

    `ports`: the ids of the ports added, removed or changed, and of every port on a changed node
    (a port's facts depend on its node's port numbers); `before` / `after`: those ports as they were
    and are (id -> Port; a port added or removed is missing from one). `nodes`: the names of the
    nodes added, removed or changed. `fields`: the snapshot's other fields that differ."""
    fields: frozenset
    nodes: frozenset
    ports: frozenset
    before: Mapping
    after: Mapping

    def port_nodes(self) -> set:
        """The nodes the changed ports are bound to, before or after."""
        return {p.node for m in (self.before, self.after) for p in m.values()}

    def patched(self, view: Mapping, value) -> dict:
        """A copy of `view` (port id -> something) whose changed ports' entries are `value(port)`
        again: dropped where the port is gone or `value` gives None."""
        out = dict(view)
        for port_id in self.ports:
            p = self.after.get(port_id)
            if p is None or (v := value(p)) is None:
                out.pop(port_id, None)
            else:
                out[port_id] = v
        return out


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
    # Views derived from this snapshot by pure functions (e.g. the tenant view of the routers),
    # computed once per snapshot however many apps read them; a copy starts empty.
    derived: dict = field(default_factory=dict, init=False, compare=False, hash=False, repr=False)

    def memo(self, name: str, make, patch=None):
        """`make(self)` once per snapshot, under `name`. A view that is the snapshot itself is not
        kept in it: the cycle would leave every dropped snapshot, and all it derived, to the
        collector's full passes.

        `patch(view, snapshot, delta)`: the view worked out from the one the snapshot this one
        follows (`follow`) holds, and what changed since (`Delta`): the cost follows the change,
        not the cloud. It returns None for a change it does not cover, and `make` runs. It must
        give what `make` would (tests/unit/test_views.py compares them over random changes)."""
        if name not in self.derived:
            value = None
            if patch is not None and (delta := self.delta()) is not None:
                basis = self._basis()
                if basis is not None and name in basis.derived:
                    value = patch(basis.memo(name, make), self, delta)
            if value is None:
                value = make(self)
            if isinstance(value, Snapshot) and value is not self and (basis := self._basis()) is not None \
                    and name in basis.derived:
                value.follow(basis.memo(name, make))   # a derived model follows the one before it
            self.derived[name] = _ITSELF if value is self else value
        value = self.derived[name]
        return self if value is _ITSELF else value

    def follow(self, before: "Snapshot | None") -> "Snapshot":
        """Note that this snapshot comes after `before` (the one the last pass compiled), so that
        its views may be patched from `before`'s (`memo`). Held weakly: a chain of snapshots would
        keep every one alive. Returns self."""
        if before is not None and before is not self and not self.derived.keys() & {"_basis", "_delta"}:
            self.derived["_basis"] = weakref.ref(before)
        return self

    def _basis(self) -> "Snapshot | None":
        ref = self.derived.get("_basis")
        return ref() if ref is not None else None

    def delta(self) -> "Delta | None":
        """What changed since the snapshot this one follows, when it is still alive and the change
        small (at most DELTA_PORTS ports, or an eighth of them where that is more); None otherwise."""
        if "_delta" not in self.derived:
            basis = self._basis()
            self.derived["_delta"] = _delta(basis, self) if basis is not None else None
        return self.derived["_delta"]

    def delta_from(self, before: "Snapshot") -> "Delta | None":
        """`delta()`, when the snapshot this one follows is `before`."""
        return self.delta() if self._basis() is before else None

    def changes_from(self, before: "Snapshot") -> "Delta | None":
        """The Delta from any earlier snapshot `before` (not kept: see `delta`)."""
        return _delta(before, self)

    def ports_by_id(self) -> dict[int, Port]:
        """port id -> port, once per snapshot (patched for the ports a change touched)."""
        return self.memo("ports_by_id", lambda s: {p.id: p for p in s.ports}, _patch_ports_by_id)

    def with_ofports(self, ofports: Mapping[str, Mapping[str, int]]) -> "Snapshot":
        """A copy whose nodes carry br-int port numbers: {node name: {interface: ofport}}."""
        nodes = tuple(replace(n, ofports=dict(ofports.get(n.name, n.ofports))) for n in self.nodes)
        return replace(self, nodes=nodes)

    def with_phy_ofports(self, ofports: Mapping[str, Mapping[str, int]]) -> "Snapshot":
        """A copy whose nodes carry br-phy port numbers: {node name: {interface: ofport}}."""
        nodes = tuple(replace(n, phy_ofports=dict(ofports.get(n.name, n.phy_ofports))) for n in self.nodes)
        return replace(self, nodes=nodes)


def _patch_ports_by_id(ports: dict, _snapshot: Snapshot, delta: Delta) -> dict:
    return delta.patched(ports, lambda p: p)


def _changed_ports(before: tuple, after: tuple) -> tuple[list, list]:
    """(ports of `before` not in `after`, ports of `after` not in `before`), as objects: past the
    stretches both start and end with (the same objects at the same places, told apart at C
    speed), by identity."""
    if before is after:
        return [], []
    head = _first_false(list(map(operator.is_, before, after)))
    rest_b, rest_a = before[head:], after[head:]
    tail = _first_false(list(map(operator.is_, reversed(rest_b), reversed(rest_a))))
    ob = {id(p): p for p in rest_b[:len(rest_b) - tail]}
    oa = {id(p): p for p in rest_a[:len(rest_a) - tail]}
    return [ob[k] for k in ob.keys() - oa.keys()], [oa[k] for k in oa.keys() - ob.keys()]


def _first_false(same: list) -> int:
    try:
        return same.index(False)
    except ValueError:
        return len(same)


def _delta(before: Snapshot, after: Snapshot) -> Delta | None:
    """The Delta from `before` to `after`; None for a change of many ports (see Snapshot.delta).
    The ports are told apart by identity: the store's reader keeps the objects of the ports it did
    not read again, so this costs two C-level passes over the ports, not a comparison of each."""
    changed = frozenset(f.name for f in fields(Snapshot) if f.name not in ("nodes", "ports", "derived")
                        and (b := getattr(before, f.name)) is not (a := getattr(after, f.name)) and b != a)
    nb, na = {n.name: n for n in before.nodes}, {n.name: n for n in after.nodes}
    nodes = frozenset(name for name in nb.keys() | na.keys() if nb.get(name) != na.get(name))
    gone, new = _changed_ports(before.ports, after.ports)
    if len(gone) + len(new) > max(DELTA_PORTS, len(after.ports) // 8):
        return None
    ids = {p.id for p in gone} | {p.id for p in new}
    if not nodes:
        return Delta(changed, nodes, frozenset(ids), {p.id: p for p in gone}, {p.id: p for p in new})
    ids |= {p.id for p in before.ports if p.node in nodes} | {p.id for p in after.ports if p.node in nodes}
    if len(ids) > max(DELTA_PORTS, len(after.ports) // 8):
        return None
    return Delta(changed, nodes, frozenset(ids), {p.id: p for p in before.ports if p.id in ids},
                 {p.id: p for p in after.ports if p.id in ids})


# ---------------------------------------------------------------------------------------------- switches
# Datapath ids: the kind of switch in the top byte, the store id of its node or fabric switch below.


def datapath_id(node_id: int) -> int:
    """br-int of a node: fixed per node, so a reconnecting switch is recognised."""
    return 0xFA00_0000_0000_0000 | node_id


def datapath_id_tor(switch_id: int) -> int:
    return 0xFB00_0000_0000_0000 | switch_id


def datapath_id_phy(node_id: int) -> int:
    return 0xFC00_0000_0000_0000 | node_id
