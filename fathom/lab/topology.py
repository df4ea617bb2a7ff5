"""The lab topology file: a YAML document that declares networks, nodes, VMs and the underlay.

Loading is strict: unknown keys, duplicate names, malformed CIDRs or MACs and addresses outside their
subnet are all reported at once, each with the file, the line and the field.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fathom.addresses import parse_mac

DEFAULT_TOPOLOGY = Path(__file__).parent / "topologies" / "default.yaml"

# Names become parts of namespace and interface names (IFNAMSIZ is 16 with the NUL).
NAME_RE = r"^[a-z][a-z0-9]{0,11}$"
LAB_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
RESERVED_NAMES = {"fabric", "mgmt"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Plug = Literal["direct", "hybrid"]      # hybrid: tap → Linux bridge qbr → veth qvb/qvo → br-int (os-vif's)
PLUGS = ("direct", "hybrid")


def vm_host_end(name: str, plug: str) -> str:
    """The node end of a VM port's veth: the VM-facing host interface."""
    return f"tap{name}" if plug == "hybrid" else name


def ovs_interface(name: str, plug: str) -> str:
    """A VM port's interface on br-int (its `interface_name` for the controller)."""
    return f"qvo{name}" if plug == "hybrid" else name




class VM(_Strict):
    name: str = Field(pattern=NAME_RE)
    mac: str
    ip: ipaddress.IPv4Interface   # its port's fixed IP
    network: str
    dhcp: bool = False            # take the address by DHCP (`fathom.lab.lab.Lab.dhcp_vm`) instead of statically
    floating_ip: bool = False     # a floating IP of its router's external network, associated with its port
    plug: Plug = "direct"

    @field_validator("mac")
    @classmethod
    def _mac(cls, v: str) -> str:
        return parse_mac(v, unicast_for="a VM")


class VnfPort(_Strict):
    mac: str
    ip: ipaddress.IPv4Interface

    @field_validator("mac")
    @classmethod
    def _mac(cls, v: str) -> str:
        return parse_mac(v, unicast_for="a VNF port")


VNF_KINDS = ("forward", "firewall", "nat", "dpi", "haproxy")


class Vnf(_Strict):
    """A VNF: a namespace with two ports on br-int (eth0 = ingress, eth1 = egress; on br-int
    `<name>i` and `<name>o`), routing between them, and the work of its kind (fathom/lab/vnf.py).
    Registered as two ports without port security and a port pair named after it."""
    name: str = Field(pattern=r"^[a-z][a-z0-9]{0,10}$")   # + "i"/"o" on br-int: at most 12 characters
    kind: Literal["forward", "firewall", "nat", "dpi", "haproxy"] = "forward"
    network: str
    ingress: VnfPort
    egress: VnfPort
    rules: int = Field(default=0, ge=0, le=10000)          # firewall: non-matching rules every packet passes
    backend: str | None = Field(default=None, pattern=r"^\d+\.\d+\.\d+\.\d+:\d+$")  # haproxy: ip:port
    plug: Plug = "direct"      # hybrid: br-int holds qvo<name>i / qvo<name>o (15 characters at most)


class Node(_Strict):
    name: str = Field(pattern=NAME_RE)
    role: Literal["compute", "gateway"] = "compute"
    vms: list[VM] = []
    vnfs: list[Vnf] = []


class HostRoute(_Strict):
    destination: ipaddress.IPv4Network
    nexthop: ipaddress.IPv4Address


class Network(_Strict):
    name: str = Field(pattern=NAME_RE)
    type: Literal["vxlan", "vlan", "flat"] = "vxlan"
    segmentation_id: int | None = Field(default=None, ge=1, le=16777215)
    cidr: ipaddress.IPv4Network
    project: str = Field(default="demo", pattern=r"^[A-Za-z0-9_.-]{1,64}$")  # the tenant owning it
    external: bool = False       # a provider network on the gateway nodes' ext0 (flat or vlan; docs/external.md)
    # DHCP on its subnet (docs/dhcp.md); absent: on when a VM of the network takes its address by DHCP
    dhcp: bool | None = None
    dns: list[ipaddress.IPv4Address] = Field(default_factory=list, max_length=5)   # DNS servers given by DHCP
    host_routes: list[HostRoute] = Field(default_factory=list, max_length=20)     # routes given by DHCP

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        """The subnet's gateway (router) address: its first host."""
        return next(self.cidr.hosts())

    @field_validator("cidr", mode="before")
    @classmethod
    def _cidr(cls, v):
        return ipaddress.IPv4Network(v, strict=True) if isinstance(v, str) else v


class Router(_Strict):
    name: str = Field(pattern=NAME_RE)
    networks: list[str]          # one interface on each network's subnet, at its gateway address
    mode: Literal["distributed", "fabric", "network-node"] = "distributed"  # where it routes (docs/fabric.md)
    external_gateway: str | None = None   # an external network: the router's gateway (SNAT, floating IPs)


class Upstream(_Strict):
    """A host standing for the provider router of an external network (lab only): a namespace wired
    to the gateway node's ext0, holding the external subnet's gateway address."""
    name: str = Field(pattern=NAME_RE)
    network: str                 # an external network
    node: str                    # the gateway node it is wired to
    mac: str = "02:fe:00:00:00:01"

    @field_validator("mac")
    @classmethod
    def _mac(cls, v: str) -> str:
        return parse_mac(v, unicast_for="the upstream host")


class Underlay(_Strict):
    cidr: ipaddress.IPv4Network = ipaddress.IPv4Network("198.18.0.0/24")
    mtu: int = Field(default=1600, ge=1280, le=9000)


class Topology(_Strict):
    networks: list[Network] = []
    routers: list[Router] = []
    nodes: list[Node]
    upstream: Upstream | None = None
    underlay: Underlay = Underlay()
    # Management subnet shared with the root namespace; chosen per lab when absent.
    management: ipaddress.IPv4Network | None = None

    def vms(self) -> list[tuple[Node, VM]]:
        return [(n, vm) for n in self.nodes for vm in n.vms]

    def vnfs(self) -> list[tuple[Node, Vnf]]:
        return [(n, v) for n in self.nodes for v in n.vnfs]

    def network(self, name: str) -> Network:
        return next(n for n in self.networks if n.name == name)

    def dhcp(self, net: Network) -> bool:
        """Whether the network's subnet serves DHCP: as the topology says, else when one of its
        VMs takes its address by DHCP (so labs of static VMs run no DHCP server)."""
        if net.dhcp is not None:
            return net.dhcp
        return any(vm.dhcp and vm.network == net.name for _, vm in self.vms())

    def segmentation_id(self, net: Network) -> int:
        """The VNI or VLAN id of a network; defaults are stable: 1000 + position, VLANs 100 + position."""
        if net.segmentation_id is not None:
            return net.segmentation_id
        i = self.networks.index(net)
        return (100 + i) if net.type == "vlan" else (1000 + i)


@dataclass(frozen=True)
class Problem:
    line: int | None
    field: str
    message: str


class TopologyError(Exception):
    def __init__(self, source: str, problems: list[Problem]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(self.lines()))

    def lines(self) -> list[str]:
        return [f"{self.source}:{p.line if p.line else '?'}: {p.field}: {p.message}" for p in self.problems]


def _plain(node: yaml.Node, path: tuple, lines: dict) -> object:
    """Turn a composed YAML node into plain values, remembering the line of every path."""
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out = {}
        for k, v in node.value:
            key = k.value
            if key in out:
                lines[path + (key,)] = k.start_mark.line + 1
                raise _Dup(path + (key,), f"key {key!r} given twice")
            lines[path + (key,)] = k.start_mark.line + 1
            out[key] = _plain(v, path + (key,), lines)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_plain(v, path + (i,), lines) for i, v in enumerate(node.value)]
    return yaml.SafeLoader.construct_object(yaml.SafeLoader(""), node)


class _Dup(Exception):
    def __init__(self, path, message):
        self.path, self.message = path, message


def _field(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(document)"


def _line(lines: dict, path: tuple) -> int | None:
    while path not in lines and path:
        path = path[:-1]
    return lines.get(path)


def parse(text: str, source: str = "<topology>") -> Topology:
    lines: dict = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise TopologyError(source, [Problem(mark.line + 1 if mark else None, "(document)", f"not valid YAML: {getattr(e, 'problem', e)}")])
    if root is None:
        raise TopologyError(source, [Problem(1, "(document)", "the file is empty")])
    try:
        data = _plain(root, (), lines)
    except _Dup as d:
        raise TopologyError(source, [Problem(_line(lines, d.path), _field(d.path), d.message)])
    if not isinstance(data, dict):
        raise TopologyError(source, [Problem(1, "(document)", "expected a mapping with nodes, networks and underlay")])
    try:
        topo = Topology.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            problems.append(Problem(_line(lines, loc), _field(loc), msg))
        raise TopologyError(source, problems)
    problems = _check(topo, lines)
    if problems:
        raise TopologyError(source, problems)
    return topo


def _check(topo: Topology, lines: dict) -> list[Problem]:
    """Checks that span several objects: unique names and addresses, VMs inside their network."""
    problems: list[Problem] = []

    def add(path: tuple, message: str):
        problems.append(Problem(_line(lines, path), _field(path), message))

    seen: dict[str, tuple] = {}
    named = [(("networks", i, "name"), n.name, "network") for i, n in enumerate(topo.networks)]
    named += [(("routers", i, "name"), r.name, "router") for i, r in enumerate(topo.routers)]
    if topo.upstream is not None:
        named.append((("upstream", "name"), topo.upstream.name, "upstream"))
    for i, node in enumerate(topo.nodes):
        named.append((("nodes", i, "name"), node.name, "node"))
        for j, vm in enumerate(node.vms):
            named.append((("nodes", i, "vms", j, "name"), vm.name, "vm"))
        for j, vnf in enumerate(node.vnfs):
            named.append((("nodes", i, "vnfs", j, "name"), vnf.name, "vnf"))
    for path, name, kind in named:
        if name in RESERVED_NAMES:
            add(path, f"{name!r} is reserved")
        key = f"{kind}:{name}" if kind in ("network", "router") else name  # nodes, VMs, upstream share the namespace space
        if key in seen:
            add(path, f"duplicate name {name!r} (first at line {_line(lines, seen[key])})")
        else:
            seen[key] = path

    # the links a node's VMs and VNFs make in its namespace (a hybrid plug's tap/qbr/qvb/qvo too)
    for i, node in enumerate(topo.nodes):
        links: dict[str, tuple] = {}
        ends = [(("nodes", i, "vms", j, "name"), vm.name, vm.plug) for j, vm in enumerate(node.vms)]
        ends += [(("nodes", i, "vnfs", j, "name"), f"{vnf.name}{side}", vnf.plug)
                 for j, vnf in enumerate(node.vnfs) for side in "io"]
        for path, port, plug in ends:
            made = [port] if plug == "direct" else [f"{p}{port}" for p in ("tap", "qbr", "qvb", "qvo")]
            for link in made:
                if link in links and links[link] != path:
                    add(path, f"its interface {link!r} clashes with one of line {_line(lines, links[link])}")
                links.setdefault(link, path)

    nets = {n.name: n for n in topo.networks}
    segs: dict[tuple, tuple] = {}
    for i, n in enumerate(topo.networks):
        key = ("vlan" if n.type == "vlan" else n.type, topo.segmentation_id(n))
        if n.type == "vlan" and topo.segmentation_id(n) > 4094:
            add(("networks", i, "segmentation_id"), "a VLAN id must be 1..4094")
        if n.type != "flat" and key in segs:
            add(("networks", i, "segmentation_id"), f"segmentation id {key[1]} already used by network at line {_line(lines, segs[key])}")
        segs.setdefault(key, ("networks", i))
    for i, n in enumerate(topo.networks):
        if n.external and n.type == "vxlan":
            add(("networks", i, "type"), "an external network is flat or vlan")
    for i, r in enumerate(topo.routers):
        for j, name in enumerate(r.networks):
            if name not in nets:
                add(("routers", i, "networks", j), f"unknown network {name!r}")
            elif nets[name].external:
                add(("routers", i, "networks", j), f"{name!r} is external: give it as external_gateway")
        if r.external_gateway is not None and (r.external_gateway not in nets or not nets[r.external_gateway].external):
            add(("routers", i, "external_gateway"), f"{r.external_gateway!r} is not an external network")
    up = topo.upstream
    if up is not None:
        if up.network not in nets or not nets[up.network].external:
            add(("upstream", "network"), f"{up.network!r} is not an external network")
        gw_node = next((n for n in topo.nodes if n.name == up.node), None)
        if gw_node is None or gw_node.role != "gateway":
            add(("upstream", "node"), f"{up.node!r} is not a node of role gateway")
    routed = {n for r in topo.routers if r.external_gateway for n in r.networks}
    addrs: dict[tuple, tuple] = {}
    for i, node in enumerate(topo.nodes):
        ends = [(("nodes", i, "vms", j), vm, vm.network) for j, vm in enumerate(node.vms)]
        for j, vnf in enumerate(node.vnfs):
            ends += [(("nodes", i, "vnfs", j, side), getattr(vnf, side), vnf.network) for side in ("ingress", "egress")]
            if vnf.rules and vnf.kind != "firewall":
                add(("nodes", i, "vnfs", j, "rules"), "only a firewall has rules")
            if (vnf.backend is not None) != (vnf.kind == "haproxy"):
                add(("nodes", i, "vnfs", j, "backend"), "a haproxy VNF needs a backend ip:port; other kinds take none")
        for base, vm, network in ends:
            net = nets.get(network)
            if net is None:
                add(base[:4] + ("network",), f"unknown network {network!r}")
                continue
            if net.external:
                add(base + ("network",), f"{net.name!r} is external: VMs take floating IPs on it, not ports")
            if getattr(vm, "floating_ip", False) and net.name not in routed:   # VNF ports take none
                add(base + ("floating_ip",), f"no router with an external gateway has an interface on {net.name!r}")
            if vm.ip.ip not in net.cidr:
                add(base + ("ip",), f"{vm.ip.ip} is outside network {net.name}'s subnet {net.cidr}")
            elif vm.ip.network != net.cidr:
                add(base + ("ip",), f"prefix /{vm.ip.network.prefixlen} differs from network {net.name}'s {net.cidr}")
            elif vm.ip.ip in (net.cidr.network_address, net.cidr.broadcast_address):
                add(base + ("ip",), f"{vm.ip.ip} is the network or broadcast address of {net.cidr}")
            elif vm.ip.ip == net.gateway:
                add(base + ("ip",), f"{vm.ip.ip} is network {net.name}'s gateway address")
            for field, value in (("ip", str(vm.ip.ip)), ("mac", vm.mac)):
                key = (net.name, field, value)
                if key in addrs:
                    add(base + (field,), f"{value} already used in network {net.name} (line {_line(lines, addrs[key])})")
                addrs.setdefault(key, base + (field,))
    need = len(topo.nodes) + 2
    if topo.underlay.cidr.num_addresses < need + 2:
        add(("underlay", "cidr"), f"{topo.underlay.cidr} is too small for {len(topo.nodes)} nodes")
    if topo.management is not None and topo.management.num_addresses < need + 2:
        add(("management",), f"{topo.management} is too small for {len(topo.nodes)} nodes")
    if not topo.nodes:
        add(("nodes",), "a topology needs at least one node")
    return problems


def load(path: str | Path) -> Topology:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise TopologyError(str(path), [Problem(None, "(file)", e.strerror or str(e))])
    return parse(text, str(path))


def check_lab_name(name: str) -> None:
    if not LAB_NAME_RE.match(name):
        raise ValueError(f"lab name {name!r} must be 1-8 characters a-z0-9, starting with a letter")
