"""A switch in memory behind the session interface of fathom.controller.switch.

Every change arrives as the real OpenFlow 1.4 messages the os-ken session would send: encoded to
bytes, parsed back with os-ken's parser and applied to flow, group and meter tables with OpenFlow's
rules (ADD replaces the entry with the same table, priority and match; DELETE_STRICT removes it;
a group or meter is added once, modified or deleted only if present; a bundle is all or nothing).
Reads decode the tables with the same decoder the os-ken session uses. So the reconciler can be
tested without root or OVS, and a benchmark can simulate many switches.

Knobs for tests: `refuse(predicate)` makes the switch refuse every message whose spec matches (like
OVS refusing an invalid flow), and `sent` records what arrived, per bundle or plain message;
FakeSwitches `down` holds switches not connected (yet), `disconnect(dpid)` closes the connection of
one that was (its ovs-vswitchd died): from then on its session is gone and an apply fails.
`stall()` makes a switch stop answering (a paused ovs-vswitchd): whatever is asked of it (a read,
a bundle, a plain message, a barrier) waits, not taken, and the session raises Unanswered as
OsKenSession does after REPLY_WAIT (`stall(wait=s)`: after s seconds, as it would; at once by
default); `answer()` takes what waited, in order, and replies to each. FakeSwitches `silences`
records, in order, each request a stalled switch was asked and each wait for one that ended
unanswered.

Roles as OVS applies them: the switch itself is one controller's connection (`DEFAULT`);
`connect(name)` gives another controller's connection to the same tables. Every connection starts
equal; `request_role(epoch)` makes it master under generation_id `epoch` (refused as stale, NotMaster,
when older than the switch's, in OpenFlow's circular order) and demotes the other master to slave
(named in `demoted`, as OVS sends it a role status), or slave with None; a slave's writes are refused
(NotMaster, OFPBRC_IS_SLAVE).
"""
from __future__ import annotations

import itertools
import threading
import time

from os_ken.ofproto import ofproto_parser, ofproto_v1_4, ofproto_v1_4_parser

from fathom.controller.ofapp import Reply
from fathom.controller.switch import NO_GENERATION, ApplyError, Asked, NotMaster, Unanswered
from fathom.openflow import encode


class FakeDatapath:
    ofproto = ofproto_v1_4
    ofproto_parser = ofproto_v1_4_parser

    def __init__(self, dpid: int):
        self.id = dpid
        self._xids = itertools.count(1)

    def set_xid(self, msg) -> None:
        msg.set_xid(next(self._xids) & 0xFFFFFFFF)


DEFAULT = "default"     # the controller whose connection the FakeSwitch itself is


class FakeSwitch:
    settle = 0.0   # no datapath caches its flows

    def __init__(self, dpid: int, journal: list | None = None, silences: list | None = None):
        self.dpid = dpid
        self.silences = silences if silences is not None else []   # ("asked" | "unanswered", dpid, what), shared
        self.dp = FakeDatapath(dpid)
        self.journal = journal if journal is not None else []   # (dpid, "bundle" | "plain", messages), shared
        self.flows: dict[tuple, object] = {}     # (table, priority, match) -> FlowSpec
        self.groups: dict[int, object] = {}
        self.meters: dict[int, object] = {}
        self.sent: list[tuple[str, list]] = []   # ("bundle" | "plain", [parsed messages])
        self.reads = 0
        self.barriers = 0                        # barrier round trips asked for
        self.last_flow = None                    # the flow of the last flow mod applied
        self._refuse = lambda spec: False
        self.alive = lambda: True          # the session's connection is open (FakeSwitches sets it)
        self.lock = threading.Lock()
        self.generation: int | None = None       # the switch's generation_id (none until a master or slave request)
        self.roles: dict[str, str] = {}          # controller -> "master" | "slave" (absent: equal)
        self.demoted: list[str] = []             # controllers sent a role status (another became master)
        # requests waiting while stalled: (what, how, pairs, controller, Reply); how: "bundle" |
        # "plain" (taken when it answers) | "ask" (a read or a barrier)
        self.held: list | None = None
        self._answers = 0                        # requests still answered once stalled (`stall`)
        self._wait = 0.0                         # how long a request waits for a stalled switch (`stall`)

    # ------------------------------------------------------------------------------ knobs

    def refuse(self, predicate) -> None:
        """Refuse every message whose spec satisfies `predicate(spec)` (None: refuse nothing)."""
        self._refuse = predicate or (lambda spec: False)

    def stall(self, after: int = 0, wait: float = 0.0) -> None:
        """Stop answering: requests wait (see the module's docstring), from the one after the next
        `after` on (those are still answered: a switch falling silent in the middle of a pass);
        each is Unanswered `wait` seconds after it was asked."""
        self.held, self._answers, self._wait = [], after, wait

    def answer(self) -> None:
        """Answer again: take what waited, in order, and reply to each."""
        held, self.held = self.held or [], None
        for _what, how, pairs, controller, reply in held:
            try:
                if how != "ask":
                    self._apply(how, pairs, atomic=how == "bundle", controller=controller)
                reply.settle("answered")
            except ApplyError as e:
                reply.settle(e)

    def _asked(self, what: str, value, how: str = "ask", pairs: list = (), controller: str = DEFAULT) -> Asked:
        """A request (its reply's value: `value()`), held while the switch is stalled: its result is
        then Unanswered once its wait is over (its value if the switch answered before)."""
        reply = Reply(self.dp)
        if self.held is not None and self._answers:
            self._answers -= 1
        elif self.held is not None:
            self.held.append((what, how, pairs, controller, reply))
            self.silences.append(("asked", self.dpid, what))
            return _Held(self, reply, what, value)
        reply.settle("answered")
        return Asked(self.dpid, reply, what, 0.0, lambda _msg: value())

    def _holds(self) -> bool:
        """Whether the next request is held (stalled, no answers left)."""
        return self.held is not None and not self._answers

    def _sent(self, what: str, how: str, pairs: list, controller: str) -> Asked:
        """A change sent ("bundle" or "plain" messages): taken at once, its result raising what the
        switch refused; held while the switch is stalled (`_asked`)."""
        if self._holds():
            return self._asked(what, lambda: None, how, pairs, controller)
        if self.held is not None:
            self._answers -= 1
        reply = Reply(self.dp)
        try:
            self._apply(how, pairs, atomic=how == "bundle", controller=controller)
            reply.settle(None)
        except Exception as e:  # noqa: BLE001 - refused or closed: the request's result
            reply.settle(e)
        return Asked(self.dpid, reply, what, 0.0, _raised)

    def add_foreign_flow(self, flow) -> None:
        """A flow someone else put there (e.g. cookie 0): the reconciler must leave it alone."""
        self.flows[flow.key] = flow

    # ------------------------------------------------------------------------------ session interface

    def ask_flows(self) -> Asked:
        def value():
            self.reads += 1
            return set(self.flows.values())
        return self._asked("a flow read", value)

    def ask_count(self) -> Asked:
        return self._asked("a flow count", lambda: len(self.flows))

    def ask_groups(self) -> Asked:
        return self._asked("a group read", lambda: set(self.groups.values()))

    def ask_meters(self) -> Asked:
        return self._asked("a meter read", lambda: set(self.meters.values()))

    def ask_barrier(self) -> Asked:
        def value():
            self.barriers += 1
        return self._asked("a barrier", value)

    def read_flows(self) -> set:
        return self.ask_flows().result()

    def count_flows(self) -> int:
        return self.ask_count().result()

    def read_groups(self) -> set:
        return self.ask_groups().result()

    def read_meters(self) -> set:
        return self.ask_meters().result()

    def barrier(self) -> None:
        self.ask_barrier().result()

    def bundle(self, pairs: list, controller: str = DEFAULT) -> None:
        if pairs:
            self._sent("its bundle's commit", "bundle", pairs, controller).result()

    def plain(self, pairs: list, controller: str = DEFAULT) -> None:
        while pairs:   # a stalled switch holds the first (OsKenSession waits for its barrier before the next)
            held = self._holds()
            kind = getattr(pairs[0][1], "kind", "plain")
            taken = pairs[:1] if held else pairs
            self._sent(f"the barrier after a {kind} message", "plain", taken, controller).result()
            pairs = pairs[1:] if held else []      # answer() took the first within the wait

    def request_role(self, epoch: int | None, controller: str = DEFAULT) -> int:
        """As fathom.controller.switch.OsKenSession.request_role, with OVS's rules."""
        with self.lock:
            if epoch is None:
                self.roles[controller] = "slave"
            elif self.generation is not None and (epoch - self.generation) % 2**64 >= 2**63:
                raise NotMaster(f"switch {self.dpid:016x} refused generation_id {epoch} as stale (OFPRRFC_STALE)")
            else:
                self.generation = epoch
                for other, role in self.roles.items():
                    if role == "master" and other != controller:
                        self.roles[other] = "slave"
                        self.demoted.append(other)
                self.roles[controller] = "master"
            return NO_GENERATION if self.generation is None else self.generation

    def connect(self, controller: str) -> "FakeConnection":
        """Another controller's connection to this switch."""
        return FakeConnection(self, controller)

    # ------------------------------------------------------------------------------ OpenFlow semantics

    def _apply(self, how: str, pairs: list, atomic: bool, controller: str = DEFAULT) -> None:
        if not self.alive():
            raise ConnectionError(f"switch {self.dpid:016x}: connection closed")
        with self.lock:
            if self.roles.get(controller) == "slave":
                raise NotMaster(f"switch {self.dpid:016x}: this controller is not its master (OFPBRC_IS_SLAVE)",
                                [spec for spec, _ in pairs])
            parsed = [(spec, self._wire(msg)) for spec, msg in pairs]
            self.sent.append((how, [m for _, m in parsed]))
            self.journal.append((self.dpid, how, [m for _, m in parsed]))
            tables = (dict(self.flows), dict(self.groups), dict(self.meters))
            refused = []
            for spec, msg in parsed:
                error = "refused by the test" if self._refuse(spec) else self._one(msg)
                if error:
                    refused.append(spec)
                    if not atomic:
                        raise ApplyError(f"switch {self.dpid:016x} refused the change: {error}", refused)
            if refused:
                self.flows, self.groups, self.meters = tables   # a bundle is all or nothing
                raise ApplyError(f"switch {self.dpid:016x} refused the change: {len(refused)} message(s)", refused)

    def _wire(self, msg):
        """The message as the switch receives it: encoded, then parsed back."""
        if hasattr(msg, "wire"):          # encode.Wire: the bytes the os-ken session sends
            buf = msg.wire(next(self.dp._xids) & 0xFFFFFFFF)
        else:
            self.dp.set_xid(msg)
            msg.serialize()
            buf = bytes(msg.buf)
        version, msg_type, msg_len, xid = ofproto_parser.header(buf)
        return ofproto_parser.msg(self.dp, version, msg_type, msg_len, xid, buf)

    def _one(self, msg) -> str | None:
        ofp = self.dp.ofproto
        name = type(msg).__name__
        if name == "OFPFlowMod":
            flow = self.last_flow = encode.decode_flow(ofp, msg)   # (the OpenFlow front end keeps its bytes)
            if msg.command == ofp.OFPFC_ADD:
                for action in flow.actions:
                    group = getattr(action, "group_id", None)
                    if type(action).__name__ == "Group" and group not in self.groups:
                        return f"OFPGMFC_UNKNOWN_GROUP {group}"
                    meter = getattr(action, "meter_id", None)
                    if type(action).__name__ == "Meter" and meter not in self.meters:
                        return f"OFPMMFC_UNKNOWN_METER {meter}"
                self.flows[flow.key] = flow
            elif msg.command == ofp.OFPFC_DELETE_STRICT:
                self.flows.pop(flow.key, None)
            else:
                return f"flow mod command {msg.command} not supported by the fake switch"
            return None
        if name == "OFPGroupMod":
            group = encode.decode_group(ofp, msg)
            exists = msg.group_id in self.groups
            if msg.command == ofp.OFPGC_ADD:
                if exists:
                    return f"OFPGMFC_GROUP_EXISTS {msg.group_id}"
                self.groups[msg.group_id] = group
            elif msg.command == ofp.OFPGC_MODIFY:
                if not exists:
                    return f"OFPGMFC_UNKNOWN_GROUP {msg.group_id}"
                self.groups[msg.group_id] = group
            elif msg.command == ofp.OFPGC_DELETE:
                if any(type(a).__name__ == "Group" and a.group_id == msg.group_id
                       for f in self.flows.values() for a in f.actions):
                    # OVS deletes the flows that use a deleted group; the reconciler must never rely on it
                    return f"group {msg.group_id} deleted while flows still use it"
                self.groups.pop(msg.group_id, None)
            return None
        if name == "OFPMeterMod":
            meter = encode.decode_meter(ofp, msg)
            if msg.command == ofp.OFPMC_DELETE:
                self.meters.pop(msg.meter_id, None)
            elif msg.command == ofp.OFPMC_ADD and msg.meter_id in self.meters:
                return f"OFPMMFC_METER_EXISTS {msg.meter_id}"
            else:
                self.meters[msg.meter_id] = meter
            return None
        return f"{name} not supported by the fake switch"


def _raised(msg):
    """A change's result: the error the switch answered, raised."""
    if isinstance(msg, Exception):
        raise msg


class _Held(Asked):
    """A request a stalled switch holds: Unanswered once the switch's wait is over."""

    def __init__(self, switch: FakeSwitch, reply, what: str, value):
        super().__init__(switch.dpid, reply, what, switch._wait, lambda _msg: value())
        self.switch = switch

    def result(self):
        try:
            value = super().result()
        except Unanswered:
            self.switch.silences.append(("unanswered", self.dpid, self.what))
            raise
        if isinstance(self.reply.msg, ApplyError):    # what answer() took, refused
            raise self.reply.msg
        return value


class FakeConnection:
    """Another controller's connection to a FakeSwitch: the same tables, a role of its own."""

    def __init__(self, switch: FakeSwitch, controller: str):
        self.switch, self.controller = switch, controller

    def __getattr__(self, name):      # reads and knobs are the switch's
        return getattr(self.switch, name)

    def bundle(self, pairs: list) -> None:
        self.switch.bundle(pairs, self.controller)

    def plain(self, pairs: list) -> None:
        self.switch.plain(pairs, self.controller)

    def request_role(self, epoch: int | None) -> int:
        return self.switch.request_role(epoch, self.controller)


class FakeSwitches:
    """Fake switches by datapath id, connected and disconnected at will (the reconciler's `switches`)."""

    def __init__(self):
        self.switches: dict[int, FakeSwitch] = {}
        self.down: set[int] = set()
        self.lost: dict[int, float] = {}   # dpid -> when its connection closed
        self.journal: list = []        # every switch's messages in the order they arrived
        self.silences: list = []       # every stalled switch's requests and unanswered waits, in order

    def add(self, dpid: int) -> FakeSwitch:
        self.down.discard(dpid)
        self.lost.pop(dpid, None)
        if dpid not in self.switches:
            sw = self.switches[dpid] = FakeSwitch(dpid, self.journal, self.silences)
            sw.alive = lambda: dpid not in self.down
        return self.switches[dpid]

    def disconnect(self, dpid: int) -> None:
        """The switch's connection closes (its tables stay, like OVS's in fail_mode secure)."""
        self.down.add(dpid)
        self.lost[dpid] = time.time()

    def lost_since(self, dpid: int) -> float | None:
        return self.lost.get(dpid) if dpid in self.down else None

    def session(self, dpid: int) -> FakeSwitch | None:
        return None if dpid in self.down else self.switches.get(dpid)

    def connected(self) -> list[int]:
        return [d for d in self.switches if d not in self.down]
