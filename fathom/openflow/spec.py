"""Flow and group specs: what a compiler wants a switch to hold, as plain frozen values.

A `FlowSpec` is one OpenFlow 1.3 flow entry; a `GroupSpec` one group entry. Both are frozen and
hashable, so the desired state of a switch is a frozenset of them and a diff is set arithmetic.

Field names are the keyword arguments of os-ken's `OFPMatch` / `OFPActionSetField` for OpenFlow 1.3
(`eth_dst`, `ipv4_dst`, `tunnel_id`, `reg6`, `tun_ipv4_dst`, ...), and values are what os-ken accepts:
ints, MAC and IPv4 strings, and `(value, mask)` tuples for masked matches. Encoding a spec is then
mechanical: `OFPMatch(**dict(spec.match))`, one os-ken action class per action class below, and a
trailing `GotoTable` becomes the goto-table instruction.

`to_ofctl()` renders a spec the way `ovs-ofctl -O OpenFlow13 --no-stats dump-flows` / `dump-groups`
of OVS 3.1 print it (checked line for line against the flows of the tenant compiler), so desired
and actual state can be compared by eye or by `diff`. `ovs-ofctl -O OpenFlow13 add-flow` accepts
the same text (tests/unit/test_spec_ovs.py does exactly that). The reconciler compares specs, not
strings.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Union

# Reserved OpenFlow 1.3 port numbers (32-bit).
OFPP_IN_PORT = 0xFFFFFFF8
OFPP_CONTROLLER = 0xFFFFFFFD
OFPP_MAX = 0xFFFFFF00          # port numbers from here on are reserved (LOCAL, CONTROLLER, ...)
OFPP_LOCAL = 0xFFFFFFFE
OFPCML_NO_BUFFER = 0xFFFF
# Nicira resubmit takes a 16-bit port: this is "the packet's in_port" there (not OFPP_IN_PORT).
NX_IN_PORT = 0xFFF8
# The VLAN id "present" bit of OpenFlow 1.3's vlan_vid; a tagged frame with VLAN 100 matches 0x1000|100.
OFPVID_PRESENT = 0x1000
OFPVID_NONE = 0x0000

MatchValue = Union[int, str, tuple]

# Width in bits of the fields that Move/LoadReg can address (os-ken names).
FIELD_BITS = {
    "eth_src": 48, "eth_dst": 48, "arp_sha": 48, "arp_tha": 48,
    "arp_spa": 32, "arp_tpa": 32, "ipv4_src": 32, "ipv4_dst": 32,
    "arp_op": 16, "eth_type": 16, "vlan_vid": 16, "tunnel_id": 64, "metadata": 64,
    "tun_ipv4_dst": 32, "tun_ipv4_src": 32, "in_port": 32,
    **{f"reg{i}": 32 for i in range(16)},
}

# os-ken field name -> the name ovs-ofctl prints in a match.
_OFCTL_MATCH_NAME = {
    "eth_dst": "dl_dst", "eth_src": "dl_src", "eth_type": "dl_type",
    "ipv4_src": "nw_src", "ipv4_dst": "nw_dst", "ip_proto": "nw_proto",
    "tunnel_id": "tun_id", "tun_ipv4_dst": "tun_dst", "tun_ipv4_src": "tun_src",
    "tcp_src": "tp_src", "tcp_dst": "tp_dst", "udp_src": "tp_src", "udp_dst": "tp_dst",
    "icmpv4_type": "icmp_type", "icmpv4_code": "icmp_code", "icmpv6_type": "icmp_type",
    "icmpv6_code": "icmp_code",
}
# os-ken field name -> the name ovs-ofctl prints in set_field actions.
_OFCTL_SET_FIELD_NAME = {
    "tunnel_id": "tun_id", "tun_ipv4_dst": "tun_dst", "tun_ipv4_src": "tun_src",
    "ipv4_src": "ip_src", "ipv4_dst": "ip_dst",
}
# os-ken field name -> the NXM/OXM name ovs-ofctl prints in move/load actions.
_NXM_NAME = {
    "eth_src": "NXM_OF_ETH_SRC", "eth_dst": "NXM_OF_ETH_DST", "eth_type": "NXM_OF_ETH_TYPE",
    "arp_op": "NXM_OF_ARP_OP", "arp_spa": "NXM_OF_ARP_SPA", "arp_tpa": "NXM_OF_ARP_TPA",
    "arp_sha": "NXM_NX_ARP_SHA", "arp_tha": "NXM_NX_ARP_THA",
    "ipv4_src": "NXM_OF_IP_SRC", "ipv4_dst": "NXM_OF_IP_DST", "in_port": "NXM_OF_IN_PORT",
    "vlan_vid": "OXM_OF_VLAN_VID", "metadata": "OXM_OF_METADATA",
    "tunnel_id": "NXM_NX_TUN_ID", "tun_ipv4_dst": "NXM_NX_TUN_IPV4_DST",
    "tun_ipv4_src": "NXM_NX_TUN_IPV4_SRC",
    **{f"reg{i}": f"NXM_NX_REG{i}" for i in range(16)},
}
# Fields whose plain integer values ovs-ofctl prints in hex.
_HEX_FIELDS = {"tunnel_id", "metadata", "eth_type", "ct_mark", "ct_label", *(f"reg{i}" for i in range(16))}
# Fields printed in decimal when exact but in hex when masked (transport ports).
_HEX_MASKED_FIELDS = {"tcp_src", "tcp_dst", "udp_src", "udp_dst", "sctp_src", "sctp_dst"}
_ETH_TYPE_SHORTHAND = {0x0800: "ip", 0x0806: "arp", 0x86DD: "ipv6"}
_IP_PROTO_SHORTHAND = {1: "icmp", 6: "tcp", 17: "udp", 132: "sctp"}
_IP6_PROTO_SHORTHAND = {58: "icmp6", 6: "tcp6", 17: "udp6", 132: "sctp6"}
# ct_state bits (OVS): the names ovs-ofctl prints, lowest bit first.
CT_STATE_BITS = {"new": 0x01, "est": 0x02, "rel": 0x04, "rpl": 0x08, "inv": 0x10, "trk": 0x20,
                 "snat": 0x40, "dnat": 0x80}


def ct_state(**flags: bool) -> tuple[int, int]:
    """A ct_state match: ct_state(trk=True, new=True, est=False) -> (value, mask) for +trk+new-est."""
    value = sum(CT_STATE_BITS[k] for k, on in flags.items() if on)
    mask = sum(CT_STATE_BITS[k] for k in flags)
    return value, mask

_RESERVED_PORT_NAMES = {OFPP_IN_PORT: "IN_PORT", OFPP_LOCAL: "LOCAL", OFPP_CONTROLLER: "CONTROLLER"}


# ---------------------------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class Output:
    """Send the packet out of an OpenFlow port (an int, or OFPP_IN_PORT etc.)."""
    port: int

    def to_ofctl(self) -> str:
        if self.port in _RESERVED_PORT_NAMES:
            return _RESERVED_PORT_NAMES[self.port]
        return f"output:{self.port}"


@dataclass(frozen=True, slots=True)
class OutputTrunc:
    """Nicira output(port, max_len): send at most the first `max_len` bytes of the packet."""
    port: int
    max_len: int

    def to_ofctl(self) -> str:
        return f"output(port={self.port},max_len={self.max_len})"


@dataclass(frozen=True, slots=True)
class SetField:
    """OpenFlow 1.3 set_field. `field` is an os-ken OXM/NXM name (eth_dst, reg6, tun_ipv4_dst, ...)."""
    field: str
    value: int | str

    def to_ofctl(self) -> str:
        name = _OFCTL_SET_FIELD_NAME.get(self.field, self.field)
        return f"set_field:{_format_value(self.field, self.value)}->{name}"


@dataclass(frozen=True, slots=True)
class PushVlan:
    ethertype: int = 0x8100

    def to_ofctl(self) -> str:
        return f"push_vlan:0x{self.ethertype:04x}"


@dataclass(frozen=True, slots=True)
class PopVlan:
    def to_ofctl(self) -> str:
        return "pop_vlan"


@dataclass(frozen=True, slots=True)
class DecTtl:
    """OpenFlow 1.3 dec_nw_ttl (ovs-ofctl prints it as dec_ttl)."""

    def to_ofctl(self) -> str:
        return "dec_ttl"


@dataclass(frozen=True, slots=True)
class Meter:
    """The meter instruction: the flow's packets pass meter `meter_id` first (only valid as the first
    element of a flow's actions; it is an instruction, not an action)."""
    meter_id: int

    def to_ofctl(self) -> str:
        return f"meter:{self.meter_id}"


@dataclass(frozen=True, slots=True)
class GotoTable:
    """The goto-table instruction. Only valid as the last element of a flow's actions."""
    table: int

    def to_ofctl(self) -> str:
        return f"goto_table:{self.table}"


@dataclass(frozen=True, slots=True)
class Resubmit:
    """Nicira resubmit(port, table): look the packet up again in `table` (may go backwards).

    `in_port` is the 16-bit Nicira port; None means "the packet's in_port" (NX_IN_PORT on the wire).
    """
    table: int
    in_port: int | None = None

    def to_ofctl(self) -> str:
        port = "" if self.in_port in (None, NX_IN_PORT) else str(self.in_port)
        return f"resubmit({port},{self.table})"


@dataclass(frozen=True, slots=True)
class Group:
    group_id: int

    def to_ofctl(self) -> str:
        return f"group:{self.group_id}"


@dataclass(frozen=True, slots=True)
class Controller:
    """Packet-in to the controller with at most `max_len` bytes of the packet."""
    max_len: int = OFPCML_NO_BUFFER

    def to_ofctl(self) -> str:
        return f"CONTROLLER:{self.max_len}"


@dataclass(frozen=True, slots=True)
class Move:
    """Nicira reg_move: copy `n_bits` from src[src_ofs..] to dst[dst_ofs..] (os-ken field names)."""
    src: str
    dst: str
    n_bits: int
    src_ofs: int = 0
    dst_ofs: int = 0

    def to_ofctl(self) -> str:
        return (f"move:{_nxm_slice(self.src, self.src_ofs, self.n_bits)}"
                f"->{_nxm_slice(self.dst, self.dst_ofs, self.n_bits)}")


@dataclass(frozen=True, slots=True)
class LoadReg:
    """Nicira reg_load: write `value` into bits [ofs, ofs+n_bits) of `field` (a register, usually)."""
    field: str
    value: int
    ofs: int = 0
    n_bits: int = 32

    def to_ofctl(self) -> str:
        return f"load:{self.value:#x}->{_nxm_slice(self.field, self.ofs, self.n_bits)}"


@dataclass(frozen=True, slots=True)
class Nat:
    """The nat argument of a `Ct`: `kind` "src" (SNAT to `ip`), "dst" (DNAT to `ip`), or None (apply
    the NAT of the connection the packet belongs to, e.g. un-SNAT a reply)."""
    kind: str | None = None
    ip: str | None = None

    def __post_init__(self):
        if self.kind not in (None, "src", "dst") or (self.kind is None) != (self.ip is None):
            raise ValueError("nat is nat(src=IP), nat(dst=IP) or plain nat")

    def to_ofctl(self) -> str:
        return f"nat({self.kind}={self.ip})" if self.kind else "nat"


@dataclass(frozen=True, slots=True)
class Ct:
    """Nicira ct: pass the packet through the connection tracker in a zone.

    The zone is `zone` (an immediate value) or, when `zone_field` is given, bits
    [zone_ofs, zone_ofs + 16) of that field (a register). `table` recirculates the packet to that
    table with ct_state filled in (None: continue with the next action); `commit` records the
    connection; `nat` translates it (or applies the connection's existing NAT); `exec` actions (only
    SetField of ct_mark or ct_label) run on the committed entry. Without `table`, OVS leaves the
    packet untracked (ct_state and the other ct fields cleared) for the rest of the pass.
    """
    zone: int = 0
    zone_field: str | None = None
    zone_ofs: int = 0
    table: int | None = None
    commit: bool = False
    exec: tuple = ()
    nat: Nat | None = None

    def __post_init__(self):
        object.__setattr__(self, "exec", tuple(self.exec))
        if not 0 <= self.zone <= 0xFFFF:
            raise ValueError(f"conntrack zone {self.zone} is 0..65535")

    def to_ofctl(self) -> str:
        parts = ["commit"] if self.commit else []
        if self.table is not None:
            parts.append(f"table={self.table}")
        parts.append(f"zone={_nxm_slice(self.zone_field, self.zone_ofs, 16)}" if self.zone_field
                     else f"zone={self.zone}")
        if self.nat:  # OVS prints a leading nat outside the exec envelope
            parts.append(self.nat.to_ofctl())
        if self.exec:
            parts.append("exec(" + ",".join(a.to_ofctl() for a in self.exec) + ")")
        return "ct(" + ",".join(parts) + ")"


@dataclass(frozen=True, slots=True)
class Sample:
    """Nicira sample: send this packet, with `probability` out of 65535, to the IPFIX collectors of
    `collector_set_id`, tagged with an observation domain and point (fathom.model.flow_records)."""
    probability: int
    collector_set_id: int
    obs_domain_id: int
    obs_point_id: int

    def __post_init__(self):
        if not 1 <= self.probability <= 0xFFFF:
            raise ValueError(f"sample probability {self.probability} is 1..65535")

    def to_ofctl(self) -> str:
        return (f"sample(probability={self.probability},collector_set_id={self.collector_set_id},"
                f"obs_domain_id={self.obs_domain_id},obs_point_id={self.obs_point_id})")


@dataclass(frozen=True, slots=True)
class CtClear:
    """Nicira ct_clear: forget the packet's connection tracking state (before a lookup in another zone)."""

    def to_ofctl(self) -> str:
        return "ct_clear"


@dataclass(frozen=True, slots=True)
class Conjunction:
    """Nicira conjunction(id, clause/n_clauses): this flow is clause `clause` (1-based) of conjunctive
    match `id`; the flow matching `conj_id=id` runs when one flow of every clause matched."""
    id: int
    clause: int
    n_clauses: int

    def to_ofctl(self) -> str:
        return f"conjunction({self.id},{self.clause}/{self.n_clauses})"


Action = Union[Output, OutputTrunc, Meter, SetField, PushVlan, PopVlan, DecTtl, GotoTable, Resubmit, Group,
               Controller, Move, LoadReg, Ct, CtClear, Conjunction, Sample]


def set_tunnel_dst(ip: str) -> SetField:
    """The destination of a flow-based tunnel port (remote_ip=flow): set_field tun_ipv4_dst."""
    return SetField("tun_ipv4_dst", ip)


# ---------------------------------------------------------------------------------------------- specs


def _normalise_match(match: Mapping[str, MatchValue] | Iterable[tuple[str, MatchValue]]):
    items = match.items() if isinstance(match, Mapping) else match
    out = []
    for name, value in items:
        if isinstance(value, list):
            value = tuple(value)
        out.append((name, value))
    out.sort(key=lambda kv: kv[0])
    names = [n for n, _ in out]
    if len(names) != len(set(names)):
        raise ValueError(f"a match field appears twice: {names}")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class FlowSpec:
    """One flow entry. `match` may be given as a dict; it is stored as a sorted tuple of pairs.

    Empty `actions` means drop. A `GotoTable`, if any, must come last.
    """
    table: int
    priority: int
    match: tuple = ()
    actions: tuple = ()
    cookie: int = 0
    # VLAN ids the actions tag frames with (set_field vlan_vid): set with the spec, as a switch's
    # whole state is searched for them on every pass (the fabric's trunks); most flows tag none
    vlans_set: frozenset = field(default=frozenset(), init=False, compare=False, repr=False)
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "match", _normalise_match(self.match))
        object.__setattr__(self, "actions", tuple(self.actions))
        _set_vlans(self, (self.actions,))
        for i, a in enumerate(self.actions):
            if isinstance(a, GotoTable) and i != len(self.actions) - 1:
                raise ValueError("goto_table must be the last action of a flow")
            if isinstance(a, GotoTable) and a.table <= self.table:
                raise ValueError(f"goto_table:{a.table} from table {self.table} goes backwards")
            if isinstance(a, Meter) and i != 0:
                raise ValueError("a meter must be the first element of a flow's actions")

    def __hash__(self) -> int:
        # Flows live in large sets that every pass unions and compares: hashed once (a spec never changes)
        h = self._hash
        if h is None:
            h = hash((self.table, self.priority, self.match, self.actions, self.cookie))
            object.__setattr__(self, "_hash", h)
        return h

    @property
    def key(self) -> tuple:
        """What identifies a flow entry in a switch: (table, priority, match)."""
        return (self.table, self.priority, self.match)

    @property
    def match_dict(self) -> dict[str, MatchValue]:
        return dict(self.match)

    def apply_actions(self) -> tuple:
        """The actions of the apply-actions instruction (everything but a trailing goto, a leading meter)."""
        actions = self.actions[1:] if self.actions and isinstance(self.actions[0], Meter) else self.actions
        if actions and isinstance(actions[-1], GotoTable):
            return actions[:-1]
        return actions

    def meter_id(self) -> int | None:
        return self.actions[0].meter_id if self.actions and isinstance(self.actions[0], Meter) else None

    def goto_table(self) -> int | None:
        if self.actions and isinstance(self.actions[-1], GotoTable):
            return self.actions[-1].table
        return None

    def to_ofctl(self) -> str:
        # ovs-ofctl leaves out a zero cookie, "table=0" and (with --no-stats) the counters.
        head = ", ".join([*([f"cookie={self.cookie:#x}"] if self.cookie else []),
                          *([f"table={self.table}"] if self.table else []),
                          f"priority={self.priority}"])
        match = format_match(self.match)
        actions = ",".join(a.to_ofctl() for a in self.actions) or "drop"
        return f"{head}{',' + match if match else ''} actions={actions}"


def _set_vlans(spec, action_lists) -> None:
    vlans = frozenset(a.value & 0xFFF for actions in action_lists for a in actions
                      if type(a) is SetField and a.field == "vlan_vid" and isinstance(a.value, int))
    if vlans:
        object.__setattr__(spec, "vlans_set", vlans)


GROUP_TYPES = ("all", "select", "indirect")


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """One group entry: `buckets` is a tuple of action tuples (select buckets get weight 1).

    OpenFlow 1.3 groups carry no cookie; `cookie` here records the owner for status reporting and
    takes no part in equality, so a group read back from a switch equals the desired one. The group
    id itself carries the owning app (see fathom.pipeline.stages.group_id).
    """
    group_id: int
    type: str
    buckets: tuple = ()
    cookie: int = field(default=0, compare=False)
    # VLAN ids the buckets tag frames with, as FlowSpec's
    vlans_set: frozenset = field(default=frozenset(), init=False, compare=False, repr=False)
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self):
        if self.type not in GROUP_TYPES:
            raise ValueError(f"group type {self.type!r} is not one of {GROUP_TYPES}")
        object.__setattr__(self, "buckets", tuple(tuple(b) for b in self.buckets))
        _set_vlans(self, self.buckets)
        for bucket in self.buckets:
            if any(isinstance(a, GotoTable) for a in bucket):
                raise ValueError("a group bucket cannot hold goto_table (use Resubmit)")

    def __hash__(self) -> int:
        h = self._hash   # hashed once, as FlowSpec (the cookie takes no part)
        if h is None:
            h = hash((self.group_id, self.type, self.buckets))
            object.__setattr__(self, "_hash", h)
        return h

    def to_ofctl(self) -> str:
        parts = [f"group_id={self.group_id}", f"type={self.type}"]
        for bucket in self.buckets:
            parts.append("bucket=actions=" + (",".join(a.to_ofctl() for a in bucket) or "drop"))
        return ",".join(parts)


@dataclass(frozen=True, slots=True)
class MeterSpec:
    """One meter with a single drop band: at most `rate` packets/s (unit pktps) or kb/s (kbps)."""
    meter_id: int
    rate: int
    burst: int = 0
    unit: str = "pktps"
    cookie: int = 0      # the owner, for the reconciler (meters carry no cookie on the wire)

    def __post_init__(self):
        if self.unit not in ("pktps", "kbps"):
            raise ValueError(f"meter unit {self.unit!r} is pktps or kbps")

    @property
    def key(self) -> tuple:
        return (self.meter_id, self.rate, self.burst, self.unit)

    def to_ofctl(self) -> str:
        burst = ",burst" if self.burst else ""
        size = f",burst_size={self.burst}" if self.burst else ""
        return f"meter={self.meter_id},{self.unit}{burst},bands=type=drop,rate={self.rate}{size}"


@dataclass(frozen=True, slots=True)
class SwitchState:
    """The desired content of one bridge."""
    flows: frozenset = field(default_factory=frozenset)
    groups: frozenset = field(default_factory=frozenset)
    meters: frozenset = field(default_factory=frozenset)

    def __or__(self, other: "SwitchState") -> "SwitchState":
        return SwitchState(self.flows | other.flows, self.groups | other.groups, self.meters | other.meters)

    def to_ofctl(self) -> list[str]:
        """Groups then flows, sorted by table, descending priority, match: a stable listing."""
        groups = sorted(self.groups, key=lambda g: g.group_id)
        flows = sorted(self.flows, key=lambda f: (f.table, -f.priority, repr(f.match)))
        meters = sorted(self.meters, key=lambda m: m.meter_id)
        return [m.to_ofctl() for m in meters] + [g.to_ofctl() for g in groups] + [f.to_ofctl() for f in flows]


# ---------------------------------------------------------------------------------------------- rendering


def _format_ct_state(value: MatchValue) -> str:
    v, mask = value if isinstance(value, tuple) else (value, 0xFF)
    return "".join(("+" if v & bit else "-") + name for name, bit in CT_STATE_BITS.items() if mask & bit)


def _format_value(name: str, value: MatchValue) -> str:
    if name == "ct_state":
        return _format_ct_state(value)
    if isinstance(value, tuple) and name in ("ipv6_src", "ipv6_dst"):
        v, mask = value
        bits = int(ipaddress.IPv6Address(mask))
        length = bin(bits).count("1")
        if bits == ((1 << 128) - 1) ^ ((1 << (128 - length)) - 1):
            return f"{v}/{length}"
    if isinstance(value, tuple) and name in _HEX_MASKED_FIELDS:
        return f"{value[0]:#x}/{value[1]:#x}"
    if isinstance(value, tuple):
        v, mask = value
        if name in ("ipv4_src", "ipv4_dst", "arp_spa", "arp_tpa"):
            try:
                return str(ipaddress.IPv4Network(f"{v}/{mask}"))
            except ValueError:
                pass
        return f"{_format_value(name, v)}/{_format_value(name, mask)}"
    if isinstance(value, int) and name in _HEX_FIELDS:
        return f"{value:#x}"
    return str(value)


def format_match(match: tuple) -> str:
    """A match the way ovs-ofctl prints it: protocol shorthand first, then fields."""
    fields = dict(match)
    # conntrack fields come before the protocol shorthand in OVS's output
    words = [f"{name}={_format_value(name, fields.pop(name))}"
             for name in ("conj_id", "ct_state", "ct_zone", "ct_mark", "ct_label") if name in fields]
    eth_type = fields.pop("eth_type", None)
    proto = fields.get("ip_proto")
    if eth_type == 0x0800 and proto in _IP_PROTO_SHORTHAND:
        words.append(_IP_PROTO_SHORTHAND[fields.pop("ip_proto")])
    elif eth_type == 0x86DD and proto in _IP6_PROTO_SHORTHAND:
        words.append(_IP6_PROTO_SHORTHAND[fields.pop("ip_proto")])
    elif eth_type in _ETH_TYPE_SHORTHAND:
        words.append(_ETH_TYPE_SHORTHAND[eth_type])
    elif eth_type is not None:
        words.append(f"dl_type={eth_type:#06x}")
    for name, value in sorted(fields.items(), key=lambda kv: _match_order(kv[0])):
        if name == "vlan_vid":
            words.append(_format_vlan(value))
            continue
        words.append(f"{_OFCTL_MATCH_NAME.get(name, name)}={_format_value(name, value)}")
    return ",".join(words)


def _format_vlan(value) -> str:
    if value == OFPVID_NONE:
        return "vlan_tci=0x0000/0x1fff"
    if isinstance(value, int) and value & OFPVID_PRESENT:
        return f"dl_vlan={value & 0xFFF}"
    return f"vlan_vid={_format_value('vlan_vid', value)}"


# Roughly the order ovs-ofctl prints fields in: metadata and registers, tunnel, port, L2, L3, L4.
_ORDER = ["metadata", *(f"reg{i}" for i in range(16)), "tunnel_id", "tun_ipv4_src", "tun_ipv4_dst",
          "in_port", "vlan_vid", "eth_src", "eth_dst", "ipv4_src", "ipv4_dst", "arp_spa", "arp_tpa",
          "arp_op", "arp_sha", "arp_tha", "icmpv4_type", "icmpv4_code", "icmpv6_type", "icmpv6_code",
          "tcp_src", "tcp_dst", "udp_src", "udp_dst"]


def _match_order(name: str) -> tuple:
    return (_ORDER.index(name), name) if name in _ORDER else (len(_ORDER), name)


def _nxm_slice(name: str, ofs: int, n_bits: int) -> str:
    nxm = _NXM_NAME.get(name, name)
    if ofs == 0 and FIELD_BITS.get(name) == n_bits:
        return f"{nxm}[]"
    if n_bits == 1:
        return f"{nxm}[{ofs}]"
    return f"{nxm}[{ofs}..{ofs + n_bits - 1}]"
