"""Host-local desired state: what a node's agent must hold on its host, as typed objects.

The controller computes it per node with a pure function of the model (fathom.model.hostlocal_desired) and
serves it to the node's agent (`GET /v1/agents/<node>/desired`); the agent (fathom.agent) applies
it. Every object names its owner `(kind, id)`: the store object whose status it decides. The
agent reports one status per owner key ("kind:id"). New kinds of host-local work (a DHCP server
per node, attachments generated from service chains) are new classes here with a `KIND`, added
to `KINDS`.

The wire form is JSON: `{"kind": ..., "owner": [kind, id], ...fields}`; `digest()` of a node's
objects numbers its revisions (a change of any field is a new revision).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, asdict, dataclass, fields


@dataclass(frozen=True)
class RouterLeg:
    """One interface of a network-node router: `qr<id>` in the router namespace with `mac` and
    `address` (gateway ip/prefix), its peer `qrp<id>` on the node's br-int."""
    id: int
    mac: str
    address: str          # e.g. "198.19.1.1/24"

    @property
    def inner(self) -> str:
        return f"qr{self.id}"

    @property
    def outer(self) -> str:
        return f"qrp{self.id}"


@dataclass(frozen=True)
class RouterNamespace:
    """A network-node router: a namespace with IPv4 forwarding and one leg per router interface."""
    KIND = "router_namespace"
    router_id: int
    legs: tuple[RouterLeg, ...]

    @property
    def owner(self) -> tuple[str, int]:
        return ("router", self.router_id)


@dataclass(frozen=True)
class PptmonAttach:
    """PPTMon eBPF programs on interfaces of the node: `ppt_in` at `in_point`, `ppt_out` at
    `out_point` ("<interface>:ingress|egress"), in `mode`, sampling every `period_ns`. Its owner
    is (`owner_kind`, `attachment_id`): an operator's attachment, or a VNF instance of a port
    chain measured through the API (fathom.model.chains)."""
    KIND = "pptmon_attach"
    attachment_id: int
    chain: str
    vnf_id: int
    mode: str             # source | transit | sink | source-sink
    in_point: str
    out_point: str
    period_ns: int
    owner_kind: str = "pptmon_attachment"
    path: str = ""        # a port chain's instances, as a digest (fathom.model.chains); "" otherwise

    @property
    def owner(self) -> tuple[str, int]:
        return (self.owner_kind, self.attachment_id)

    @property
    def names_ports(self) -> bool:
        """Its points name the br-int interfaces of a VNF's ports (a chain's instance), which the
        agent maps to the VM-facing interfaces behind them (fathom.agent.plugging); an operator's
        attachment names the interfaces themselves."""
        return self.owner_kind != "pptmon_attachment"

    @property
    def local_name(self) -> str:
        """A name unique among a node's attachments, for the agent's files and pins."""
        return str(self.attachment_id) if self.owner_kind == "pptmon_attachment" else \
            f"{self.owner_kind}-{self.attachment_id}"


@dataclass(frozen=True)
class DhcpSubnet:
    """One DHCP-enabled subnet a DHCP server answers for: the server's own `server_address`
    (ip/prefix) on it, and the options every lease on it carries."""
    subnet_id: int
    cidr: str
    server_address: str                      # e.g. "198.19.1.254/24"
    gateway_ip: str | None                   # option 3 (router); None: no router option
    dns_nameservers: tuple[str, ...]         # option 6
    host_routes: tuple[tuple[str, str], ...] # option 121 (classless static routes): (cidr, nexthop)


@dataclass(frozen=True)
class DhcpHost:
    """A static lease: the port with `mac` gets `ip` (on `subnet_id`), named `hostname`."""
    mac: str
    ip: str
    subnet_id: int
    hostname: str


@dataclass(frozen=True)
class DhcpServer:
    """The DHCP server of one network on one node: a namespace `<prefix><network_id>` holding
    `inner` (the server's `mac` and one address per subnet) whose peer `outer` sits on br-int as
    this network's DHCP port. Static only: it answers exactly `hosts` (the ports of the network
    bound to this node), nothing dynamic. `mtu` is option 26; `lease_time` in seconds."""
    KIND = "dhcp_server"
    network_id: int
    mac: str
    mtu: int
    lease_time: int
    subnets: tuple[DhcpSubnet, ...]
    hosts: tuple[DhcpHost, ...]

    @property
    def owner(self) -> tuple[str, int]:
        return ("dhcp_server", self.network_id)

    @property
    def inner(self) -> str:
        return f"dh{self.network_id}"

    @property
    def outer(self) -> str:
        return f"dhp{self.network_id}"


@dataclass(frozen=True)
class DatapathFlush:
    """Drop the flows the node's datapath cached, once per `generation`: the controller asks for
    it after a pass that moved `routers` between modes (or removed them) and changed this node's
    path for their traffic. OVS's userspace datapath can go on forwarding an established flow by
    the path its switch no longer holds (docs/fabric.md, Router modes); the agent flushes only a
    datapath of that type. Not part of the model: the controller numbers the requests."""
    KIND = "datapath_flush"
    generation: int
    routers: tuple[int, ...]

    @property
    def owner(self) -> tuple[str, int]:
        return ("datapath_flush", self.generation)


KINDS = {c.KIND: c for c in (RouterNamespace, PptmonAttach, DhcpServer, DatapathFlush)}
# the header of a held long-poll's streamed answer (GET /v1/agents/<node>/desired?keepalive=<s>,
# fathom.api.agents): the seconds between its spaces
KEEPALIVE_HEADER = "X-Fathom-Keepalive"


def owner_key(owner: tuple[str, int]) -> str:
    """The key an agent reports an object's status under: "kind:id"."""
    return f"{owner[0]}:{owner[1]}"


def to_json(obj) -> dict:
    return {"kind": obj.KIND, "owner": list(obj.owner), **asdict(obj)}


def from_json(data: dict):
    """The object of a wire dict; ValueError for an unknown kind or a missing field."""
    cls = KINDS.get(data.get("kind"))
    if cls is None:
        raise ValueError(f"unknown host-local object kind {data.get('kind')!r}")
    values = {}
    for f in fields(cls):
        if f.name in data:
            values[f.name] = data[f.name]
        elif f.default is MISSING:
            raise ValueError(f"{cls.KIND}: missing {f.name}")
    if cls is DatapathFlush:
        values["routers"] = tuple(values["routers"])
    if cls is RouterNamespace:
        values["legs"] = tuple(RouterLeg(**leg) for leg in values["legs"])
    if cls is DhcpServer:
        values["subnets"] = tuple(
            DhcpSubnet(**{**sub, "dns_nameservers": tuple(sub["dns_nameservers"]),
                          "host_routes": tuple(tuple(r) for r in sub["host_routes"])})
            for sub in values["subnets"])
        values["hosts"] = tuple(DhcpHost(**h) for h in values["hosts"])
    return cls(**values)


def digest(objects) -> str:
    """A digest of a node's desired objects (order-independent)."""
    return digest_json([to_json(o) for o in objects])


def digest_json(objects: list[dict]) -> str:
    """digest() of the objects whose wire dicts (to_json) these are."""
    body = json.dumps(sorted(objects, key=lambda d: (d["kind"], d["owner"])), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


class Digests:
    """`digests(obj)` is digest([obj]), remembered from one round to the next (`next_round()`):
    the controller compares every host-local object with its agent's report on every pass, and
    an object that did not change is the same object as the last pass's (fathom.model.hostlocal_desired.
    Desired keeps them: found by identity, not even hashed) or one equal to it (hashing it is
    cheap; its digest is not: 1,000 DHCP servers of 10 hosts took 60 ms a pass). Holds two
    rounds' objects at most."""

    def __init__(self):
        self._now: dict = {}
        self._before: dict = {}
        self._now_ids: dict[int, tuple] = {}      # id(obj) -> (obj, digest); holding obj keeps its id its own
        self._before_ids: dict[int, tuple] = {}

    def __call__(self, obj) -> str:
        key = id(obj)
        hit = self._now_ids.get(key) or self._before_ids.get(key)
        if hit is not None and hit[0] is obj:
            value = hit[1]
        else:
            value = self._now.get(obj) or self._before.get(obj) or digest([obj])
            self._now[obj] = value
        self._now_ids[key] = (obj, value)
        return value

    def next_round(self) -> None:
        self._before, self._now = self._now, {}
        self._before_ids, self._now_ids = self._now_ids, {}
