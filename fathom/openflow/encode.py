"""Specs to os-ken OpenFlow messages and back.

`decode_flow` / `decode_group` turn what a switch reports (flow stats, group descriptions) into the
same spec values the compilers produce, so the reconciler diffs desired and actual state with set
arithmetic. Anything the switch reports in another but equivalent form is normalised here.
"""
from __future__ import annotations

import operator
import struct

from fathom.openflow import spec as s

NX_CT_F_COMMIT = 1          # ct(commit)
NX_CT_RECIRC_NONE = 0xFF    # ct without table=: the packet goes on with the next action

# the bits of a LoadReg's ofs_nbits field: ofs << 6 | (n_bits - 1)


# Nicira ct and nat flags (OVS include/openflow/nicira-ext.h)
NX_CT_F_COMMIT = 1
NX_CT_RECIRC_NONE = 0xFF
NX_NAT_F_SRC, NX_NAT_F_DST = 1, 2


def _ofs_nbits(ofs: int, n_bits: int) -> int:
    return (ofs << 6) | (n_bits - 1)


def encode_action(parser, ofp, a):
    if isinstance(a, s.Output):
        return parser.OFPActionOutput(a.port, ofp.OFPCML_NO_BUFFER if a.port == ofp.OFPP_CONTROLLER else 0)
    if isinstance(a, s.Controller):
        return parser.OFPActionOutput(ofp.OFPP_CONTROLLER, a.max_len)
    if isinstance(a, s.OutputTrunc):
        return parser.NXActionOutputTrunc(port=a.port, max_len=a.max_len)
    if isinstance(a, s.SetField):
        return parser.OFPActionSetField(**{a.field: a.value})
    if isinstance(a, s.PushVlan):
        return parser.OFPActionPushVlan(a.ethertype)
    if isinstance(a, s.PopVlan):
        return parser.OFPActionPopVlan()
    if isinstance(a, s.DecTtl):
        return parser.OFPActionDecNwTtl()
    if isinstance(a, s.Group):
        return parser.OFPActionGroup(a.group_id)
    if isinstance(a, s.Resubmit):
        return parser.NXActionResubmitTable(in_port=s.NX_IN_PORT if a.in_port is None else a.in_port,
                                            table_id=a.table)
    if isinstance(a, s.Move):
        return parser.NXActionRegMove(src_field=a.src, dst_field=a.dst, n_bits=a.n_bits,
                                      src_ofs=a.src_ofs, dst_ofs=a.dst_ofs)
    if isinstance(a, s.LoadReg):
        return parser.NXActionRegLoad(ofs_nbits=_ofs_nbits(a.ofs, a.n_bits), dst=a.field, value=a.value)
    if isinstance(a, s.Ct):
        zone = _ofs_nbits(a.zone_ofs, 16) if a.zone_field else a.zone
        nat = []
        if a.nat is not None:
            flags = {None: 0, "src": NX_NAT_F_SRC, "dst": NX_NAT_F_DST}[a.nat.kind]
            nat = [parser.NXActionNAT(flags, range_ipv4_min=a.nat.ip or "", range_ipv4_max=a.nat.ip or "")]
        return parser.NXActionCT(flags=NX_CT_F_COMMIT if a.commit else 0, zone_src=a.zone_field or "",
                                 zone_ofs_nbits=zone,
                                 recirc_table=NX_CT_RECIRC_NONE if a.table is None else a.table, alg=0,
                                 actions=nat + [encode_action(parser, ofp, x) for x in a.exec])
    if isinstance(a, s.CtClear):
        return parser.NXActionCTClear()
    if isinstance(a, s.Conjunction):
        # on the wire the clause is 0-based; ovs-ofctl (and the spec) count from 1
        return parser.NXActionConjunction(clause=a.clause - 1, n_clauses=a.n_clauses, id_=a.id)
    if isinstance(a, s.Sample):
        return parser.NXActionSample(probability=a.probability, collector_set_id=a.collector_set_id,
                                     obs_domain_id=a.obs_domain_id, obs_point_id=a.obs_point_id)
    raise TypeError(f"cannot encode action {a!r}")


def instructions(parser, ofp, flow: s.FlowSpec) -> list:
    out = []
    if flow.meter_id() is not None:
        out.append(parser.OFPInstructionMeter(flow.meter_id()))
    actions = flow.apply_actions()
    if actions:
        out.append(parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS,
                                                [encode_action(parser, ofp, a) for a in actions]))
    if flow.goto_table() is not None:
        out.append(parser.OFPInstructionGotoTable(flow.goto_table()))
    return out


def flow_mod(dp, flow: s.FlowSpec, delete: bool = False):
    ofp, parser = dp.ofproto, dp.ofproto_parser
    match = parser.OFPMatch(**flow.match_dict)
    if delete:
        return parser.OFPFlowMod(dp, cookie=flow.cookie, cookie_mask=0xFFFFFFFFFFFFFFFF, table_id=flow.table,
                                 command=ofp.OFPFC_DELETE_STRICT, priority=flow.priority, match=match,
                                 out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY)
    # ADD replaces an entry with the same table, priority and match: it serves both add and modify
    return parser.OFPFlowMod(dp, cookie=flow.cookie, table_id=flow.table, command=ofp.OFPFC_ADD,
                             priority=flow.priority, match=match, instructions=instructions(parser, ofp, flow))


GROUP_TYPE = {"all": "OFPGT_ALL", "select": "OFPGT_SELECT", "indirect": "OFPGT_INDIRECT"}


def group_mod(dp, group: s.GroupSpec, command: str):
    """command: add | modify | delete."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    cmd = {"add": ofp.OFPGC_ADD, "modify": ofp.OFPGC_MODIFY, "delete": ofp.OFPGC_DELETE}[command]
    buckets = [] if command == "delete" else [
        parser.OFPBucket(weight=1 if group.type == "select" else 0, watch_port=ofp.OFPP_ANY,
                         watch_group=ofp.OFPG_ANY, actions=[encode_action(parser, ofp, a) for a in b])
        for b in group.buckets]
    return parser.OFPGroupMod(dp, command=cmd, type_=getattr(ofp, GROUP_TYPE[group.type]),
                              group_id=group.group_id, buckets=buckets)


# ------------------------------------------------------------------------------------------ decoding

def decode_action(ofp, a):
    name = type(a).__name__
    if name == "OFPActionOutput":
        if a.port == ofp.OFPP_CONTROLLER:
            return s.Controller(a.max_len)
        return s.Output(a.port)
    if name == "OFPActionSetField":
        return s.SetField(a.key, a.value)
    if name == "NXActionOutputTrunc":
        return s.OutputTrunc(a.port, a.max_len)
    if name == "OFPActionPushVlan":
        return s.PushVlan(a.ethertype)
    if name == "OFPActionPopVlan":
        return s.PopVlan()
    if name == "OFPActionDecNwTtl":
        return s.DecTtl()
    if name == "OFPActionGroup":
        return s.Group(a.group_id)
    if name == "NXActionResubmitTable":
        return s.Resubmit(a.table_id, None if a.in_port == s.NX_IN_PORT else a.in_port)
    if name == "NXActionRegMove":
        # os-ken reports Nicira-only names for some fields (eth_src_nxm); the spec uses the OXM ones
        return s.Move(a.src_field.removesuffix("_nxm"), a.dst_field.removesuffix("_nxm"), a.n_bits,
                      a.src_ofs, a.dst_ofs)
    if name == "NXActionRegLoad":
        return s.LoadReg(a.dst, a.value, a.ofs_nbits >> 6, (a.ofs_nbits & 0x3F) + 1)
    if name == "NXActionCT":
        zone_field = a.zone_src or None
        nat = next((x for x in a.actions if type(x).__name__ == "NXActionNAT"), None)
        if nat is not None:
            kind = "src" if nat.flags & NX_NAT_F_SRC else "dst" if nat.flags & NX_NAT_F_DST else None
            nat = s.Nat(kind, nat.range_ipv4_min if kind else None)
        return s.Ct(zone=0 if zone_field else a.zone_ofs_nbits, zone_field=zone_field,
                    zone_ofs=a.zone_ofs_nbits >> 6 if zone_field else 0,
                    table=None if a.recirc_table == NX_CT_RECIRC_NONE else a.recirc_table,
                    commit=bool(a.flags & NX_CT_F_COMMIT), nat=nat,
                    exec=tuple(decode_action(ofp, x) for x in a.actions if type(x).__name__ != "NXActionNAT"))
    if name == "NXActionCTClear":
        return s.CtClear()
    if name == "NXActionConjunction":
        return s.Conjunction(a.id, a.clause + 1, a.n_clauses)
    if name in ("NXActionSample", "NXActionSample2"):
        return s.Sample(a.probability, a.collector_set_id, a.obs_domain_id, a.obs_point_id)
    return ("unknown", name, repr(a))  # never equal to a desired action: the flow gets rewritten


def decode_flow(ofp, stat) -> s.FlowSpec:
    actions = []
    for inst in stat.instructions:
        if type(inst).__name__ == "OFPInstructionMeter":
            actions.append(s.Meter(inst.meter_id))
    for inst in stat.instructions:
        if type(inst).__name__ == "OFPInstructionActions" and inst.type == ofp.OFPIT_APPLY_ACTIONS:
            actions += [decode_action(ofp, a) for a in inst.actions]
    for inst in stat.instructions:
        if type(inst).__name__ == "OFPInstructionGotoTable":
            actions.append(s.GotoTable(inst.table_id))
    match = [(k, _decode_value(v)) for k, v in stat.match._fields2]
    return s.FlowSpec(stat.table_id, stat.priority, match, tuple(actions), stat.cookie)


def _decode_value(v):
    return tuple(v) if isinstance(v, list) else v


def decode_group(ofp, desc) -> s.GroupSpec:
    names = {getattr(ofp, v): k for k, v in GROUP_TYPE.items()}
    buckets = tuple(tuple(decode_action(ofp, a) for a in b.actions) for b in desc.buckets)
    return s.GroupSpec(desc.group_id, names.get(desc.type, str(desc.type)), buckets)


# ------------------------------------------------------------------------------------------ meters

def meter_mod(dp, meter: s.MeterSpec, command: str):
    """command: add | modify | delete. One drop band; burst given -> the burst flag."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    cmd = {"add": ofp.OFPMC_ADD, "modify": ofp.OFPMC_MODIFY, "delete": ofp.OFPMC_DELETE}[command]
    flags = ofp.OFPMF_PKTPS if meter.unit == "pktps" else ofp.OFPMF_KBPS
    if meter.burst:
        flags |= ofp.OFPMF_BURST
    bands = [] if command == "delete" else [parser.OFPMeterBandDrop(rate=meter.rate, burst_size=meter.burst)]
    return parser.OFPMeterMod(dp, command=cmd, flags=flags, meter_id=meter.meter_id, bands=bands)


def decode_meter(ofp, config) -> s.MeterSpec:
    unit = "pktps" if config.flags & ofp.OFPMF_PKTPS else "kbps"
    band = config.bands[0] if config.bands else None
    return s.MeterSpec(config.meter_id, band.rate if band else 0,
                       band.burst_size if band is not None and config.flags & ofp.OFPMF_BURST else 0, unit)


# ------------------------------------------------------------------------------------------ wire bytes

# Encoded messages by (OpenFlow version, kind, command, spec), without their xid: building and
# serialising an os-ken message costs ~0.3 ms per flow, so a flow is encoded once per process and a
# re-install (a switch restarted or wiped, a reconnect) only pays for the bytes on the wire.
_WIRE_CACHE: dict[tuple, bytes] = {}
WIRE_CACHE_MAX = 500_000   # entries (~150 bytes each); the older half is dropped when full
_XID = struct.Struct("!I")


# A flow-mod is its fixed fields, its match (one OXM TLV per field, in os-ken's order) and its
# instructions. Most of a new flow's parts were seen before in other flows (in_port=3, a network's
# metadata, the same actions): each part is encoded once by os-ken and kept, so a new flow costs
# dict lookups and one struct pack (the bytes equal os-ken's: tests/unit/test_spec_encode.py).
_FIELD_CACHE: dict[tuple, tuple[int, bytes]] = {}     # (version, field, value) -> (os-ken's sort key, TLV)
_INSTRUCTIONS_CACHE: dict[tuple, bytes] = {}         # (version, actions) -> instructions
_PART_CACHE_MAX = 200_000
_MATCH_HEADER = struct.Struct("!HH")


def _bounded(cache: dict, key, value):
    if len(cache) >= _PART_CACHE_MAX:
        cache.clear()
    cache[key] = value
    return value


def _field(ofp, parser, name: str, value) -> tuple[int, bytes]:
    key = (ofp.OFP_VERSION, name, value)
    got = _FIELD_CACHE.get(key)
    if got is None:
        match = parser.OFPMatch(**{name: value})
        buf = bytearray()
        match.serialize(buf, 0)
        num = ofp.oxm_from_user(*match._fields2[0])[0]
        got = _bounded(_FIELD_CACHE, key, (num[0] if isinstance(num, tuple) else num, bytes(buf[4:match.length])))
    return got


def _match_bytes(ofp, parser, flow: s.FlowSpec) -> bytes:
    """The ofp_match of a flow, as os-ken serialises it: fields sorted by OXM type (a stable sort:
    fields of one experimenter stay in the spec's order), padded to 8 bytes."""
    fields = [_field(ofp, parser, name, value) for name, value in flow.match]
    fields.sort(key=operator.itemgetter(0))
    body = b"".join(tlv for _, tlv in fields)
    length = 4 + len(body)
    return _MATCH_HEADER.pack(ofp.OFPMT_OXM, length) + body + bytes(-length % 8)


def _instructions_bytes(ofp, parser, flow: s.FlowSpec) -> bytes:
    key = (ofp.OFP_VERSION, flow.actions)
    got = _INSTRUCTIONS_CACHE.get(key)
    if got is None:
        buf = bytearray()
        for inst in instructions(parser, ofp, flow):
            inst.serialize(buf, len(buf))
        got = _bounded(_INSTRUCTIONS_CACHE, key, bytes(buf))
    return got


def flow_mod_bytes(dp, flow: s.FlowSpec, delete: bool = False) -> bytes:
    """The bytes of `flow_mod(dp, flow, delete)` serialised with xid 0, from kept parts."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    if delete:
        fixed = (flow.cookie, 0xFFFFFFFFFFFFFFFF, flow.table, ofp.OFPFC_DELETE_STRICT, 0, 0, flow.priority,
                 ofp.OFP_NO_BUFFER, ofp.OFPP_ANY, ofp.OFPG_ANY, 0)
        tail = b""
    else:
        fixed = (flow.cookie, 0, flow.table, ofp.OFPFC_ADD, 0, 0, flow.priority, ofp.OFP_NO_BUFFER, 0, 0, 0)
        tail = _instructions_bytes(ofp, parser, flow)
    if ofp.OFP_VERSION >= 0x05:
        fixed += (0,)   # importance
    body = struct.pack(ofp.OFP_FLOW_MOD_PACK_STR0, *fixed) + _match_bytes(ofp, parser, flow) + tail
    return struct.pack(ofp.OFP_HEADER_PACK_STR, ofp.OFP_VERSION, ofp.OFPT_FLOW_MOD,
                       ofp.OFP_HEADER_SIZE + len(body), 0) + body


class Wire:
    """One message to a switch, built from a spec: `wire(xid)` its bytes (cached, see above),
    `message()` the os-ken message (for the request/reply path). kind: flow | group | meter;
    command: add | modify | delete (a flow's add also replaces it)."""
    __slots__ = ("dp", "kind", "command", "spec")

    def __init__(self, dp, kind: str, spec, command: str = "add"):
        self.dp, self.kind, self.spec, self.command = dp, kind, spec, command

    def message(self):
        if self.kind == "flow":
            return flow_mod(self.dp, self.spec, delete=self.command == "delete")
        if self.kind == "group":
            return group_mod(self.dp, self.spec, self.command)
        return meter_mod(self.dp, self.spec, self.command)

    def wire(self, xid: int) -> bytes:
        key = (self.dp.ofproto.OFP_VERSION, self.kind, self.command, self.spec)
        body = _WIRE_CACHE.get(key)
        if body is None:
            if self.kind == "flow":
                body = flow_mod_bytes(self.dp, self.spec, delete=self.command == "delete")
            else:
                msg = self.message()
                msg.set_xid(0)
                msg.serialize()
                body = bytes(msg.buf)
            if len(_WIRE_CACHE) >= WIRE_CACHE_MAX:
                for old in list(_WIRE_CACHE)[:WIRE_CACHE_MAX // 2]:
                    del _WIRE_CACHE[old]
            _WIRE_CACHE[key] = body
        return body[:4] + _XID.pack(xid) + body[8:]

    def __repr__(self) -> str:
        return f"Wire({self.kind} {self.command} {self.spec!r})"
