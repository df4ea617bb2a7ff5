"""Talking to one switch: the difference between desired and actual state, and a session that reads a
switch and applies a change to it.

`OsKenSession` is a switch connected over OpenFlow (os-ken); `fathom.controller.fakeswitch` is a
switch in memory behind the same interface, which decodes the same encoded messages. The
reconciler only ever talks to a session.
"""
from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass, field

import os_ken.app.ofctl.api as ofctl
from os_ken.app.ofctl.exception import OFError

from fathom.openflow import encode
from fathom.openflow.spec import FlowSpec, GroupSpec, MeterSpec, SwitchState
from fathom.pipeline.cookies import owns_cookie, owns_id

_bundle_ids = itertools.count(1)


class ApplyError(Exception):
    """The switch refused a change; `refused` holds the specs whose messages it named (if any)."""

    def __init__(self, message: str, refused: tuple = ()):
        super().__init__(message)
        self.refused = tuple(refused)


# ---------------------------------------------------------------------------------------------- encoding

# Encoded flow mods by (OpenFlow version, flow, delete): a flow is encoded once, so a resync or a
# replay of flows already sent costs a look-up instead of building os-ken objects again. Bounded.
_ENCODED: dict[tuple, bytes] = {}
ENCODED_MAX = 100_000


class FlowMessage:
    """A flow mod to send: the bytes of `encode.flow_mod`, encoded once (xid 0, patched on send)."""
    __slots__ = ("dp", "spec", "delete")

    def __init__(self, dp, spec: FlowSpec, delete: bool = False):
        self.dp, self.spec, self.delete = dp, spec, delete

    def encoded(self) -> bytes:
        key = (self.dp.ofproto.OFP_VERSION, self.spec, self.delete)
        data = _ENCODED.get(key)
        if data is None:
            msg = self.message()
            msg.set_xid(0)
            msg.serialize()
            data = bytes(msg.buf)
            if len(_ENCODED) >= ENCODED_MAX:
                _ENCODED.clear()
            _ENCODED[key] = data
        return data

    def set_xid(self, xid: int) -> None:
        """Datapath.set_xid hands us the xid; it goes into the bytes in `with_xid`."""

    def with_xid(self, xid: int) -> bytearray:
        data = bytearray(self.encoded())
        struct.pack_into("!I", data, 4, xid)
        return data

    def message(self):
        """The os-ken message (for a switch that takes no bundles)."""
        return encode.flow_mod(self.dp, self.spec, delete=self.delete)


# ---------------------------------------------------------------------------------------------- diff


@dataclass
class Change:
    """What to send to one switch, split so nothing is ever missing while it is used:
    `make` (meters, groups, then flows that may use them) goes first on every switch, `break_` (flows,
    then the groups and meters they used) after every switch took its `make`."""
    put: list = field(default_factory=list)          # flows to add or replace
    delete: list = field(default_factory=list)
    add_g: list = field(default_factory=list)
    mod_g: list = field(default_factory=list)
    del_g: list = field(default_factory=list)
    add_m: list = field(default_factory=list)
    mod_m: list = field(default_factory=list)
    del_m: list = field(default_factory=list)

    def __len__(self) -> int:
        return sum(len(x) for x in self.__dict__.values())

    def without(self, owners: set) -> "Change":
        """The same change minus everything owned by `owners` (cookies' (app, kind, object id))."""
        from fathom.pipeline.cookies import parse_cookie
        keep = lambda specs: [s for s in specs if parse_cookie(s.cookie) not in owners]  # noqa: E731
        return Change(*(keep(v) for v in self.__dict__.values()))


def diff(desired: SwitchState, actual_flows: set, actual_groups: set, actual_meters: set | None) -> Change:
    """What to change so the switch holds exactly the desired flows, groups and meters it owns.

    Ours is decided by one rule for every switch (fathom.pipeline.cookies): a flow by its cookie, a
    group or meter by its id. `actual_meters` None means "not read" (no meters wanted or left).
    """
    # Set differences first (the flows both sides share are mostly the very same objects, so this is
    # fast), then keys only for what differs: its cost follows the change, not the table.
    actual = actual_flows if isinstance(actual_flows, (set, frozenset)) else set(actual_flows)
    new = desired.flows - actual
    gone = actual - desired.flows
    c = Change()
    c.put = list(new)
    replaced = {f.key for f in new}
    c.delete = [f for f in gone if f.key not in replaced and owns_cookie(f.cookie)]
    actual_g = {g.group_id: (g.type, g.buckets) for g in actual_groups}
    for g in desired.groups:
        have = actual_g.get(g.group_id)
        if have is None:
            c.add_g.append(g)
        elif have != (g.type, g.buckets):
            c.mod_g.append(g)
    wanted_g = {g.group_id for g in desired.groups}
    c.del_g = [g for g in actual_groups if g.group_id not in wanted_g and owns_id(g.group_id)]
    if actual_meters is not None:
        have_m = {m.meter_id: m.key for m in actual_meters}
        c.add_m = [m for m in desired.meters if m.meter_id not in have_m]
        c.mod_m = [m for m in desired.meters if m.meter_id in have_m and have_m[m.meter_id] != m.key]
        wanted_m = {m.meter_id for m in desired.meters}
        c.del_m = [m for m in actual_meters if m.meter_id not in wanted_m and owns_id(m.meter_id)]
    return c


def make_messages(dp, c: Change) -> tuple[list, list]:
    """(plain, bundled) (spec, message) pairs of the make half: meters first (OVS takes no meter mod in
    a bundle), then groups before the flows that use them."""
    plain = [(m, encode.meter_mod(dp, m, "add")) for m in c.add_m] + [(m, encode.meter_mod(dp, m, "modify"))
                                                                         for m in c.mod_m]
    bundled = ([(g, encode.group_mod(dp, g, "add")) for g in c.add_g]
               + [(g, encode.group_mod(dp, g, "modify")) for g in c.mod_g]
               + [(f, FlowMessage(dp, f)) for f in c.put])
    return plain, bundled


def break_messages(dp, c: Change) -> tuple[list, list]:
    """(bundled, plain) pairs of the break half: flows, then the groups they used; meters after."""
    bundled = [(f, FlowMessage(dp, f, delete=True)) for f in c.delete] + [(g, encode.group_mod(dp, g, "delete"))
                                                                           for g in c.del_g]
    plain = [(m, encode.meter_mod(dp, m, "delete")) for m in c.del_m]
    return bundled, plain


def whole_messages(dp, c: Change) -> tuple[list, list, list]:
    """(plain before, bundled, plain after) pairs of a whole change in one atomic bundle, for a
    change of one switch alone (a reconnect's replay): what is new, then what is gone, so the
    switch never holds less than the flows still wanted, not even between two bundles."""
    plain, make = make_messages(dp, c)
    gone, after = break_messages(dp, c)
    return plain, make + gone, after


# ---------------------------------------------------------------------------------------------- sessions


class OsKenSession:
    """A switch connected to os-ken: reads are multipart requests, changes one atomic bundle (OpenFlow
    1.4+) or messages in order followed by a barrier."""

    def __init__(self, app, dp):
        self.app, self.dp = app, dp
        self.dpid = dp.id

    def alive(self) -> bool:
        """False once the connection is closed, even before the app has heard of it."""
        return self.app.still_connected(self.dp)

    def read_flows(self) -> set[FlowSpec]:
        ofp, parser = self.dp.ofproto, self.dp.ofproto_parser
        req = parser.OFPFlowStatsRequest(self.dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0,
                                         parser.OFPMatch())
        replies = ofctl.send_msg(self.app, req, reply_cls=parser.OFPFlowStatsReply, reply_multi=True) or []
        return {encode.decode_flow(ofp, stat) for r in replies for stat in r.body}

    def count_flows(self) -> int:
        """How many flows the switch holds (one aggregate-stats round trip, whatever their number)."""
        ofp, parser = self.dp.ofproto, self.dp.ofproto_parser
        req = parser.OFPAggregateStatsRequest(self.dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0,
                                              parser.OFPMatch())
        replies = ofctl.send_msg(self.app, req, reply_cls=parser.OFPAggregateStatsReply, reply_multi=True) or []
        return sum(r.body.flow_count for r in replies)

    def read_groups(self) -> set[GroupSpec]:
        parser = self.dp.ofproto_parser
        req = parser.OFPGroupDescStatsRequest(self.dp, 0)
        replies = ofctl.send_msg(self.app, req, reply_cls=parser.OFPGroupDescStatsReply, reply_multi=True) or []
        return {encode.decode_group(self.dp.ofproto, d) for r in replies for d in r.body}

    def read_meters(self) -> set[MeterSpec]:
        ofp, parser = self.dp.ofproto, self.dp.ofproto_parser
        req = parser.OFPMeterConfigStatsRequest(self.dp, 0, ofp.OFPM_ALL)
        replies = ofctl.send_msg(self.app, req, reply_cls=parser.OFPMeterConfigStatsReply, reply_multi=True) or []
        return {encode.decode_meter(ofp, c) for r in replies for c in r.body}

    def bundle(self, pairs: list) -> None:
        """Send (spec, message) pairs as one atomic bundle; ApplyError names the refused specs.

        The open and the adds are pipelined (no round trip each); the commit reply, after them on
        the same connection, tells whether the switch took the whole change: one round trip per
        change. An error on any add (or on the open) fails it all.
        """
        if not pairs:
            return
        dp, app = self.dp, self.app
        ofp, parser = dp.ofproto, dp.ofproto_parser
        if ofp.OFP_VERSION < 0x05:
            return self.plain(pairs)
        bid = next(_bundle_ids) & 0xFFFFFFFF
        flags = ofp.OFPBF_ATOMIC | ofp.OFPBF_ORDERED
        ctrl = lambda t: parser.OFPBundleCtrlMsg(dp, bid, t, flags, [])  # noqa: E731
        # the open is not waited for: a refused open fails the commit, whose reply is awaited below
        dp.send_msg(ctrl(ofp.OFPBCT_OPEN_REQUEST))
        by_xid = {}
        head = struct.Struct("!BBHI" + ofp.OFP_BUNDLE_ADD_MSG_0_PACK_STR[1:])
        for spec, m in pairs:
            if isinstance(m, FlowMessage):
                # the bundle add around the encoded flow mod, both with the same xid (OF1.4 7.3.9.2)
                xid = dp.set_xid(m)
                inner = m.with_xid(xid)
                dp.send(head.pack(ofp.OFP_VERSION, ofp.OFPT_BUNDLE_ADD_MESSAGE, head.size + len(inner), xid,
                                  bid, flags) + inner)
                by_xid[xid] = spec
                continue
            add = parser.OFPBundleAddMsg(dp, bid, flags, m, [])
            dp.set_xid(add)
            by_xid[add.xid] = spec
            dp.send_msg(add)
        try:
            ofctl.send_msg(app, ctrl(ofp.OFPBCT_COMMIT_REQUEST), reply_cls=parser.OFPBundleCtrlMsg)
            failed = None
        except OFError as e:
            failed = e
        errors = app.take_errors(dp.id, list(by_xid))
        if failed is not None or errors:
            refused = [by_xid[e.xid] for e in errors if e.xid in by_xid]
            first = errors[0] if errors else getattr(failed, "result", None)
            raise ApplyError(f"switch {dp.id:016x} refused the change: {OFError(result=first)}", refused)

    def plain(self, pairs: list) -> None:
        """Send messages in order, each waiting for its barrier (errors raise ApplyError)."""
        for spec, m in pairs:
            if isinstance(m, FlowMessage):
                m = m.message()
            try:
                ofctl.send_msg(self.app, m)
            except OFError as e:
                raise ApplyError(f"switch {self.dp.id:016x} refused the change: {e}", (spec,)) from e


class OsKenSwitches:
    """The switches connected to an os-ken app, by datapath id."""

    def __init__(self, app):
        self.app = app

    def session(self, dpid: int) -> OsKenSession | None:
        dp = self.app.datapath(dpid)
        return OsKenSession(self.app, dp) if dp is not None else None

    def connected(self) -> list[int]:
        return list(self.app.datapaths)

    def lost_since(self, dpid: int) -> float | None:
        """When a switch that had connected lost its connection (None: connected, or never was)."""
        return self.app.lost_since(dpid)


# Raw reads other modules use for counters (taps, node flows)


def read_flows(app, dp) -> set[FlowSpec]:
    return OsKenSession(app, dp).read_flows()


def read_groups(app, dp) -> set[GroupSpec]:
    return OsKenSession(app, dp).read_groups()


def read_flow_stats(app, dp) -> list:
    """Raw os-ken flow stats (with counters), for status and metrics."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    req = parser.OFPFlowStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0, parser.OFPMatch())
    replies = ofctl.send_msg(app, req, reply_cls=parser.OFPFlowStatsReply, reply_multi=True) or []
    return [stat for r in replies for stat in r.body]
