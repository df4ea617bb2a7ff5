"""Bringing the switches to their desired state: diff, then make on every switch, then break.

For every connected switch whose desired state changed, or that is not known (just connected,
drifted, refused, audited), `Applier.apply` works out a change (`_Plan`): a known switch (what we
last installed on it, the mirror, is of the desired state the pass started from) gets the pass's
edit only, any other is diffed whole against its mirror or what it holds read back, with one
ownership rule (the cookie's app byte). The changes are applied in two halves across all
switches, by tier (fabric switch, br-phy, br-int): first every switch gets what is new (meters, groups,
flows; one atomic bundle each), then every switch loses what is gone, so no switch stops using a
path before every switch has the new one. A switch that already holds its desired state is sent
nothing; a refused change marks exactly the objects whose messages the switch refused (by
cookie) and the rest is applied without them. A switch that does not answer within REPLY_WAIT
(hung, paused, hostile, its link saturated) whatever was asked of it — a read, a bundle's commit,
the barrier after a plain message, the check's flow count, a status write's barrier — does not
hold the pass longer: the pass goes on without it, its state says it is not answering (its objects
are `pending`, not `active`), and later passes leave it alone until the reply comes or its
connection closes; then it is read back and diffed whole, whatever the reply said. The requests
of one round (the pass's reads, the check's counts, the status write's barriers) go out to every
switch before any is awaited, so several silent switches hold a round REPLY_WAIT once; a tier's
changes go out to SENDERS switches at a time.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable

from fathom.apps import BR_INT, BR_PHY, FABRIC_SWITCH, SwitchKey
from fathom.controller.desired import IncrementalMismatch
from fathom.controller.metrics import METRICS
from fathom.controller.results import PassResult, SwitchResult
from fathom.controller.switch import (
    ApplyError, Change, NotRegistered, Unanswered, break_messages, diff, make_messages, whole_messages,
)
from fathom.model import Snapshot, datapath_id, datapath_id_phy, datapath_id_fabric
from fathom.openflow.spec import SwitchState
from fathom.pipeline.cookies import owns_cookie, owns_id, parse_cookie

LOG = logging.getLogger("fathom.reconciler")   # one log for every part of the reconciler

# New state goes to the switches nearest the physical network first, old state leaves the edge first.
MAKE_ORDER = {FABRIC_SWITCH: 0, BR_PHY: 1, BR_INT: 2}
# Flows read back at once (their switches' desired flows, one switch at least): the replies of every
# switch read back are not held in memory together (at 100 nodes x 100 ports, 1.4 million flows)
READ_FLOWS_AT_ONCE = 20_000
# Switches a tier's changes are sent to at once, each by its own thread from sending to the reply
# (a bundle's commit): a switch's reply waits for what the others sent meanwhile wherever they share
# a CPU (the controller's, a host's), so that sending to every switch at once would make each reply
# as late as the last; a silent switch holds one of them REPLY_WAIT.
SENDERS = 8


def switch_dpid(key: SwitchKey, snapshot: Snapshot) -> int | None:
    """The datapath id of the switch `key` in `snapshot` (None: not in it)."""
    if key.bridge == FABRIC_SWITCH:
        fabric = snapshot.fabric
        sw = next((s for s in (fabric.switches if fabric else ()) if s.name == key.name), None)
        return datapath_id_fabric(sw.id) if sw else None
    node = next((n for n in snapshot.nodes if n.name == key.name), None)
    if node is None:
        return None
    return datapath_id(node.id) if key.bridge == BR_INT else datapath_id_phy(node.id)


def lost_state(key: SwitchKey, since: float) -> str:
    """The state of a switch that was connected and is gone: its ovs-vswitchd died or it is cut off."""
    whose = "" if key.bridge == FABRIC_SWITCH else f"{key.bridge}'s "
    return (f"lost: {whose}OpenFlow connection closed at {time.strftime('%H:%M:%S', time.localtime(since))} "
            "(ovs-vswitchd down or unreachable)")


@dataclass
class _Plan:
    """One switch's change this pass."""
    res: SwitchResult
    session: object                  # its connection (fathom.controller.switch)
    desired: SwitchState
    change: Change
    foreign: tuple[set, set]         # flows and groups on it that are not ours
    # (mirror's flows, mirror's groups, what the edit took out, what it put in) when the change
    # followed the pass's edit (the mirror is updated by it); None: rebuilt from `desired`
    mirror: tuple | None


@dataclass
class _Start:
    """One switch's change this pass, its reads asked and not yet answered."""
    key: SwitchKey
    res: SwitchResult
    session: object
    desired: SwitchState
    edit: tuple | None               # the pass's edit of its desired state, when its mirror is of the state before
    audited: bool                    # read back and diffed whole
    drift_found: bool                # audited though known and unchanged: a difference is drift
    reads_flows: bool = False        # its flows and groups are read (no mirror to diff against)
    asked: dict = field(default_factory=dict)   # "meters", "groups" -> switch.Asked
    got: dict = field(default_factory=dict)     # "meters", "groups", "flows" -> what the switch holds


class Applier:
    """Sends the switches their changes and keeps what each holds after our last successful apply
    (`known`, the mirror), so that passes diff against it instead of reading every flow back.

    `switches.session(dpid)` gives a connected switch's session and `switches.lost_since(dpid)`
    when it went away; `on_drift(source, what)` is told what an audit found changed behind our
    back; `on_retry()` asks for another pass soon (a connection not yet usable)."""

    def __init__(self, switches, on_drift: Callable[[str, str], None], on_retry: Callable[[], None],
                 check_incremental: bool = False):
        self.switches = switches
        self.on_drift, self.on_retry = on_drift, on_retry
        self.check_incremental = check_incremental
        # dpid -> (flows, groups, the desired state they were made from). Dropped on reconnect,
        # failure, drift and audit.
        self.known: dict[int, tuple[set, set, SwitchState]] = {}
        self.results: dict[SwitchKey, SwitchResult] = {}
        # switch -> (kind, object id) -> why: the objects it refused, until it takes them
        self.refused_at: dict[SwitchKey, dict[tuple[int, int], str]] = {}
        self.diffs = {"edit": 0, "whole": 0}          # switch changes worked out each way (also in /metrics)
        self.mismatches = 0                           # check_incremental failures (must stay 0)
        self._had_meters: dict[int, bool] = {}        # dpid -> desired meters last pass (unknown: read)
        self._foreign: dict[int, tuple[set, set]] = {}    # dpid -> flows and groups not ours, with `known`
        self._pool: ThreadPoolExecutor | None = None  # sends a tier's changes to several switches at once
        # dpid -> (its state, the Unanswered) of a switch whose reply to a request is still
        # awaited: left alone (not read, nothing sent) until the reply comes or the connection
        # closes, which asks for a pass (on_retry) that reads it back and diffs it whole
        self.unanswered: dict[int, tuple[str, Unanswered]] = {}

    def forget(self, dpid: int) -> None:
        """The switch reconnected or went away: what it holds is read back next time."""
        self.known.pop(dpid, None)
        self._had_meters.pop(dpid, None)

    def check(self, res: SwitchResult) -> str | None:
        """The periodic check of one switch (see `checks`)."""
        return self.checks([res])[0]

    def checks(self, results: list[SwitchResult]) -> list[str | None]:
        """The periodic check of switches that are set up, one trigger each: "retry" when it is
        connected but not reconciled, "check" when its flow count differs from its mirror's
        (drift: the mirror is dropped, so the pass this asks for diffs it whole) or it did not
        answer the count (the pass says so), None when all is well or unknown. The counts go out to
        every switch at once and are awaited after: k silent switches hold the check one
        REPLY_WAIT."""
        triggers: list[str | None] = [None] * len(results)
        asked = []
        for i, res in enumerate(results):
            session = self.switches.session(res.dpid)
            known = self.known.get(res.dpid)
            if res.dpid in self.unanswered:
                continue   # its reply asks for a pass when it comes
            if session is None or known is None:
                triggers[i] = "retry" if session is not None and not res.state.startswith("ok") else None
                continue
            asked.append((i, res, session, known, session.ask_count()))
        for i, res, session, known, count in asked:
            try:
                flows = count.result()
            except Unanswered as e:
                self._failed(res, session, e)
                triggers[i] = "check"
                continue
            except Exception as e:  # noqa: BLE001 - the switch's health, seen by the next pass
                LOG.warning("%s: check failed: %s", res.key, e)
                continue
            if flows != len(known[0]):
                self.on_drift("openflow", f"{res.key}: {flows} flows, {len(known[0])} installed")
                self.known.pop(res.dpid, None)
                triggers[i] = "check"
        return triggers

    def apply(self, snapshot: Snapshot, result: PassResult, keys: Iterable[SwitchKey], changed: set[SwitchKey],
              edits: dict, audit: bool = False, read_back: frozenset[SwitchKey] = frozenset(), steps=None) -> None:
        """Bring the switches `keys` to `result.desired`: diff every connected one that changed or
        is not known (read back every switch with `audit`, those in `read_back`), then make on all
        of them, then break on all of them (one bundle with both when a single switch changes).
        `edits`: the desired state's edits of this pass (DesiredState.edits). `steps` gets "make"
        once every switch acknowledged the new state (what traffic waits for)."""
        keys = set(keys)
        starts = [start for key in sorted(keys, key=lambda k: (MAKE_ORDER.get(k.bridge, 9), k))
                  if (start := self._plan(key, snapshot, result, changed, edits, audit or key in read_back))]
        plans = self._diffed(starts)
        for key in set(self.results) - keys:
            del self.results[key]
        busy = [p for p in plans if len(p.change)]
        whole = len(busy) == 1        # one switch changes: make and break in one atomic bundle
        held: dict[int, set] = {}     # dpid -> owners held back after a refusal
        # by tier (fabric switch, br-phy, br-int): every switch of a tier at once (one round trip each, in
        # parallel); new state in from the physical network inwards, old state out the other way
        tiers: dict[int, list[_Plan]] = {}
        for plan in plans:
            tiers.setdefault(MAKE_ORDER.get(plan.res.key.bridge, 9), []).append(plan)
        for tier in sorted(tiers):
            self._each(lambda plan: self._make(plan, whole, held, result), tiers[tier])
        if busy:
            result.settled_at = time.monotonic() + max(p.session.settle for p in busy)
            result.made_on = tuple(p.res.dpid for p in busy if p.res.dpid in held)   # those that answered
        if steps is not None:
            steps.done("make")
        # several switches changed and something goes: the datapaths stop using what their
        # switches were told to replace (`settle`) before the old path is taken away, and a tier's
        # datapaths stop sending by the old path before the tier outside it takes it away (a fabric switch
        # must not drop a node's VLAN while the node's datapath still sends on it)
        settle = max((p.session.settle for p in busy), default=0.0) if not whole else 0.0
        breaking = [t for t in sorted(tiers, reverse=True) if any(p.change.breaks() for p in tiers[t])]
        if settle and breaking:
            time.sleep(settle)
            if steps is not None:
                steps.done("settle")
        for tier in sorted(tiers, reverse=True):
            if settle and tier in breaking[1:]:
                time.sleep(settle)
            self._each(lambda plan: self._break(plan, whole, held, result), tiers[tier])

    def _plan(self, key: SwitchKey, snapshot: Snapshot, result: PassResult, changed: set[SwitchKey],
              edits: dict, audited: bool) -> _Start | None:
        """What `_diffed` needs to work out the switch's change this pass, the small reads it
        needs sent; None when it gets none (holds its desired state, is not connected, its OVSDB
        is not read, or it is still not answering); its result says which."""
        res = result.switches.get(key)
        if res is None:
            dpid = switch_dpid(key, snapshot)
            if dpid is None:
                return None
            res = result.switches[key] = SwitchResult(key, dpid)
        prior = self.results.get(key)
        if prior is not None and prior.dpid == res.dpid:
            res.state, res.changes, res.last_ok = prior.state, prior.changes, prior.last_ok
        else:
            res.state = "not connected"
        self.results[key] = res
        if res.setup != "ok":
            # without OVSDB we cannot tell the switch's ports (and a userspace OVS whose
            # ovsdb-server is gone does not answer OpenFlow either): leave its flows as they are
            res.state = ("not reconciled (bootstrap failed)" if res.setup == "error"
                         else "not reconciled (its OVSDB not read yet)")
            self.known.pop(res.dpid, None)
            return None
        session = self.switches.session(res.dpid)
        if session is None:
            since = self.switches.lost_since(res.dpid)
            res.state = lost_state(key, since) if since is not None else "not connected"
            self.known.pop(res.dpid, None)
            return None
        waiting = self.unanswered.get(res.dpid)
        if waiting is not None:
            state, unanswered = waiting
            if not unanswered.reply.wait(0)[0]:
                res.state = state
                return None      # still not answering: its change waits in its desired state
            # it answered (or its connection closed): whatever the reply said, what it holds is
            # read back below (its mirror was dropped), and the bundle's errors are not anyone's
            del self.unanswered[res.dpid]
            unanswered.discard()
        if not audited and key not in changed and res.dpid in self.known and res.state == "ok":
            return None   # holds what it should: nothing to diff, nothing to send
        desired = result.desired[key]
        was_known = res.dpid in self.known and res.state == "ok"
        start = _Start(key, res, session, desired, edits.get(key) if was_known else None, audited,
                       audited and was_known and key not in changed)
        known = None if audited else self.known.get(res.dpid)
        start.reads_flows = known is None
        try:
            # meters only where some are wanted or some of ours may be left (ids carry the app)
            if desired.meters or self._had_meters.get(res.dpid, True):
                start.asked["meters"] = session.ask_meters()
            if start.reads_flows:
                start.asked["groups"] = session.ask_groups()
        except Exception as e:  # noqa: BLE001 - the switch's state, retried next pass
            self._failed(res, session, e)
            return None
        return start

    def _diffed(self, starts: list[_Start]) -> list[_Plan]:
        """The changes of the switches `_plan` started, once their reads are answered: first the
        small reads `_plan` sent (meters, groups) of every switch, awaited together, so that every
        silent switch is found within one REPLY_WAIT; then the flows of those that answered,
        READ_FLOWS_AT_ONCE at a time (the replies of a hundred switches' flows would be held in
        memory at once otherwise), each batch asked together and awaited."""
        answered = []
        for start in starts:
            try:
                start.got = {name: asked.result() for name, asked in start.asked.items()}
            except Exception as e:  # noqa: BLE001 - the switch's state, retried next pass
                self._failed(start.res, start.session, e)
                continue
            finally:
                start.asked = {}
            answered.append(start)
        plans = []

        def diffed(start: _Start, read) -> None:
            try:
                if read is not None:
                    start.got["flows"] = read.result()
                plans.append(self._planned(start))
            except Exception as e:  # noqa: BLE001 - the switch's state, retried next pass
                self._failed(start.res, start.session, e)
            finally:
                start.got = {}    # what it holds, decoded: not kept past its diff
        _windowed(answered, lambda start: len(start.desired.flows) if start.reads_flows else 0,
                  READ_FLOWS_AT_ONCE, lambda start: start.session.ask_flows() if start.reads_flows else None, diffed)
        return plans

    def _planned(self, start: _Start) -> _Plan:
        """The switch's change, its reads answered (`start.got`)."""
        key, res, desired = start.key, start.res, start.desired
        change, foreign, mirror = self._diff(start.session, desired, start.audited, start.edit, start.got)
        if mirror is not None and self.check_incremental:
            self.assert_same_change(key, change, desired, mirror)
        if start.drift_found and len(change):
            self.on_drift("audit", f"{key}: {len(change)} differences from what was installed")
        res.state = "applying"   # ok or error once sent
        return _Plan(res, start.session, desired, change, foreign, mirror)

    def _make(self, plan: _Plan, whole: bool, held: dict[int, set], result: PassResult) -> None:
        """Send the switch what is new (everything, with `whole`); `held` gets the owners it refused."""
        res, change = plan.res, plan.change
        self.known.pop(res.dpid, None)
        if len(change):
            LOG.info("%s %016x: %d flow puts, %d deletes, %d/%d/%d group add/mod/del, %d/%d/%d meter "
                     "add/mod/del", res.key, res.dpid, *map(len, change.__dict__.values()))
        try:
            held[res.dpid] = self._send(res, plan.session, change, whole_messages if whole else make_messages,
                                        result)
        except Exception as e:  # noqa: BLE001
            self._failed(res, plan.session, e)

    def _break(self, plan: _Plan, whole: bool, held: dict[int, set], result: PassResult) -> None:
        """Take from the switch what is gone (sent with the make already with `whole`), then record
        what it holds: its result, its refusals, its mirror."""
        res = plan.res
        if res.state.startswith(("error", "lost")) or res.dpid not in held:
            return
        owners = held.get(res.dpid, set())
        if not whole:
            try:
                owners |= self._send(res, plan.session, plan.change.without(owners), break_messages, result)
            except Exception as e:  # noqa: BLE001
                self._failed(res, plan.session, e)
                return
        res.changes = len(plan.change)
        res.state, res.last_ok = "ok", time.time()
        self._had_meters[res.dpid] = bool(plan.desired.meters)
        refused = {(kind, obj): result.refused[(kind, obj)] for _app, kind, obj in owners
                   if (kind, obj) in result.refused}
        if refused:
            self.refused_at[res.key] = refused
        else:
            self.refused_at.pop(res.key, None)
        if not owners:   # a switch that refused something is read back next pass
            self._remember(plan)

    def _remember(self, plan: _Plan) -> None:
        """The switch now holds `plan.desired` and what it held that is not ours: its mirror."""
        dpid, desired = plan.res.dpid, plan.desired
        if plan.mirror is not None:   # the change followed the edit: so does the mirror
            flows, groups, gone, new = plan.mirror
            flows -= gone.flows
            flows |= new.flows
            groups -= gone.groups
            groups |= new.groups
            self.known[dpid] = (flows, groups, desired)
            return
        self.known[dpid] = (set(desired.flows) | plan.foreign[0], set(desired.groups) | plan.foreign[1], desired)
        self._foreign[dpid] = plan.foreign

    def barriers(self, dpids) -> set[int]:
        """A barrier's round trip to each of these switches (those still connected), all sent
        before any is awaited: each has run its main loop since (`OsKenSession.ask_barrier`).
        Returns those that did not answer: each is not answering (its result says so) until its
        reply comes. A switch whose connection fails is left to the next pass, which sees it gone."""
        silent = set()
        asked = [(dpid, session, session.ask_barrier()) for dpid in dpids
                 if (session := self.switches.session(dpid)) is not None]
        for dpid, session, barrier in asked:
            try:
                barrier.result()
            except Unanswered as e:
                res = next((r for r in self.results.values() if r.dpid == dpid), None)
                if res is not None:
                    self._failed(res, session, e)
                    silent.add(dpid)
            except Exception as e:  # noqa: BLE001 - the switch's health, seen by the next pass
                LOG.warning("%016x: barrier failed: %s", dpid, e)
        return silent

    def _each(self, fn, plans: list[_Plan]) -> None:
        """fn(plan) for every plan, at the same time when there are several switches with changes:
        all but one of those in the pool (SENDERS), the rest on this thread (a hand-over costs more
        than a plan with nothing to send)."""
        others = [p for p in plans if len(p.change)][1:]
        if others and self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=SENDERS, thread_name_prefix="apply")
        futures = [self._pool.submit(fn, plan) for plan in others]
        for plan in plans:
            if not any(plan is o for o in others):
                fn(plan)
        for future in futures:
            future.result()

    def _diff(self, session, desired: SwitchState, audit: bool, edit: tuple | None,
              got: dict) -> tuple[Change, tuple, tuple | None]:
        """The change that brings a switch to `desired`, what it holds that is not ours, and the
        mirror to update after the change (None: rebuilt from `desired`). A switch whose mirror is
        of the desired state this pass's `edit` started from gets the edit only (its cost follows
        the change, not the switch's flows); any other is diffed whole, against its mirror or what
        it holds read back (`got`: its meters, flows and groups, those read)."""
        known = None if audit else self.known.get(session.dpid)
        meters = got.get("meters")
        if known is not None and edit is not None and known[2] is edit[0] and session.dpid in self._foreign:
            _, gone, new = edit
            change = diff(SwitchState(new.flows, new.groups, desired.meters), gone.flows, gone.groups, meters)
            self._count_diff("edit")
            return change, self._foreign[session.dpid], (known[0], known[1], gone, new)
        flows, groups = known[:2] if known is not None else (got["flows"], got["groups"])
        foreign = self._foreign.get(session.dpid) if known is not None else None
        if foreign is None:   # what is not ours on the switch (kept with the mirror: no pass over it)
            foreign = ({f for f in flows if not owns_cookie(f.cookie)},
                       {g for g in groups if not owns_id(g.group_id)})
        self._count_diff("whole")
        return diff(desired, flows, groups, meters), foreign, None

    def _count_diff(self, how: str) -> None:
        self.diffs[how] += 1
        METRICS.diffs.labels(how).inc()

    def _send(self, res: SwitchResult, session, change: Change, half, result: PassResult) -> set:
        """Send one half of a change (or all of it); on a refusal, mark the refused owners and send
        the rest without them. Returns the owners held back."""
        started = time.monotonic()
        try:
            _send_half(session, change, half)
            return set()
        except ApplyError as e:
            owners = {parse_cookie(s.cookie) for s in e.refused}
            if not owners or not session.alive():   # a closing connection refuses nothing in particular
                raise
            LOG.warning("%s: refused %s: %s", res.key, sorted(owners), e)
            for _app, kind, obj in owners:
                result.refused[(kind, obj)] = f"{res.key}: {e}"
            _send_half(session, change.without(owners), half)
            return owners
        finally:
            res.apply_seconds += time.monotonic() - started

    def _failed(self, res: SwitchResult, session, e: Exception) -> None:
        if isinstance(e, Unanswered):
            LOG.warning("%s: %s: left alone until it answers", res.key, e)
        else:
            LOG.warning("%s: apply failed: %s", res.key, e)
        if isinstance(e, Unanswered):
            res.state = f"not answering: no reply to {e.what} since {time.strftime('%H:%M:%S')}"
            self.unanswered[res.dpid] = (res.state, e)
            e.reply.then(lambda _msg: self.on_retry())
        elif isinstance(e, NotRegistered) and session.alive():
            # a connection that just came up, not yet usable for requests: not the switch's fault
            # nor ours; tried again shortly
            res.state = "not connected"
            retry = threading.Timer(0.5, self.on_retry)
            retry.daemon = True
            retry.start()
        elif session.alive():
            res.state = f"error: {e}"
        else:   # the switch went away during the pass: that is its health, not our change
            res.state = lost_state(res.key, self.switches.lost_since(res.dpid) or time.time())
        self.forget(res.dpid)

    def assert_same_change(self, key: SwitchKey, change: Change, desired: SwitchState, mirror: tuple) -> None:
        """The change worked out from a pass's edit equals a diff of the whole desired state against
        the switch's mirror (check_incremental); raises IncrementalMismatch naming what differs."""
        full = diff(desired, mirror[0], mirror[1], None)
        differ = [f"{name}: edit-only {sorted(map(str, set(mine) - set(theirs)))[:3]} "
                  f"whole-only {sorted(map(str, set(theirs) - set(mine)))[:3]}"
                  for name, mine, theirs in ((n, getattr(change, n), getattr(full, n))
                                             for n in ("put", "delete", "add_g", "mod_g", "del_g"))
                  if set(mine) != set(theirs)]
        if differ:
            self.mismatches += 1
            what = f"{key}: the change from the edit differs from a whole diff: " + "; ".join(differ)
            LOG.error("%s", what)
            self.known.clear()    # the next pass diffs every switch whole, against what it holds
            raise IncrementalMismatch(what)


def _windowed(items: list, size, most: int, start, finish) -> None:
    """start(item) for every item in order, and finish(item, what its start returned) in the same
    order, an item started only while the sizes of those started and not finished add up to `most`
    at most (one item at least): the oldest started are finished to make room."""
    going, total = deque(), 0
    for item in items:
        while going and total + size(item) > most:
            done, started = going.popleft()
            total -= size(done)
            finish(done, started)
        going.append((item, start(item)))
        total += size(item)
    while going:
        finish(*going.popleft())


def _send_half(session, change: Change, half) -> None:
    """Send `change` as `half` (make_messages, break_messages or whole_messages) makes it: the
    messages that must be atomic in a bundle, the others plain, in the order the half says."""
    if half is whole_messages:
        plain, bundled, after = half(session.dp, change)
        session.plain(plain)
        session.bundle(bundled)
        session.plain(after)
        return
    first, second = half(session.dp, change)
    if half is make_messages:
        session.plain(first)
        session.bundle(second)
    else:
        session.bundle(first)
        session.plain(second)
