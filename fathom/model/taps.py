"""vTAP filter vocabulary and overlap analysis: pure functions on the model, used by the store and the
API to check a policy, and by the vTAP compiler to build its matches.

The filter vocabulary (`normalise_filters`) is what OpenFlow 1.3 can match, checked with its
prerequisites; docs/vtap.md lists it. Two policies with the same priority overlap when one packet
could match both at a tap point (`conflicting_policies`); the API refuses that.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from fathom.addresses import parse_mac
from fathom.model import Port, Snapshot, TapPolicy
from fathom.model.status import Severity
from fathom.openflow.masks import range_to_masks
from fathom.openflow.spec import OFPVID_PRESENT
from fathom.pipeline import stages as st

TAP_VNI_BASE = 0xF00000          # VNIs 0xF00000..0xFFFFFF are tap markers, never tenant networks
MAX_POLICY_ID = (1 << 17) - 1
MAX_PRIORITY = 60000
MIN_TRUNCATE = 64                # a truncated copy keeps at least Ethernet + IPv4 + TCP headers

ETH_IPV4, ETH_ARP, ETH_IPV6, ETH_MPLS, ETH_MPLS_MC, ETH_PBB = 0x0800, 0x0806, 0x86DD, 0x8847, 0x8848, 0x88E7
PROTO_NAMES = {"icmp": 1, "tcp": 6, "udp": 17, "sctp": 132, "icmpv6": 58}
TP_FIELD = {6: "tcp", 17: "udp", 132: "sctp"}
# ---------------------------------------------------------------------------------------------- filters

# OpenFlow 1.3 OXM fields a filter may name: field -> (kind, bits, allowed eth_types, ip_proto).
# kind: int | mac | ipv4 | ipv6. The identifiers and the pipeline own the fields in RESERVED.
_IP = (ETH_IPV4, ETH_IPV6)
OF13_FIELDS = {
    "eth_type": ("int", 16, None, None),
    "vlan_pcp": ("int", 3, None, None),
    "ip_dscp": ("int", 6, _IP, None),
    "ip_ecn": ("int", 2, _IP, None),
    "ip_proto": ("int", 8, _IP, None),
    "tcp_src": ("int", 16, _IP, 6), "tcp_dst": ("int", 16, _IP, 6),
    "udp_src": ("int", 16, _IP, 17), "udp_dst": ("int", 16, _IP, 17),
    "sctp_src": ("int", 16, _IP, 132), "sctp_dst": ("int", 16, _IP, 132),
    "icmpv4_type": ("int", 8, (ETH_IPV4,), 1), "icmpv4_code": ("int", 8, (ETH_IPV4,), 1),
    "arp_op": ("int", 16, (ETH_ARP,), None),
    "arp_spa": ("ipv4", 32, (ETH_ARP,), None), "arp_tpa": ("ipv4", 32, (ETH_ARP,), None),
    "arp_sha": ("mac", 48, (ETH_ARP,), None), "arp_tha": ("mac", 48, (ETH_ARP,), None),
    "ipv6_src": ("ipv6", 128, (ETH_IPV6,), None), "ipv6_dst": ("ipv6", 128, (ETH_IPV6,), None),
    "ipv6_flabel": ("int", 20, (ETH_IPV6,), None),
    "icmpv6_type": ("int", 8, (ETH_IPV6,), 58), "icmpv6_code": ("int", 8, (ETH_IPV6,), 58),
    "ipv6_nd_target": ("ipv6", 128, (ETH_IPV6,), 58),
    "ipv6_nd_sll": ("mac", 48, (ETH_IPV6,), 58), "ipv6_nd_tll": ("mac", 48, (ETH_IPV6,), 58),
    "ipv6_exthdr": ("int", 9, (ETH_IPV6,), None),
    "mpls_label": ("int", 20, (ETH_MPLS, ETH_MPLS_MC), None),
    "mpls_tc": ("int", 3, (ETH_MPLS, ETH_MPLS_MC), None),
    "mpls_bos": ("int", 1, (ETH_MPLS, ETH_MPLS_MC), None),
    "pbb_isid": ("int", 24, (ETH_PBB,), None),
}
RESERVED = {"in_port": "the sender's port", "in_phy_port": "the sender's port",
            "metadata": "the pipeline", "tunnel_id": "the pipeline",
            "eth_src": "the sender identifier", "eth_dst": "the receiver identifier",
            "ipv4_src": "the sender identifier", "ipv4_dst": "the receiver identifier",
            "vlan_vid": "the 'vlan' filter"}
# The eth_type a field implies when the filter gives none.
_IMPLIED_ETH_TYPE = {**{f: ETH_ARP for f in OF13_FIELDS if f.startswith("arp_")},
                     **{f: ETH_IPV6 for f in OF13_FIELDS if f.startswith(("ipv6_", "icmpv6_"))},
                     **{f: ETH_MPLS for f in OF13_FIELDS if f.startswith("mpls_")},
                     "pbb_isid": ETH_PBB}
TOP_LEVEL = ("ip_proto", "vlan", "tp_src", "tp_dst")


class FilterError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


def _wild(value) -> bool:
    return value is None or (isinstance(value, str) and value.strip() in ("*", ""))


def _int(field: str, value, bits: int) -> int:
    try:
        n = value if isinstance(value, int) and not isinstance(value, bool) else int(str(value), 0)
    except ValueError:
        raise FilterError(field, f"{value!r} is not a number") from None
    if not 0 <= n < (1 << bits):
        raise FilterError(field, f"{n} does not fit in {bits} bits (0..{(1 << bits) - 1})")
    return n


def _range(field: str, value) -> str:
    """'80', '1000-2000' (a range), checked; returned normalised as a string."""
    text = str(value).strip()
    m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", text)
    if not m:
        raise FilterError(field, f"{value!r} is not a port or a range like 1000-2000")
    low, high = int(m.group(1)), int(m.group(2) or m.group(1))
    if not 0 <= low <= high <= 65535:
        raise FilterError(field, f"{text}: ports are 0..65535 and a range goes low-high")
    return str(low) if low == high else f"{low}-{high}"


def _field_value(field: str, kind: str, bits: int, value):
    if kind == "int":
        return _int(field, value, bits)
    text = str(value).strip().lower()
    try:
        if kind == "mac":
            return parse_mac(text)
        if kind == "ipv4":
            return str(ipaddress.IPv4Address(text))
        return str(ipaddress.IPv6Address(text))
    except ValueError:
        raise FilterError(field, f"{value!r} is not a valid {kind} value") from None


def normalise_filters(ip_proto=None, vlan=None, tp_src=None, tp_dst=None,
                      match: dict | None = None) -> dict:
    """The filter of a policy as a flat dict (wildcards dropped), or FilterError naming the field.

    ip_proto: a number or tcp/udp/icmp/sctp/icmpv6; vlan: 1..4094; tp_src/tp_dst: a port or a
    range (TCP, UDP or SCTP after ip_proto; with no ip_proto both TCP and UDP); match: further
    OpenFlow 1.3 fields by os-ken name. `*`, "" or null mean wildcard everywhere.
    """
    out: dict = {}
    if not _wild(ip_proto):
        proto = PROTO_NAMES.get(str(ip_proto).strip().lower())
        out["ip_proto"] = proto if proto is not None else _int("ip_proto", ip_proto, 8)
    if not _wild(vlan):
        v = _int("vlan", vlan, 12)
        if not 1 <= v <= 4094:
            raise FilterError("vlan", f"VLAN id {v} is outside 1..4094")
        out["vlan"] = v
    for name, value in (("tp_src", tp_src), ("tp_dst", tp_dst)):
        if not _wild(value):
            out[name] = _range(name, value)
    for name, value in sorted((match or {}).items()):
        loc = f"match.{name}"
        if name in RESERVED:
            raise FilterError(loc, f"{name} is set by {RESERVED[name]}, not by a filter")
        if name not in OF13_FIELDS:
            raise FilterError(loc, f"unknown match field {name!r}: OpenFlow 1.3 fields are "
                                   f"{', '.join(sorted(OF13_FIELDS))}")
        if _wild(value):
            continue
        kind, bits, _, _ = OF13_FIELDS[name]
        if name == "ip_proto":
            if "ip_proto" in out:
                raise FilterError(loc, "ip_proto is given twice (top level and match)")
            proto = PROTO_NAMES.get(str(value).strip().lower())
            out["ip_proto"] = proto if proto is not None else _int(loc, value, 8)
            continue
        out[name] = _field_value(loc, kind, bits, value)
    _check_prerequisites(out)
    return out


def effective_eth_type(filters: dict) -> int:
    if "eth_type" in filters:
        return filters["eth_type"]
    for name in filters:
        if name in _IMPLIED_ETH_TYPE:
            return _IMPLIED_ETH_TYPE[name]
    return ETH_IPV4


def _check_prerequisites(f: dict) -> None:
    eth = effective_eth_type(f)
    implied = {_IMPLIED_ETH_TYPE[n] for n in f if n in _IMPLIED_ETH_TYPE}
    if len(implied | ({eth} if "eth_type" in f else set())) > 1:
        raise FilterError("match", "fields of different protocols (e.g. ARP and MPLS) cannot match one packet")
    proto = f.get("ip_proto")
    for name in f:
        if name not in OF13_FIELDS:
            continue
        _, _, eth_types, need_proto = OF13_FIELDS[name]
        loc = name if name == "ip_proto" else f"match.{name}"
        if eth_types and eth not in eth_types:
            raise FilterError(loc, f"{name} needs eth_type {' or '.join(hex(e) for e in eth_types)}, "
                                   f"the policy matches {eth:#06x}")
        if need_proto is not None and proto != need_proto:
            raise FilterError(loc, f"{name} needs ip_proto {need_proto}")
    if ("tp_src" in f or "tp_dst" in f):
        field = "tp_src" if "tp_src" in f else "tp_dst"
        if eth not in _IP:
            raise FilterError(field, "port filters need IP traffic")
        if proto is not None and proto not in TP_FIELD:
            raise FilterError(field, f"ip_proto {proto} has no ports (TCP 6, UDP 17, SCTP 132 do)")
        if any(n in f for n in ("tcp_src", "tcp_dst", "udp_src", "udp_dst", "sctp_src", "sctp_dst")):
            raise FilterError(field, "give ports either as tp_src/tp_dst or as match fields, not both")


def _masked(value: int, mask: int, bits: int = 16):
    full = (1 << bits) - 1
    return value if mask == full else (value, mask)


# ---------------------------------------------------------------------------------------------- markers


def marker(policy_id: int, direction: int, monitor: int) -> int:
    if not 0 < policy_id <= MAX_POLICY_ID:
        raise ValueError(f"policy id {policy_id} is beyond the marker space (1..{MAX_POLICY_ID})")
    return TAP_VNI_BASE | (policy_id << 3) | (direction << 2) | monitor


def parse_marker(value: int) -> tuple[int, int, int] | None:
    if value & 0xFFFFFF != value or value < TAP_VNI_BASE:
        return None
    rest = value - TAP_VNI_BASE
    return rest >> 3, (rest >> 2) & 1, rest & 3


# ---------------------------------------------------------------------------------------------- matches


@dataclass(frozen=True)
class Endpoint:
    mac: str | None        # None: any receiver (no destination identifier)
    ip: str | None
    port: Port | None = None


ANY = "*"    # a receiver of "*": whatever the sender sends, to anyone (receiver_mac = receiver_ip = "*");
             # a sender of "*": whatever the receiver receives, from anyone (sender_is_port False)
ANYONE = Endpoint(None, None, None)


class Problems(list):
    """Why a policy is not (wholly) installed: its problems (str) in the order found. `fatal`: one
    of them needs the policy's user (a port deleted under it, a marker it cannot have: status
    `error`); otherwise they are awaited (an unbound port, a missing interface: `pending`)."""
    fatal = False

    def add(self, problem: str, fatal: bool = False) -> None:
        self.append(problem)
        self.fatal = self.fatal or fatal

    def extend_with(self, other: "Problems") -> None:
        self.extend(other)
        self.fatal = self.fatal or other.fatal

    @property
    def severity(self) -> Severity:
        return Severity.ERROR if self.fatal else Severity.PENDING


def receiver_of(p: TapPolicy) -> "Endpoint":
    """A policy's receiver that is not a port: its MAC+IP, or no identifier at all for "*" (any)."""
    if p.receiver_mac == ANY:
        return ANYONE
    return Endpoint(p.receiver_mac, p.receiver_ip, None)


def ends(ports: dict, p: TapPolicy) -> tuple[Endpoint | None, Endpoint | None, "Problems"]:
    """(sender, receiver, problems) of a policy: None for a port deleted under it."""
    problems = Problems()
    sender = ANYONE
    if p.sender_is_port:
        port = ports.get(p.sender_port_id) if p.sender_port_id is not None else None
        sender = endpoint(port) if port else None
        if sender is None:
            problems.add("sender port was deleted", fatal=True)
    receiver = receiver_of(p)
    if p.receiver_is_port:
        port = ports.get(p.receiver_port_id) if p.receiver_port_id is not None else None
        receiver = endpoint(port) if port else None
        if receiver is None:
            problems.add("receiver port was deleted", fatal=True)
    return sender, receiver, problems


def tapped(src: Endpoint, dst: Endpoint) -> tuple[Port | None, bool]:
    """(the port whose edge holds the tap point of src -> dst traffic, at its egress?): the sender's
    port where the frames enter the fabric (tap-ingress), or, for a sender of "*", the receiver's
    port where l2 delivers them (tap-egress). (None, False) when neither is a port."""
    if src.port is not None:
        return src.port, False
    return dst.port, dst.port is not None


def directions(p: TapPolicy, sender: Endpoint, receiver: Endpoint) -> tuple[list, list[str]]:
    """The (direction, src, dst) a policy taps: sender -> receiver; with `both` also receiver ->
    sender, which needs a tap point: the receiver is a port (its ingress), or "*" (the sender's
    egress)."""
    if tapped(sender, receiver)[0] is None:
        return [], ["a sender of * needs the receiver to be a port"]
    out = [(0, sender, receiver)]
    if p.direction == "both":
        if tapped(receiver, sender)[0] is None:
            return out, ["direction both needs the receiver to be a port or *"]
        out.append((1, receiver, sender))
    return out, []


def tap_role(d: int, at_egress: bool) -> str:
    """Which end of the policy the tapped port of direction d is, for status reasons."""
    role = "sender" if (d == 0) != at_egress else "receiver"
    return role + (" (direction both)" if d == 1 else "")


class View:
    def __init__(self, snapshot: Snapshot):
        self.nodes = {n.name: n for n in snapshot.nodes}
        self.ports = {p.id: p for p in snapshot.ports}
        self.networks = {n.id: n for n in snapshot.networks}
        self.subnets = {s.id: s for s in snapshot.subnets}
        self.tenant_vnis = {n.segmentation_id for n in snapshot.networks if n.type == "vxlan"}
        self.interfaces = list(snapshot.router_interfaces)

    def in_network(self, network_id: int, ip: str | None) -> bool:
        if ip is None:
            return False
        addr = ipaddress.IPv4Address(ip)
        return any(s.network_id == network_id and addr in s.prefix for s in self.subnets.values())

    def route(self, src_network: int, dst_ip: str | None):
        """(router interface on the source network, router interface towards dst_ip) of one router, or None."""
        if dst_ip is None:
            return None
        addr = ipaddress.IPv4Address(dst_ip)
        for a in sorted(self.interfaces, key=lambda r: r.id):
            if a.network_id != src_network:
                continue
            for b in sorted(self.interfaces, key=lambda r: r.id):
                if b.router_id == a.router_id and b.id != a.id and addr in self.subnets[b.subnet_id].prefix:
                    return a, b
        return None


def endpoint(port: Port) -> Endpoint:
    return Endpoint(port.mac_address, port.fixed_ips[0].ip_address if port.fixed_ips else None, port)


_SWAP = {"tp_src": "tp_dst", "tp_dst": "tp_src", "tcp_src": "tcp_dst", "tcp_dst": "tcp_src",
         "udp_src": "udp_dst", "udp_dst": "udp_src", "sctp_src": "sctp_dst", "sctp_dst": "sctp_src"}


def reverse_filters(filters: dict) -> dict:
    """The filter of the receiver -> sender direction: source and destination ports swap, so a
    policy for `tcp, tp_dst 80, both` copies the requests and their replies."""
    return {_SWAP.get(k, k): v for k, v in filters.items()}


def ingress_matches(src: Endpoint, dst: Endpoint, filters: dict, l2_adjacent: bool, route) -> list[dict]:
    """The tap-ingress matches of one direction: identifiers + filters, port ranges expanded."""
    eth_type = effective_eth_type(filters)
    base: dict = {st.REG_SRC_PORT: src.port.id, "eth_src": src.mac, "eth_type": eth_type}
    if l2_adjacent and dst.mac:
        base["eth_dst"] = dst.mac
    elif route is not None:
        base["eth_dst"] = route[0].mac_address
    if eth_type == ETH_IPV4:
        if src.ip:
            base["ipv4_src"] = src.ip
        if dst.ip:
            base["ipv4_dst"] = dst.ip
    return _with_filters(base, filters)


def egress_matches(dst: Endpoint, filters: dict, ofport: int | None) -> list[dict]:
    """The tap-egress matches of a "*" -> port direction: what l2 delivers to the port's ofport (`reg7`;
    None leaves it out, for comparing policies without switch facts), addressed to the port, + filters."""
    eth_type = effective_eth_type(filters)
    base: dict = {"eth_dst": dst.mac, "eth_type": eth_type}
    if ofport is not None:
        base[st.REG_OUT_PORT] = ofport
    if eth_type == ETH_IPV4 and dst.ip:
        base["ipv4_dst"] = dst.ip
    return _with_filters(base, filters)


def _with_filters(base: dict, filters: dict) -> list[dict]:
    """The identifiers' match + the filters, port ranges expanded into masked matches."""
    if "vlan" in filters:
        base["vlan_vid"] = OFPVID_PRESENT | filters["vlan"]
    for name, value in filters.items():
        if name in OF13_FIELDS and name != "eth_type":
            base[name] = value
    proto = filters.get("ip_proto")
    if "tp_src" not in filters and "tp_dst" not in filters:
        return [base]
    protos = [proto] if proto is not None else [6, 17]
    out = []
    for pr in protos:
        prefix = TP_FIELD[pr]
        src_parts = _port_parts(filters.get("tp_src"))
        dst_parts = _port_parts(filters.get("tp_dst"))
        for sv in src_parts:
            for dv in dst_parts:
                m = {**base, "ip_proto": pr}
                if sv is not None:
                    m[f"{prefix}_src"] = sv
                if dv is not None:
                    m[f"{prefix}_dst"] = dv
                out.append(m)
    return out


def _port_parts(value: str | None) -> list:
    if value is None:
        return [None]
    low, _, high = value.partition("-")
    return [_masked(v, mk) for v, mk in range_to_masks(int(low), int(high or low))]


# ---------------------------------------------------------------------------------------------- overlap


def _as_int(name: str, value) -> tuple[int, int]:
    """(value, mask) of a match value as integers, for intersection tests."""
    if isinstance(value, tuple):
        v, mk = value
        return _as_int(name, v)[0], _as_int(name, mk)[0]
    if isinstance(value, int):
        return value, -1
    text = str(value)
    if ":" in text and len(text) == 17:
        return int(text.replace(":", ""), 16), -1
    try:
        return int(ipaddress.ip_address(text)), -1
    except ValueError:
        return hash(text), -1


def matches_intersect(a: dict, b: dict) -> bool:
    """Could one packet match both? (fields both name must agree on their common mask bits)"""
    for name in set(a) & set(b):
        va, ma = _as_int(name, a[name])
        vb, mb = _as_int(name, b[name])
        if (va ^ vb) & ma & mb:
            return False
    # different tp field families (tcp_* vs udp_*) imply different ip_proto, caught above
    return True


def _policy_matches(view: View, p: TapPolicy) -> list[tuple[tuple, dict]]:
    """(tap point, match) of a policy's flows, wherever its ports are bound (no switch facts needed):
    the tap point is (tap-ingress or tap-egress, the tapped port's id)."""
    sender, receiver, _ = ends(view.ports, p)
    if sender is None or receiver is None:
        return []
    out = []
    for d, src, dst in directions(p, sender, receiver)[0]:
        port, at_egress = tapped(src, dst)
        if port is None:
            continue
        filters = vlan_as_network(view, port, dict(p.filters) if d == 0 else reverse_filters(dict(p.filters)))
        if at_egress:
            out += [((st.TAP_EGRESS, port.id), m) for m in egress_matches(dst, filters, None)]
            continue
        eth_type = effective_eth_type(filters)
        adjacent = view.in_network(port.network_id, dst.ip) if eth_type == ETH_IPV4 else True
        route = None if adjacent else view.route(port.network_id, dst.ip)
        out += [((st.TAP_INGRESS, port.id), m) for m in ingress_matches(src, dst, filters, adjacent, route)]
    return out


def vlan_as_network(view: View, port: Port, filters: dict) -> dict:
    """A `vlan` filter naming the VLAN of the tapped port's (VLAN) network matches all of its frames:
    VMs send and receive untagged, the network's VLAN is on the uplink only. Otherwise it matches the
    frame's own 802.1Q tag (a VLAN-aware VM)."""
    net = view.networks.get(port.network_id)
    if "vlan" in filters and net is not None and net.type == "vlan" and net.segmentation_id == filters["vlan"]:
        return {k: v for k, v in filters.items() if k != "vlan"}
    return filters


def conflicting_policies(snapshot: Snapshot, policy_id: int) -> list[int]:
    """Other policies with the same priority whose traffic overlaps `policy_id`'s at a tap point."""
    view = View(snapshot)
    by_id = {p.id: p for p in snapshot.tap_policies}
    me = by_id[policy_id]
    mine = _policy_matches(view, me)
    out = []
    for other in sorted(by_id.values(), key=lambda p: p.id):
        if other.id == policy_id or other.priority != me.priority:
            continue
        theirs = _policy_matches(view, other)
        if any(pa == pb and matches_intersect(a, b) for pa, a in mine for pb, b in theirs):
            out.append(other.id)
    return out


# ---------------------------------------------------------------------------------------------- problems


def installable_monitors(ports: dict, p: TapPolicy, sender, receiver, problems: Problems) -> list | None:
    """The policy's monitor ports as (index, port), or None when the policy cannot be installed: a
    monitor port deleted (fatal), its sender or receiver missing, no monitor left, or an id beyond
    the marker space (fatal). What it finds is added to `problems`."""
    monitors = []
    for i, mid in enumerate(p.monitor_port_ids):
        mport = ports.get(mid) if mid is not None else None
        if mport is None:
            problems.add(f"{'monitor' if i == 0 else 'monitor2'} port was deleted", fatal=True)
        else:
            monitors.append((i, mport))
    if sender is None or receiver is None or not monitors:
        return None
    if p.id > MAX_POLICY_ID:
        problems.add(f"policy id {p.id} is beyond the marker space", fatal=True)
        return None
    return monitors


def static_problems(snapshot: Snapshot) -> dict[int, Problems]:
    """Why each policy cannot be installed, judged from the model alone (every bound port's interface
    is taken to be on its node): deleted ports (fatal), unbound ones, a marker a tenant network uses
    (fatal). The same words as the compiler's plans, which add what only the switches can tell."""
    ports = {p.id: p for p in snapshot.ports}
    nodes = {n.name for n in snapshot.nodes}
    tenant_vnis = {n.segmentation_id for n in snapshot.networks if n.type == "vxlan"}
    out = {}
    for p in sorted(snapshot.tap_policies, key=lambda p: p.id):
        sender, receiver, problems = ends(ports, p)
        out[p.id] = problems
        monitors = installable_monitors(ports, p, sender, receiver, problems)
        if monitors is None:
            continue
        tapping, why = directions(p, sender, receiver)
        problems += why
        for d, src, dst in tapping:
            port, at_egress = tapped(src, dst)
            what = tap_role(d, at_egress)
            if port.node not in nodes:
                problems.append(f"{what} port {port.id} is not bound to a node")
                continue
            if not port.interface:
                problems.append(f"{what} port {port.id}: interface {port.interface!r} not on "
                                f"{port.node}'s br-int yet")
                continue
            for i, mport in monitors:
                if marker(p.id, d, i) in tenant_vnis:
                    problems.add(f"tap marker VNI {marker(p.id, d, i)} is used by a tenant network", fatal=True)
                elif mport.node not in nodes or not mport.interface:
                    problems.append(f"{'monitor' if i == 0 else 'monitor2'} port {mport.id} is not on a node's "
                                    f"br-int yet")
    return out
