"""One pass of a packet through one switch's flow tables: an OpenFlow 1.3 interpreter over fathom's
own flow representation (fathom.openflow.spec).

Semantics, as OVS applies them: in each table the highest-priority flow whose match holds (masked
fields compared under their mask) decides, and a table without one drops (table miss); apply
actions run in order; `goto_table` ends the flow's actions in the next table; `resubmit` runs
another table and comes back; set-field, `load` and `move` write header fields, registers and
metadata; `output` never sends back out of the in_port unless told to with IN_PORT; a group of
type `all` runs every bucket on a copy of the packet (taps, floods), a `select` group runs one
bucket, picked deterministically by a symmetric hash of the 5-tuple (the pass says which and
why); conjunctive matches (`conjunction`, `conj_id`) as OVS resolves them.

Conntrack: a simulation cannot know the real state of a connection, so the caller says it
(`ct_state`: new or established, as ovn-trace's --ct) and every `ct(table=N)` recirculates with
that state (`+trk+new`, or `+trk+est` with no admitting rule recorded: established connections
whose rule is unknown are judged by the rules, as the security groups re-admit them); `nat(src=…)`
and `nat(dst=…)` rewrite the address; a plain `nat` (the NAT of an existing connection) is shown
and changes nothing. `controller` is named and not followed. Bounded: at most MAX_DEPTH nested
resubmits/gotos and MAX_STEPS flows per pass, as OVS bounds its translation.
"""
from __future__ import annotations

import functools
import ipaddress
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field

from fathom.openflow.spec import (
    CT_STATE_BITS, OFPP_CONTROLLER, OFPP_IN_PORT, OFPVID_PRESENT, Conjunction, Sample, Controller, Ct, CtClear, DecTtl,
    FlowSpec, GotoTable, Group, LoadReg, Meter, Move, Output, OutputTrunc, PopVlan, PushVlan, Resubmit, SetField,
    SwitchState, format_match,
)

MAX_DEPTH = 64      # nested goto_table / resubmit / ct recirculations in one pass (OVS: 64)
MAX_STEPS = 4096    # flows looked up in one pass

CT_NEW = CT_STATE_BITS["trk"] | CT_STATE_BITS["new"]
CT_ESTABLISHED = CT_STATE_BITS["trk"] | CT_STATE_BITS["est"]
CT_STATES = {"new": CT_NEW, "established": CT_ESTABLISHED}

_MAC = {"eth_src", "eth_dst", "arp_sha", "arp_tha"}
_IPV4 = {"ipv4_src", "ipv4_dst", "arp_spa", "arp_tpa", "tun_ipv4_dst", "tun_ipv4_src"}
_CT_FIELDS = ("ct_state", "ct_zone", "ct_mark", "ct_label", "conj_id")
# fields that are 0 when a packet does not carry them (registers, metadata, tunnel and ct fields)
_ZERO = {"metadata", "tunnel_id", *_CT_FIELDS, *(f"reg{i}" for i in range(16))}


class LoopError(Exception):
    """The pass went deeper or longer than the bounds (a resubmit loop)."""


def field_int(name: str, value) -> int:
    """A match field's value as a number (MACs and IP addresses written as text)."""
    if isinstance(value, int):
        return value
    return _text_int(name, value)


@functools.lru_cache(maxsize=65536)
def _text_int(name: str, value: str) -> int:
    if name in _MAC:
        return int(value.replace(":", ""), 16)
    if name in _IPV4:
        return int(ipaddress.IPv4Address(value))
    if name in ("ipv6_src", "ipv6_dst"):
        return int(ipaddress.IPv6Address(value))
    raise TypeError(f"{name}={value!r}")


def field_value(name: str, number: int):
    """A number as the field's value is written (MACs and IPv4 addresses as text)."""
    if name in _MAC:
        digits = f"{number:012x}"
        return ":".join(digits[i:i + 2] for i in range(0, 12, 2))
    if name in _IPV4:
        return str(ipaddress.IPv4Address(number))
    return number


def field_of(pkt: dict, name: str):
    """The packet's value of a match field; None when the packet has no such field."""
    if name == "vlan_vid":
        vid = pkt.get("vlan")
        return 0 if vid is None else OFPVID_PRESENT | vid
    return pkt.get(name, 0 if name in _ZERO else None)


def matches(flow: FlowSpec, pkt: dict) -> bool:
    for name, want in flow.match:
        have = field_of(pkt, name)
        if have is None:
            return False
        if isinstance(want, tuple):
            value, mask = want
            if field_int(name, have) & field_int(name, mask) != field_int(name, value) & field_int(name, mask):
                return False
        elif field_int(name, have) != field_int(name, want):
            return False
    return True


def symmetric_hash(pkt: dict) -> int:
    """A hash of the 5-tuple equal in both directions (OVS's select groups hash sym_l4)."""
    ends = sorted([(str(pkt.get("ipv4_src")), pkt.get("tcp_src", pkt.get("udp_src", 0))),
                   (str(pkt.get("ipv4_dst")), pkt.get("tcp_dst", pkt.get("udp_dst", 0)))])
    return zlib.crc32(repr((pkt.get("ip_proto", 0), ends)).encode())


@dataclass
class Step:
    """One flow a pass went through (or a table where none matched: `flow` None)."""
    table: int
    flow: FlowSpec | None
    depth: int
    notes: list[str] = field(default_factory=list)


@dataclass
class Emitted:
    """A packet a pass sent out of `port` (an OpenFlow port number, or a reserved one)."""
    port: int
    packet: dict
    step: int                  # index of the step whose actions sent it


@dataclass
class Pass:
    steps: list[Step] = field(default_factory=list)
    out: list[Emitted] = field(default_factory=list)
    # where a branch of the pass ended without output: (index of the step, why, the packet then)
    ends: list[tuple[int, str, dict]] = field(default_factory=list)


class Tables:
    """A switch's flows by table, in decreasing priority, and its groups."""

    def __init__(self, state: SwitchState):
        self.tables: dict[int, list[FlowSpec]] = {}
        for f in state.flows:
            self.tables.setdefault(f.table, []).append(f)
        for flows in self.tables.values():
            flows.sort(key=lambda f: (-f.priority, f.match))
        self.groups = {g.group_id: g for g in state.groups}

    def lookup(self, table: int, pkt: dict) -> FlowSpec | None:
        return self._lookup(self.tables.get(table, []), pkt)

    def _lookup(self, flows: list[FlowSpec], pkt: dict) -> FlowSpec | None:
        """The deciding flow. Flows whose actions are all `conjunction` are clauses: at the highest
        priority where any clause matches, a conjunction all of whose clauses matched sets conj_id
        and the table is searched again with it; none complete: lower priorities decide."""
        top = None
        seen: dict[int, set[int]] = {}
        size: dict[int, int] = {}
        for f in flows:
            if top is not None and f.priority != top:
                break
            if not matches(f, pkt):
                continue
            if f.actions and all(isinstance(a, Conjunction) for a in f.actions):
                top = f.priority
                for c in f.actions:
                    seen.setdefault(c.id, set()).add(c.clause)
                    size[c.id] = c.n_clauses
            elif top is None:
                return f
        for conj in sorted(c for c, clauses in seen.items() if len(clauses) == size[c]):
            with_id = {**pkt, "conj_id": conj}
            found = next((f for f in flows if dict(f.match).get("conj_id") == conj and matches(f, with_id)), None)
            if found is not None:
                return found
        if top is not None:
            return self._lookup([f for f in flows if f.priority < top], pkt)
        return None


_KEPT: OrderedDict[int, tuple[SwitchState, Tables]] = OrderedDict()
_KEPT_LOCK = threading.Lock()
KEPT = 128          # switch states whose Tables are kept


def tables_of(state: SwitchState) -> Tables:
    """The Tables of a switch's state, kept for the KEPT states used last: traces after one
    controller pass read the same states, and sorting a switch's flows costs more than a pass."""
    with _KEPT_LOCK:
        hit = _KEPT.get(id(state))
        if hit is not None and hit[0] is state:
            _KEPT.move_to_end(id(state))
            return hit[1]
    made = Tables(state)
    with _KEPT_LOCK:
        _KEPT[id(state)] = (state, made)
        while len(_KEPT) > KEPT:
            _KEPT.popitem(last=False)
    return made


def forget_tables() -> None:
    with _KEPT_LOCK:
        _KEPT.clear()


def run(tables: Tables, pkt: dict, ct_state: int, table: int = 0) -> Pass:
    """One pass of `pkt` (a dict of match-field names; `in_port` set) from `table`."""
    p = Pass()
    _table(tables, table, dict(pkt), ct_state, p, 0)
    return p


def _table(tables: Tables, table: int, pkt: dict, ct_state: int, p: Pass, depth: int) -> None:
    if depth > MAX_DEPTH or len(p.steps) >= MAX_STEPS:
        raise LoopError(f"more than {MAX_DEPTH} nested tables or {MAX_STEPS} flows in one pass")
    flow = tables.lookup(table, pkt)
    p.steps.append(Step(table, flow, depth))
    index = len(p.steps) - 1
    if flow is None:
        p.ends.append((index, "no flow matched (table miss: drop)", dict(pkt)))
        return
    sent = len(p.out)
    _actions(tables, flow.actions, pkt, ct_state, p, depth, index)
    if not flow.actions:
        p.ends.append((index, "no flow matched (table miss: drop)" if flow.priority == 0 else "the flow drops it",
                       dict(pkt)))
    elif len(p.out) == sent and not any(isinstance(a, (GotoTable, Resubmit, Group, Ct)) for a in flow.actions):
        p.ends.append((index, "the flow's actions send it nowhere", dict(pkt)))


def _actions(tables: Tables, actions: tuple, pkt: dict, ct_state: int, p: Pass, depth: int, step: int) -> None:
    notes = p.steps[step].notes
    for a in actions:
        if isinstance(a, SetField):
            if a.field == "vlan_vid":
                pkt["vlan"] = a.value & 0xFFF
            else:
                pkt[a.field] = a.value
        elif isinstance(a, LoadReg):
            mask = ((1 << a.n_bits) - 1) << a.ofs
            pkt[a.field] = (pkt.get(a.field, 0) & ~mask) | (a.value << a.ofs)
        elif isinstance(a, Move):
            bits = (field_int(a.src, field_of(pkt, a.src) or 0) >> a.src_ofs) & ((1 << a.n_bits) - 1)
            mask = ((1 << a.n_bits) - 1) << a.dst_ofs
            old = field_int(a.dst, field_of(pkt, a.dst) or 0)
            pkt[a.dst] = field_value(a.dst, (old & ~mask) | (bits << a.dst_ofs))
        elif isinstance(a, PushVlan):
            pkt["vlan"] = 0
        elif isinstance(a, PopVlan):
            pkt["vlan"] = None
        elif isinstance(a, DecTtl):
            if pkt.get("ttl", 64) <= 1:
                p.ends.append((step, "TTL expired (dec_ttl)", dict(pkt)))
                return
            pkt["ttl"] = pkt.get("ttl", 64) - 1
        elif isinstance(a, (Output, OutputTrunc)):
            port = pkt["in_port"] if a.port == OFPP_IN_PORT else a.port
            if a.port == OFPP_IN_PORT or port != pkt["in_port"]:
                p.out.append(Emitted(port, dict(pkt), step))
            else:
                notes.append(f"output:{port} is the in_port: not sent")
        elif isinstance(a, Controller):
            p.out.append(Emitted(OFPP_CONTROLLER, dict(pkt), step))
        elif isinstance(a, Meter):
            notes.append(f"meter {a.meter_id}: assumed under its rate")
        elif isinstance(a, Group):
            group = tables.groups.get(a.group_id)
            if group is None:
                p.ends.append((step, f"group {a.group_id} does not exist", dict(pkt)))
                continue
            buckets = list(group.buckets)
            if group.type == "select" and buckets:
                pick = symmetric_hash(pkt) % len(buckets)
                notes.append(f"group {a.group_id} (select): bucket {pick + 1} of {len(buckets)}, picked by a "
                             f"symmetric hash of the 5-tuple (OVS hashes the same fields; its pick may differ)")
                buckets = [buckets[pick]]
            elif group.type == "all":
                notes.append(f"group {a.group_id} (all): {len(buckets)} bucket(s), each followed")
            if not buckets:
                p.ends.append((step, f"group {a.group_id} has no bucket", dict(pkt)))
            for bucket in buckets:
                _actions(tables, bucket, dict(pkt), ct_state, p, depth, step)
        elif isinstance(a, GotoTable):
            _table(tables, a.table, pkt, ct_state, p, depth + 1)
            return
        elif isinstance(a, Resubmit):
            _table(tables, a.table, dict(pkt), ct_state, p, depth + 1)
        elif isinstance(a, Ct):
            _ct(a, pkt, ct_state, notes)
            if a.table is not None:
                _table(tables, a.table, dict(pkt), ct_state, p, depth + 1)
        elif isinstance(a, CtClear):
            for name in _CT_FIELDS:
                pkt.pop(name, None)
        elif isinstance(a, Conjunction):
            pass    # a clause: resolved by the lookup
        elif isinstance(a, Sample):
            notes.append(f"sampled for flow records (observation point {a.obs_point_id:#x})")
        else:       # an action this interpreter does not know: said, and this branch ends there
            what = a.to_ofctl() if hasattr(a, "to_ofctl") else type(a).__name__
            p.ends.append((step, f"{what} is not interpreted by the simulation", dict(pkt)))
            return


def _ct(a: Ct, pkt: dict, ct_state: int, notes: list[str]) -> None:
    zone = (pkt.get(a.zone_field, 0) >> a.zone_ofs) & 0xFFFF if a.zone_field else a.zone
    if a.nat is not None and a.nat.kind is not None:
        name = "ipv4_src" if a.nat.kind == "src" else "ipv4_dst"
        notes.append(f"ct zone {zone}: {a.nat.kind}-NAT {pkt.get(name)} -> {a.nat.ip}")
        pkt[name] = a.nat.ip
    elif a.nat is not None:
        notes.append(f"ct zone {zone}: the connection's existing NAT is applied (not known to a simulation: "
                     f"addresses unchanged)")
    if a.table is None:     # OVS: untracked for the rest of the pass
        for name in _CT_FIELDS[:4]:
            pkt.pop(name, None)
        if a.commit:
            notes.append(f"ct zone {zone}: committed")
        return
    pkt.update(ct_state=ct_state, ct_zone=zone, ct_mark=0, ct_label=0)
    state = "+trk+new" if ct_state == CT_NEW else "+trk+est"
    notes.append(f"ct zone {zone}{' commit' if a.commit else ''}: recirculated as {state} (assumed)")


def describe(flow: FlowSpec) -> tuple[str, str]:
    """(match, actions) of a flow as ovs-ofctl prints them."""
    return format_match(flow.match), ",".join(a.to_ofctl() for a in flow.actions) or "drop"
