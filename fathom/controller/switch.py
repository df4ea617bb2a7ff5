"""Talking to one switch: the difference between desired and actual state, and a session that reads a
switch and applies a change to it.

`OsKenSession` is a switch connected over OpenFlow (os-ken); `fathom.controller.fakeswitch` is a
switch in memory behind the same interface, which decodes the same encoded messages. The
reconciler only ever talks to a session.
"""
from __future__ import annotations

import itertools
import struct
import time
from dataclasses import dataclass, field

from os_ken.app.ofctl import event as ofctl_event
from os_ken.app.ofctl.exception import InvalidDatapath, OFError

from fathom.controller.ofapp import Reply
from fathom.openflow import encode
from fathom.openflow.encode import Wire
from fathom.openflow.spec import FlowSpec, GroupSpec, MeterSpec, SwitchState
from fathom.pipeline.cookies import owns_cookie, owns_id

# What os-ken's ofctl raises for a connection it does not hold: one that went away, or one that just
# came up and that its own handler has not registered yet (our handler may run first)
NotRegistered = InvalidDatapath

_bundle_ids = itertools.count(1)
# How long the reconciler waits for a switch's reply: a bundle's commit, a read (flows, groups,
# meters, a flow count), the barrier after a plain message or a status write's barrier (a
# connection that dies meanwhile ends the wait at once). A live switch answers in milliseconds
# (`fathom_switch_commit_seconds`); a switch that has not answered by then is left to answer later
# (`Unanswered`), so that one hung, paused or hostile switch holds a pass, and every other switch's
# changes, this long once and not until its connection's keepalive gives up on it
# (fathom.controller.ofapp.ECHO_INTERVAL). A live switch slower than this (a big replay on a loaded
# host) costs its objects a `pending` until its reply and one read-back, not an error.
REPLY_WAIT = 2.0
DATAPATH_SETTLE = 0.02   # seconds (`fathom controller --datapath-settle`): OsKenSession.settle
_BUNDLE_ADD = struct.Struct("!BBHII2xH")   # OpenFlow header, bundle id, pad, flags; the message follows


class ApplyError(Exception):
    """The switch refused a change; `refused` holds the specs whose messages it named (if any)."""

    def __init__(self, message: str, refused: tuple = ()):
        super().__init__(message)
        self.refused = tuple(refused)


class Unanswered(ApplyError):
    """The switch has not answered a request within its wait (REPLY_WAIT for the reconciler's):
    what it holds is not known. `what` names the request ("its bundle's commit", "a flow read",
    ...); `reply` (fathom.controller.ofapp.Reply) is still awaited (`then`), and its late reply is
    this request's and no other's; `discard()` drops the errors the switch sent for a bundle's
    messages, once the reply came."""

    def __init__(self, message: str, what: str, reply, discard=lambda: None):
        super().__init__(message)
        self.what, self.reply, self.discard = what, reply, discard


class Asked:
    """A request sent to a switch whose reply is taken later (`result`): the requests of one round
    (a pass's reads, the check's flow counts, the status write's barriers) go out to every switch
    together and are awaited after, each until `wait` seconds after it went out, so that k silent
    switches hold the round one wait, not k. `take(message)` makes the reply's value; `discard` is
    the Unanswered's (see there)."""

    def __init__(self, dpid: int, reply, what: str, wait: float, take=lambda msg: msg, discard=lambda: None):
        self.dpid, self.reply, self.what, self.take, self.discard = dpid, reply, what, take, discard
        self.until = time.monotonic() + wait
        self.wait = wait

    def result(self):
        """The reply's value; Unanswered once `wait` has passed since the request went out."""
        came, msg = self.reply.wait(max(0.0, self.until - time.monotonic()))
        if not came:
            raise Unanswered(f"switch {self.dpid:016x}: no reply to {self.what} within {self.wait:g} s", self.what,
                             self.reply, self.discard)
        return self.take(msg)


class NotMaster(ApplyError):
    """The switch refused a write (OFPBRC_IS_SLAVE) or a master role request (OFPRRFC_STALE): another
    controller is its master under a newer generation_id. Mastership is lost: write nothing more to
    it until a master role request with a newer epoch succeeds."""


# The generation_id a role reply carries while the switch has none (OVS: no master/slave request yet)
NO_GENERATION = 0xFFFFFFFFFFFFFFFF


def is_not_master(ofp, errors) -> bool:
    """Whether OpenFlow messages (one, or a list: what os-ken's OFError holds) include an error that means
    "not master": IS_SLAVE on a write, STALE on a role request."""
    refusals = ((ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_IS_SLAVE), (ofp.OFPET_ROLE_REQUEST_FAILED, ofp.OFPRRFC_STALE))
    return any((getattr(e, "type", None), getattr(e, "code", None)) in refusals
               for e in (errors if isinstance(errors, list) else [errors]))


# ---------------------------------------------------------------------------------------------- encoding

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

    def breaks(self) -> bool:
        """True when the change takes something away (its `break_` half is not empty)."""
        return bool(self.delete or self.del_g or self.del_m)

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
    a bundle), then groups before the flows that use them. Messages are encode.Wire: encoded once
    per process, sent as bytes."""
    plain = [(m, Wire(dp, "meter", m, "add")) for m in c.add_m] + [(m, Wire(dp, "meter", m, "modify"))
                                                                   for m in c.mod_m]
    bundled = ([(g, Wire(dp, "group", g, "add")) for g in c.add_g]
               + [(g, Wire(dp, "group", g, "modify")) for g in c.mod_g]
               + [(f, Wire(dp, "flow", f)) for f in c.put])
    return plain, bundled


def break_messages(dp, c: Change) -> tuple[list, list]:
    """(bundled, plain) pairs of the break half: flows, then the groups they used; meters after."""
    bundled = ([(f, Wire(dp, "flow", f, "delete")) for f in c.delete]
               + [(g, Wire(dp, "group", g, "delete")) for g in c.del_g])
    plain = [(m, Wire(dp, "meter", m, "delete")) for m in c.del_m]
    return bundled, plain


def whole_messages(dp, c: Change) -> tuple[list, list, list]:
    """(plain before, bundled, plain after) pairs of a whole change in one atomic bundle, for a
    change of one switch alone (a reconnect's replay): what is new, then what is gone, so the
    switch never holds less than the flows still wanted, not even between two bundles."""
    plain, make = make_messages(dp, c)
    gone, after = break_messages(dp, c)
    return plain, make + gone, after


# ---------------------------------------------------------------------------------------------- sessions


# How long a role request waits for the switch's reply: a switch that went away without closing
# its connection (no TCP reset) would otherwise hold the replica's one role thread, and every other
# switch's role change behind it, until the keepalive gives up on it
# (fathom.controller.ofapp.ECHO_INTERVAL). A master role unanswered for longer than a lease time is
# moot anyway: the lease has ended.
ROLE_REPLY_TIMEOUT = 2.0
# How long a read made for an API caller (counters, a node's flows) waits for the switch: the
# caller is answered "did not answer" rather than holding one of the API's threads for as long as
# the keepalive takes to drop a switch that went silent.
STATS_REPLY_TIMEOUT = 5.0


class _Settles:
    """Where os-ken's ofctl service puts a request's reply (`reply_q.put`): it settles a Reply."""

    def __init__(self, reply):
        self.reply = reply

    def put(self, rep, *_args, **_kwargs) -> None:
        self.reply.settle(rep)


def ask(app, msg, reply_cls=None, multi: bool = False):
    """Send `msg` through os-ken's ofctl service, which follows it with a barrier and matches the
    replies (or errors) up to the barrier's reply by xid: the same request ofctl.send_msg makes
    (os_ken.base.app_manager.OSKenApp.send_request), without waiting. Returns its
    fathom.controller.ofapp.Reply, settled with ofctl's answer: calling that returns the reply
    (`multi`: the list of its parts; None without `reply_cls`) or raises (OFError, or InvalidDatapath
    once the connection closed). However late it comes, it is this request's."""
    reply = Reply(msg.datapath)
    req = ofctl_event.SendMsgRequest(msg=msg, reply_cls=reply_cls, reply_multi=multi)
    req.sync, req.reply_q = True, _Settles(reply)
    app.send_event(req.dst, req)
    return reply


def send_waiting(app, msg, reply_cls, timeout: float, multi: bool = False):
    """ofctl.send_msg that waits `timeout` seconds at most: TimeoutError after (a reply that comes
    later is dropped). `multi`: a multipart reply, returned as the list of its parts."""
    came, answer = ask(app, msg, reply_cls, multi).wait(timeout)
    if not came:
        raise TimeoutError(f"no reply within {timeout:g} s")
    return answer()


class OsKenSession:
    """A switch connected to os-ken: reads are multipart requests, changes one atomic bundle (OpenFlow
    1.4+) or messages in order, each followed by a barrier. Every request waits `wait` seconds at
    most for the switch's reply, then raises Unanswered (the reply still awaited)."""

    def __init__(self, app, dp, settle: float = DATAPATH_SETTLE, wait: float = REPLY_WAIT):
        self.app, self.dp = app, dp
        self.wait = wait
        self.dpid = dp.id
        # After a change is acknowledged, OVS's datapath goes on using the flows it cached from
        # the tables before it, until its revalidators have gone over them (asynchronously, a few
        # ms on a quiet host): for this long, packets may still take the old path.
        self.settle = settle

    def alive(self) -> bool:
        """False once the connection is closed, even before the app has heard of it."""
        return self.app.still_connected(self.dp)

    def _ask(self, msg, what: str, reply_cls=None, multi: bool = False, take=lambda parts: parts) -> Asked:
        """`msg` sent through ofctl (see `ask`), its reply awaited later: `take` makes the value of
        the reply (the parts of a multipart one)."""
        return Asked(self.dpid, ask(self.app, msg, reply_cls, multi), what, self.wait, lambda answer: take(answer()))

    def ask_flows(self) -> Asked:
        """A read of the switch's flows (`result()`: the set of FlowSpec)."""
        ofp, parser = self.dp.ofproto, self.dp.ofproto_parser
        req = parser.OFPFlowStatsRequest(self.dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0,
                                         parser.OFPMatch())
        return self._ask(req, "a flow read", parser.OFPFlowStatsReply, True,
                         lambda replies: {encode.decode_flow(ofp, stat) for r in replies or () for stat in r.body})

    def ask_count(self) -> Asked:
        """How many flows the switch holds (one aggregate-stats round trip, whatever their number)."""
        ofp, parser = self.dp.ofproto, self.dp.ofproto_parser
        req = parser.OFPAggregateStatsRequest(self.dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0,
                                              parser.OFPMatch())
        return self._ask(req, "a flow count", parser.OFPAggregateStatsReply, True,
                         lambda replies: sum(r.body.flow_count for r in replies or ()))

    def ask_groups(self) -> Asked:
        parser = self.dp.ofproto_parser
        req = parser.OFPGroupDescStatsRequest(self.dp, 0)
        return self._ask(req, "a group read", parser.OFPGroupDescStatsReply, True,
                         lambda replies: {encode.decode_group(self.dp.ofproto, d)
                                          for r in replies or () for d in r.body})

    def ask_meters(self) -> Asked:
        ofp, parser = self.dp.ofproto, self.dp.ofproto_parser
        req = parser.OFPMeterConfigStatsRequest(self.dp, 0, ofp.OFPM_ALL)
        return self._ask(req, "a meter read", parser.OFPMeterConfigStatsReply, True,
                         lambda replies: {encode.decode_meter(ofp, c) for r in replies or () for c in r.body})

    def ask_barrier(self) -> Asked:
        """A barrier's round trip: the switch's main loop has run since everything sent before it
        (OVS polls a userspace datapath's ports in that loop: a loop busy reconfiguring its ports
        holds their traffic, and this reply, until it is done)."""
        return self._ask(self.dp.ofproto_parser.OFPBarrierRequest(self.dp), "a barrier")

    def read_flows(self) -> set[FlowSpec]:
        return self.ask_flows().result()

    def count_flows(self) -> int:
        return self.ask_count().result()

    def read_groups(self) -> set[GroupSpec]:
        return self.ask_groups().result()

    def read_meters(self) -> set[MeterSpec]:
        return self.ask_meters().result()

    def bundle(self, pairs: list) -> None:
        """Send (spec, encode.Wire) pairs as one atomic bundle; ApplyError names the refused specs.

        Open, every add and the commit go out in one write, with no round trip before the commit;
        the commit reply, after them on the same connection, tells whether the switch took the whole
        change (no barrier after it: the reply is sent once the bundle is in the tables). An error
        on the open or on any add fails it all.
        """
        if not pairs:
            return
        dp, app = self.dp, self.app
        ofp, parser = dp.ofproto, dp.ofproto_parser
        if ofp.OFP_VERSION < 0x05:
            return self.plain(pairs)
        bid = next(_bundle_ids) & 0xFFFFFFFF
        flags = ofp.OFPBF_ATOMIC | ofp.OFPBF_ORDERED

        def ctrl(kind) -> tuple[int, bytes]:
            msg = parser.OFPBundleCtrlMsg(dp, bid, kind, flags, [])
            dp.set_xid(msg)
            msg.serialize()
            return msg.xid, bytes(msg.buf)
        opening, head = ctrl(ofp.OFPBCT_OPEN_REQUEST)
        out = [head]
        by_xid = {}
        for spec, m in pairs:
            xid = _next_xid(dp)
            inner = m.wire(xid)
            out.append(_BUNDLE_ADD.pack(ofp.OFP_VERSION, ofp.OFPT_BUNDLE_ADD_MESSAGE, _BUNDLE_ADD.size + len(inner),
                                        xid, bid, flags) + inner)
            by_xid[xid] = spec
        commit, tail = ctrl(ofp.OFPBCT_COMMIT_REQUEST)
        out.append(tail)
        reply = app.expect(dp, commit)
        sent = time.monotonic()
        if not dp.send(b"".join(out)):
            app.forget(dp, commit)
            raise ApplyError(f"switch {dp.id:016x}: connection closing")
        msg = Asked(dp.id, reply, "its bundle's commit", self.wait,
                    discard=lambda: app.take_errors(dp.id, [opening, *by_xid, commit])).result()
        if msg is None:
            raise ApplyError(f"switch {dp.id:016x}: connection closed before the bundle's commit reply")
        COMMIT_TIMES.observe(time.monotonic() - sent)
        errors = app.take_errors(dp.id, [opening, *by_xid, commit])
        if errors or not isinstance(msg, parser.OFPBundleCtrlMsg):
            refused = [by_xid[e.xid] for e in errors if e.xid in by_xid]
            first = errors[0] if errors else msg   # an add's error before the commit's
            if is_not_master(ofp, [*errors, msg]):
                raise NotMaster(f"switch {dp.id:016x}: this controller is not its master (OFPBRC_IS_SLAVE)", refused)
            raise ApplyError(f"switch {dp.id:016x} refused the change: {OFError(result=first)}", refused)

    def plain(self, pairs: list) -> None:
        """Send messages in order, each waiting for its barrier (errors raise ApplyError)."""
        for spec, m in pairs:
            try:
                self._ask(m.message(), f"the barrier after a {m.kind} message").result()
            except OFError as e:
                if is_not_master(self.dp.ofproto, e.result):
                    raise NotMaster(f"switch {self.dp.id:016x}: this controller is not its master "
                                    f"(OFPBRC_IS_SLAVE)", (spec,)) from e
                raise ApplyError(f"switch {self.dp.id:016x} refused the change: {e}", (spec,)) from e

    def barrier(self) -> None:
        self.ask_barrier().result()

    def request_role(self, epoch: int | None) -> int:
        """Be the switch's master under generation_id `epoch` (a lease's epoch, fathom.cluster), or
        its slave (None). Returns the switch's generation_id after the request. NotMaster when the
        switch refuses a master request as stale (it has seen a newer epoch: another controller is
        master). A slave request cannot take anything, so it needs no fencing: it carries the
        generation_id the switch holds (read first with a NOCHANGE request)."""
        ofp = self.dp.ofproto
        if epoch is not None:
            return self._role(ofp.OFPCR_ROLE_MASTER, epoch)
        for _ in range(3):     # a master may raise the switch's generation_id between the read and the request
            now = self._role(ofp.OFPCR_ROLE_NOCHANGE, 0)
            try:
                return self._role(ofp.OFPCR_ROLE_SLAVE, 0 if now == NO_GENERATION else now)
            except NotMaster:
                continue
        raise ApplyError(f"switch {self.dp.id:016x}: its generation_id kept moving; not made slave")

    def _role(self, role: int, generation: int) -> int:
        parser = self.dp.ofproto_parser
        try:
            reply = send_waiting(self.app, parser.OFPRoleRequest(self.dp, role, generation), parser.OFPRoleReply,
                                  ROLE_REPLY_TIMEOUT)
        except TimeoutError as e:
            raise ApplyError(f"switch {self.dp.id:016x}: no reply to the role request within "
                             f"{ROLE_REPLY_TIMEOUT:g} s") from e
        except OFError as e:
            if is_not_master(self.dp.ofproto, e.result):
                raise NotMaster(f"switch {self.dp.id:016x} refused generation_id {generation} as stale "
                                f"(OFPRRFC_STALE): another controller is master with a newer one") from e
            raise ApplyError(f"switch {self.dp.id:016x} refused the role request: {e}") from e
        if reply is None:
            raise ApplyError(f"switch {self.dp.id:016x}: no reply to the role request")
        return reply.generation_id


class _CommitTimes:
    """How long switches take to take a bundle: from its write to the commit reply (the switch's
    commit, the connection both ways, and the wait for this process's receiving thread). On
    prometheus_client's default registry (/metrics), made at first use."""
    _histogram = None

    def observe(self, seconds: float) -> None:
        if self._histogram is None:
            from prometheus_client import Histogram
            _CommitTimes._histogram = Histogram(
                "fathom_switch_commit_seconds", "a bundle's round trip to a switch: from its write to the commit reply",
                buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0))
        self._histogram.observe(seconds)

    def totals(self) -> dict:
        """{"count": bundles answered, "seconds": their round trips' sum} since the process started."""
        out = {"count": 0, "seconds": 0.0}
        for metric in self._histogram.collect() if self._histogram is not None else ():
            for sample in metric.samples:
                if sample.name.endswith("_count"):
                    out["count"] = int(sample.value)
                elif sample.name.endswith("_sum"):
                    out["seconds"] = round(sample.value, 6)
        return out


COMMIT_TIMES = _CommitTimes()


def _next_xid(dp) -> int:
    """The next transaction id of an os-ken datapath (as Datapath.set_xid, for messages sent as bytes)."""
    dp.xid = (dp.xid + 1) & dp.ofproto.MAX_XID
    return dp.xid


class OsKenSwitches:
    """The switches connected to an os-ken app, by datapath id."""

    def __init__(self, app, settle: float = DATAPATH_SETTLE):
        self.app, self.settle = app, settle

    def session(self, dpid: int) -> OsKenSession | None:
        dp = self.app.datapath(dpid)
        return OsKenSession(self.app, dp, self.settle) if dp is not None else None

    def connected(self) -> list[int]:
        return list(self.app.datapaths)

    def lost_since(self, dpid: int) -> float | None:
        """When a switch that had connected lost its connection (None: connected, or never was)."""
        return self.app.lost_since(dpid)


# Raw reads other modules use for counters (taps, node flows)


def read_flows(app, dp) -> set[FlowSpec] | None:
    """The switch's flows; None when it is not reachable over OpenFlow after all (it left since
    `dp` was looked up, os-ken has not registered the connection that just came up, or it did not
    answer within STATS_REPLY_TIMEOUT)."""
    try:
        return OsKenSession(app, dp, wait=STATS_REPLY_TIMEOUT).read_flows()
    except (NotRegistered, Unanswered):
        return None


def read_state(app, dp) -> SwitchState | None:
    """The switch's flows and groups; None as for `read_flows`."""
    try:
        session = OsKenSession(app, dp, wait=STATS_REPLY_TIMEOUT)
        return SwitchState(frozenset(session.read_flows()), frozenset(session.read_groups()))
    except (NotRegistered, Unanswered):
        return None


def read_flow_stats(app, dp) -> list:
    """Raw os-ken flow stats (with counters), for status and metrics."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    req = parser.OFPFlowStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0, parser.OFPMatch())
    replies = send_waiting(app, req, parser.OFPFlowStatsReply, STATS_REPLY_TIMEOUT, multi=True) or []
    return [stat for r in replies for stat in r.body]
