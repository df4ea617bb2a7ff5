"""The reconciler: model → every app's desired state per switch → diff → make, then break → status.

One thread runs passes, woken by events only: an API write, an OVSDB change of a node (an interface
plugged, unplugged or renumbered; a bridge or controller changed), an OpenFlow port-status or a
switch (re)connecting. Nothing runs at rest but a cheap periodic check (each switch's flow
count against what we installed, each node's OVSDB replica against the port numbers we
compiled with) and, rarely, an audit reading a few switches back in turn (AUDIT_FLOWS); whatever
they find is logged and counted and repaired by a pass. Changes that arrive while a pass runs are
coalesced into the next one, which in a sustained burst starts after a pause as long as that pass
(at most BURST_PAUSE). A pass:

1. reads again the parts of the store the API wrote since the last pass (fathom.store.changes;
   the whole store on the first pass, an explicit sync and the audit), and adds the switches' runtime
   facts: a node whose OVSDB reported a bridge change (or that is new, or failed) is re-checked
   over OVSDB; the others' OpenFlow port numbers come from the OVSDB replica, with no round trip;
   then each extension `prepare`s its switches (the fabric: ToRs and br-phy, and the ToR port
   numbers), re-checking only what changed the same way (`setup_due`);
2. compiles incrementally (see `_compile`): an app that can say which owners a change touches
   (`App.touched`) recompiles only those (`compile_owners`) and its desired state is replaced
   owner by owner; other apps are compiled whole; a change no handler covers, or a batch beyond
   INCREMENTAL_LIMIT owners and a quarter of the app's, recompiles the app whole (logged with its
   reason, counted in fathom_reconciler_recomputes_total). Desired state is kept per switch and
   per owning object;
3. for every connected switch diffs desired against what it holds (read back, or what it was last
   sent) with one ownership rule (the cookie's app byte), and applies the difference in two halves
   across all switches: first every switch gets what is new (meters, groups, flows; one atomic
   bundle each), then every switch loses what is gone. So no switch stops using a path before
   every switch has the new one: moving a router between modes is make-before-break by
   construction. A switch that already holds its desired state is sent nothing;
4. a refused change marks exactly the objects whose messages the switch refused (by cookie) as
   `error` and the rest of the change is applied without them;
5. extensions run their agents (`after_pass`, e.g. network-node router namespaces) and statuses are
   decided (fathom.controller.status) and written for the objects whose status changed, then
   published on the status board (long-polls wait on it: fathom.controller.board).

Only switches whose desired state changed, or that are not known (just connected, drifted,
refused), are diffed. A known switch (what we last installed on it, the mirror, is of the desired
state this pass started from) gets the pass's edit only: what its changed owners held before and
hold now (`edits`), so its cost follows the change, not its flows; any other switch is diffed whole,
against its mirror or, when unknown, what it holds read back. With `check_incremental` (on in the
test suite) every pass also compiles the model whole and asserts it equals the incrementally kept
desired state, and every change from an edit equals a whole diff against the mirror.
"""
from __future__ import annotations

import gc
import logging
import os
import re
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace

from fathom.apps import (
    BR_INT, BR_PHY, TOR, Owner, OwnerOn, SwitchKey, by_owner, compile_all, compile_owners, registry,
)
from fathom.apps.tenant.compiler import refused_ports
from fathom.controller import status
from fathom.controller.board import StatusBoard
from fathom.controller.bootstrap import OVSDB_PORT
from fathom.controller.extension import Extension, NoBootstrap, NodeBootstrap
from fathom.controller.setups import SETUP_WAIT, Setups
from fathom.controller.switch import (
    ApplyError, Change, NotRegistered, break_messages, diff, make_messages, whole_messages,
)
from fathom.model import Snapshot, datapath_id, datapath_id_phy, datapath_id_tor
from fathom.openflow.spec import SwitchState
from fathom.pipeline import cookies as ck
from fathom.pipeline.cookies import owns_cookie, owns_id, parse_cookie
from fathom.pipeline.infrastructure import is_infrastructure_interface
from fathom.store.changes import TableChanges
from fathom.store.db import READ_ONLY
from fathom.store.snapshot import StoreReader

LOG = logging.getLogger("fathom.reconciler")

# New state goes to the switches nearest the physical network first, old state leaves the edge first.
MAKE_ORDER = {TOR: 0, BR_PHY: 1, BR_INT: 2}
# More owners touched in one pass than this, and than INCREMENTAL_SHARE of the app's owners, each
# counted once per switch it is on (`_Part.cost`, `_Part.size`): recompiling the app whole is
# cheaper (a compile per owner costs what the whole compile costs for those owners, plus the
# look-ups; a fabric filling at hundreds of ports a pass stays incremental).
INCREMENTAL_LIMIT = 256
INCREMENTAL_SHARE = 0.25
# Flows the periodic audit reads back, switch by switch in turn: an audit takes the next switches
# until their desired flows reach this (one switch at least), so a fabric of a hundred switches
# (1.4 million flows at 100 ports a node: 85 s of read-back at once) waits a few seconds for it
# at most; a lab's switches are all read back by every audit.
AUDIT_FLOWS = 20_000
# In a sustained burst (changes arrived while each of the last BURST_PASSES passes ran) the next
# pass waits as long as the last one took, at most BURST_PAUSE seconds: the burst is coalesced into
# fewer passes and the API threads, which share the interpreter with the passes, are not starved. A
# change after a quiet moment, or the one or two that make a port up (its API call, its VIF), is
# reconciled at once.
BURST_PASSES = 2
BURST_PAUSE = 0.25
# A switch's flows outlive its controller (fail-mode secure), and OVS reconnects within its backoff
# (8 s at most by default). For this long after the controller starts, while a switch has not
# connected yet, the statuses in the store (the last controller's word) stand: a restart does not
# turn every object at home there `pending` (and a Neutron port DOWN) for those seconds. Nor, while
# a node's OVSDB has not been read yet (its br-int is left alone meanwhile: see `_prepare`).
STARTUP_GRACE = 15.0
# Seconds between two freezes of the controller's memory (`_freeze_memory`) while passes follow
# each other: the collection before a freeze walks the new states still alive (at 100 nodes x 100
# ports, one port's pass puts a new state on every switch: about 140 ms a freeze), whatever the
# number of passes since the last one, so passes in a row share one every few seconds; the last
# one's is done when the loop goes quiet.
FREEZE_EVERY = 5.0
# The collector's thresholds in the controller's process (fathom.controller.server). A pass makes
# millions of objects at a hundred nodes, most of which it keeps (the desired state): CPython's
# defaults (a young collection every 700 allocations) make the collector walk them again and again
# while they are made, and a whole compile of 100 nodes x 100 ports took 3x as long (security
# groups: 41 s against 13-19 s). A young collection counts allocations less frees, and walks every
# young container alive, each switch's new state among them (a set of some 14,000 flows at 100 x
# 100, where a port's pass gives every switch a new one): at 50,000 one came every sixth pass or
# so and held the interpreter for 160-210 ms in the middle of a port's pass. At 200,000, passes in
# a row are frozen (FREEZE_EVERY: a full collection, after a pass's statuses are out) before one
# comes; what cyclic garbage the API makes meanwhile waits for at most that many allocations.
GC_THRESHOLDS = (200_000, 20, 10)


class _Metrics:
    """The reconciler's Prometheus families, on prometheus_client's default registry (/metrics)."""
    _made: dict = {}

    def __getattr__(self, name):
        if not self._made:
            from prometheus_client import Counter
            self._made.update(
                passes=Counter("fathom_reconciler_passes", "reconcile passes", ["trigger"]),
                recomputes=Counter("fathom_reconciler_recomputes",
                                   "apps compiled whole where incremental compilation could not cover a change",
                                   ["app", "reason"]),
                incremental=Counter("fathom_reconciler_incremental_compiles",
                                    "apps compiled incrementally (only the owners a change touched)", ["app"]),
                diffs=Counter("fathom_reconciler_switch_diffs",
                              "switch changes worked out from a pass's edit of the desired state (edit) or "
                              "by a diff of the whole state (whole: unknown switch, audit, reconnect, refusal)",
                              ["how"]),
                drift=Counter("fathom_reconciler_drift",
                              "differences between a switch or node and what we installed or compiled with, "
                              "found by the periodic check or the audit", ["source"]),
            )
        return self._made[name]


METRICS = _Metrics()


@dataclass
class SwitchResult:
    key: SwitchKey
    dpid: int
    setup: str = "ok"               # the switch's bootstrap (OVSDB): ok | error | checking (not read yet)
    reason: str | None = None       # why setup failed
    state: str = "not connected"    # ok | not connected | not reconciled (...) | lost: ... | error: ...
    changes: int = 0
    last_ok: float | None = None
    apply_seconds: float = 0.0      # time spent sending this pass's change (both halves)


@dataclass
class NodeResult:
    """A node as its br-int saw the pass (the /sync answer and the node's status)."""
    bootstrap: str = "init"
    reason: str | None = None
    switch: str = "not connected"   # ok | not connected | lost: ... | error: ...
    changes: int = 0
    last_ok: float | None = None
    apply_seconds: float = 0.0


def without_refused(snapshot: Snapshot) -> tuple[Snapshot, dict[int, str]]:
    """The model the apps compile, and the ports refused: a port bound to one of the fabric's own
    interfaces (refused_ports) is compiled by no app (the tenant compiler refuses it itself; a tap
    policy on it must not copy the tunnel either)."""
    refused = refused_ports(snapshot)
    if refused:
        snapshot = replace(snapshot, ports=tuple(p for p in snapshot.ports if p.id not in refused))
    return snapshot, refused


def compile_switches(snapshot: Snapshot) -> tuple[dict[SwitchKey, SwitchState], dict[int, str]]:
    """The desired state of every switch compiled whole, and the ports refused."""
    snapshot, refused = without_refused(snapshot)
    return compile_all(snapshot), refused


def compiles_the_same(before: Snapshot | None, after: Snapshot) -> bool:
    """Whether the apps would compile `after` exactly as `before`: the same store parts (the very
    objects: not read again), the same fabric, and the same nodes but for the port numbers of
    interfaces no port names and that are not the fabric's own (a VIF plugged before its port
    exists, or unplugged after it is gone). Such a pass compiles nothing."""
    if before is None or len(before.nodes) != len(after.nodes):
        return False
    for f in fields(Snapshot):
        if f.name not in ("nodes", "fabric", "derived") and getattr(before, f.name) is not getattr(after, f.name):
            return False
    if before.fabric != after.fabric:
        return False
    named = {(p.node, p.interface) for p in after.ports}
    for b, a in zip(before.nodes, after.nodes):
        if b.ofports is not a.ofports and b.ofports != a.ofports:
            moved = {i for i in set(b.ofports) | set(a.ofports) if b.ofports.get(i) != a.ofports.get(i)}
            if any(is_infrastructure_interface(i) or (a.name, i) in named for i in moved):
                return False
        if replace(b, ofports=a.ofports) != a:
            return False
    return True


class IncrementalMismatch(AssertionError):
    """The incrementally kept desired state differs from a full compile (check_incremental)."""


@dataclass
class PassResult:
    nodes: dict[str, NodeResult] = field(default_factory=dict)
    switches: dict[SwitchKey, SwitchResult] = field(default_factory=dict)
    desired: dict[SwitchKey, SwitchState] = field(default_factory=dict)
    # (kind, object id) -> reason: objects whose flows, groups or meters a switch refused
    refused: dict[tuple[int, int], str] = field(default_factory=dict)
    # (kind, object id) -> (status, reason) decided by an agent outside the switches (router namespaces)
    agents: dict[tuple[int, int], tuple[str, str | None]] = field(default_factory=dict)
    # network id -> ((node, status, reason), ...): its DHCP server on each node that must run one
    dhcp_servers: dict[int, tuple] = field(default_factory=dict)
    # (kind, object id) -> switches that must hold its flows (None: the status model reads `desired`)
    needs: dict | None = None
    # the (kind, object id) whose switches in `needs` changed since statuses were last decided
    # (None: not known; every object's status is decided again)
    needs_changed: set | None = None
    # monotonic time by which the datapaths have gone over what this pass made (its last commit
    # reply plus the switches' settle time; None: it made nothing), and the switches that made it
    # (datapath ids): see Reconciler._write_statuses
    settled_at: float | None = None
    made_on: tuple = ()

    def br_int(self, node: str) -> SwitchState | None:
        return self.desired.get(SwitchKey(BR_INT, node))


def switch_dpid(key: SwitchKey, snapshot: Snapshot) -> int | None:
    if key.bridge == TOR:
        fabric = snapshot.fabric
        sw = next((s for s in (fabric.switches if fabric else ()) if s.name == key.name), None)
        return datapath_id_tor(sw.id) if sw else None
    node = next((n for n in snapshot.nodes if n.name == key.name), None)
    if node is None:
        return None
    return datapath_id(node.id) if key.bridge == BR_INT else datapath_id_phy(node.id)


def lost_state(key: SwitchKey, since: float) -> str:
    """The state of a switch that was connected and is gone: its ovs-vswitchd died or it is cut off."""
    whose = "" if key.bridge == TOR else f"{key.bridge}'s "
    return (f"lost: {whose}OpenFlow connection closed at {time.strftime('%H:%M:%S', time.localtime(since))} "
            "(ovs-vswitchd down or unreachable)")


class _Edit:
    """What a pass took out of and put into one switch's desired state, as parts' states (united
    once at the end of the compile: see Reconciler._compile)."""
    __slots__ = ("gone", "new", "_united")

    def __init__(self):
        self.gone: list[SwitchState] = []
        self.new: list[SwitchState] = []
        self._united: tuple[SwitchState, SwitchState] | None = None

    def united(self) -> tuple[SwitchState, SwitchState]:
        """(everything taken out, everything put in), each as one state."""
        if self._united is None:
            self._united = (_union(self.gone), _union(self.new))
        return self._united


def _record(edits: dict | None, key: SwitchKey, gone, new) -> None:
    if edits is not None:
        edit = edits.get(key) or edits.setdefault(key, _Edit())
        edit.gone.extend(gone)
        edit.new.extend(new)
        edit._united = None


def _union(states) -> SwitchState:
    """One state holding all of `states` (built once, with no state in between; the one state
    itself when there is one)."""
    states = list(states)
    if len(states) == 1:
        return states[0]
    return SwitchState(frozenset().union(*(s.flows for s in states)), frozenset().union(*(s.groups for s in states)),
                       frozenset().union(*(s.meters for s in states)))


class _Part:
    """One app's desired state (or one `derive`'s): per switch, and per owner within each switch.

    An app compiled owner by owner keeps its owners' states (`owners`); its state on a switch is
    their union, made only when asked (`state`) and dropped when an owner there is replaced, so a
    change costs what the owners it replaces hold, not the switch's flows."""

    def __init__(self):
        self.states: dict[SwitchKey, SwitchState] = {}  # key -> its whole state (indexed: if made since a change there)
        self.owners: dict[SwitchKey, dict[Owner, SwitchState]] = {}   # key -> owner -> SwitchState
        self.where: dict[Owner, set[SwitchKey]] = {}  # owner -> switches holding something of it
        self.indexed = False                          # kept owner by owner (set_whole with index)

    def keys(self) -> set[SwitchKey]:
        return {k for k, index in self.owners.items() if index} if self.indexed else set(self.states)

    def state(self, key: SwitchKey) -> SwitchState | None:
        """The part's state on `key`, None when it has nothing there."""
        state = self.states.get(key)
        if state is None and self.indexed and self.owners.get(key):
            state = self.states[key] = _union(self.owners[key].values())
        return state

    def size(self) -> int:
        """Owners held, each once per switch it is on."""
        return sum(len(index) for index in self.owners.values())

    def cost(self, owners) -> int:
        """What replacing `owners` costs against `size`: an owner named on one switch counts once,
        one on every switch once per switch that holds it now (at least once)."""
        return sum(1 if o.switch is not None else len(self.where.get(o, ())) or 1 for o in owners)

    def set_whole(self, compiled: dict[SwitchKey, SwitchState], index: bool,
                  edits: dict | None = None) -> set[SwitchKey]:
        """Replace everything; returns the switches whose state changed (and records in `edits`
        what each of them lost and gained)."""
        before = {k: self.state(k) for k in self.keys()}
        changed = {k for k in set(before) | set(compiled) if before.get(k) != compiled.get(k)}
        for key in changed:
            _record(edits, key, [before[key]] if key in before else [],
                    [compiled[key]] if key in compiled else [])
        self.states = dict(compiled)
        self.owners, self.where, self.indexed = {}, {}, index
        if index:
            for key, state in compiled.items():
                self.owners[key] = by_owner(state)
                for o in self.owners[key]:
                    self.where.setdefault(o, set()).add(key)
        return changed

    def replace(self, owners: frozenset[Owner | OwnerOn], compiled: dict[SwitchKey, SwitchState],
                edits: dict | None = None, moves: dict | None = None) -> set[SwitchKey]:
        """Replace the state of exactly `owners` with `compiled` (theirs only): an `Owner` on every
        switch, an `OwnerOn` on its switch only; records in `edits` the owners' old and new states
        on each switch that changed, in `moves` the owners it held and holds there."""
        everywhere: set[Owner] = set()
        scoped: dict[SwitchKey, set[Owner]] = {}
        for o in owners:
            if o.switch is not None:
                scoped.setdefault(o.switch, set()).add(o.owner)
            else:
                everywhere.add(o)
        keys = set(compiled) | set(scoped)
        for o in everywhere:
            keys |= self.where.get(o, set())
        changed = set()
        for key in keys:
            index = self.owners.setdefault(key, {})
            mine = everywhere | scoped[key] if key in scoped else everywhere
            old = {o: index.pop(o) for o in mine if o in index}
            new = by_owner(compiled[key]) if key in compiled else {}
            for o in old:
                self.where.get(o, set()).discard(key)
            for o, st in new.items():
                index[o] = st
                self.where.setdefault(o, set()).add(key)
            if old == new:
                continue
            _record(edits, key, old.values(), new.values())
            if moves is not None:
                gone, got = moves.setdefault(key, ([], []))
                gone.extend(old)
                got.extend(new)
            self.states.pop(key, None)
            changed.add(key)
        return changed


def _edited(state: SwitchState, edit: "_Edit") -> "_Edited":
    """`state` without what `edit` took out and with what it put in, where the edit's states are
    owners' (an owner's flows, groups and meters are its own: no other owner holds them)."""
    gone, new = edit.united()
    return _Edited(state, gone.flows, new.flows, _edit_set(state.groups, gone.groups, new.groups),
                   _edit_set(state.meters, gone.meters, new.meters))


def _edit_set(held: frozenset, out: frozenset, into: frozenset) -> frozenset:
    """`held` without `out` and with `into` (what is in both stays)."""
    out, into = out - into, into - out
    if not out:
        return held | into if into else held
    if not into:
        return held - out
    kept = set(held)
    kept -= out
    kept |= into
    return frozenset(kept)


UNITE_AFTER = 32   # edits an edited switch state chains before it is made whole (see _Edited)


class _Edited(SwitchState):
    """A switch's state as an older one edited by a pass (`_edited`): its flows are made whole only
    when read, or once it chains UNITE_AFTER edits.

    A port's pass at 100 nodes changes every switch by a few of its ~14,000 flows; the switch is
    told only the edit (Reconciler.edits: within one owner's flows, what it loses is `gone - got`,
    what it gains `got - gone`), so nothing in a pass needs the whole set unless the ToR's derive,
    a whole diff, an audit or the API's views read it. Copying and freeing each switch's set on
    every change cost a port's pass at 100 x 100 about a fifth of its CPU; now one pass in
    UNITE_AFTER does. Equal to, and hashed like, the SwitchState with the same contents; safe to
    read from any thread (a second reader in between makes the same set)."""

    def __init__(self, base: SwitchState, out: frozenset, into: frozenset, groups: frozenset, meters: frozenset):
        object.__setattr__(self, "_base", base)
        object.__setattr__(self, "_edit", (out - into, into - out))
        object.__setattr__(self, "_flows", None)
        object.__setattr__(self, "_from", id(base))
        object.__setattr__(self, "_depth", base._depth + 1 if isinstance(base, _Edited) and base._flows is None else 1)
        SwitchState.groups.__set__(self, groups)     # the frozen base's own slots
        SwitchState.meters.__set__(self, meters)
        if self._depth >= UNITE_AFTER:
            self.unite()

    def follows(self, state: SwitchState) -> bool:
        """Whether this state is `state` edited (`state` alive: its id is its own)."""
        return self._from == id(state)

    @property
    def flows(self) -> frozenset:
        return self.unite()

    def unite(self) -> frozenset:
        """The flows, made whole once: the nearest whole state down the chain, and the edits since."""
        flows = self._flows
        if flows is not None:
            return flows
        edits, state = [], self
        while isinstance(state, _Edited) and state._flows is None:
            base = state._base
            if base is None:            # another thread made it whole meanwhile
                break
            edits.append(state._edit)
            state = base
        if state is self:
            return self._flows
        held = set(state.flows)
        for out, into in reversed(edits):
            held -= out
            held |= into
        flows = frozenset(held)
        object.__setattr__(self, "_flows", flows)
        object.__setattr__(self, "_base", None)     # the chain below is freed with its last reader
        return flows

    def __eq__(self, other):
        if not isinstance(other, SwitchState):
            return NotImplemented
        return (self.flows, self.groups, self.meters) == (other.flows, other.groups, other.meters)

    def __hash__(self):
        return hash((self.flows, self.groups, self.meters))

    def __repr__(self):
        return f"SwitchState(flows={self.flows!r}, groups={self.groups!r}, meters={self.meters!r})"


def _unneed(needs: dict, owner: tuple[int, int], key: SwitchKey) -> None:
    """`key` holds nothing of `owner` (kind, object id) any more (Reconciler._needs)."""
    needs[owner].discard(key)
    if not needs[owner]:
        del needs[owner]


def _freeze_memory() -> None:
    """Put what is alive now out of the cyclic garbage collector's reach (gc.freeze), after
    collecting what is not (gc.collect walks only what is not frozen yet: about what the passes
    since the last freeze made, so it costs what the changes cost: see FREEZE_EVERY).

    The controller keeps every switch's desired state, the model and their indexes: at 100 nodes x
    100 ports tens of millions of objects, immutable and free of cycles (tests/unit/test_memory.py),
    which CPython's full collections would walk, every one of them, each time a quarter as many
    again had been made: a pause of seconds with the interpreter held, long enough for the nodes'
    OVSDB servers to drop the controller. Frozen objects are still freed when their last reference
    goes; what a freeze catches that ends up in a cycle later (a switch's connection objects when it
    disconnects) is never collected: a few kilobytes a reconnect."""
    gc.collect()
    gc.freeze()


class _Steps:
    """How long each step of a pass took (milliseconds in the pass's log line, seconds in health)."""

    def __init__(self, started: float):
        self.times: dict[str, float] = {}
        self._last = started

    def done(self, step: str) -> None:
        now = time.monotonic()
        self.times[step] = now - self._last
        self._last = now


@dataclass
class _Events:
    """What happened since the last pass (taken at once by a pass, so nothing is lost)."""
    store: bool = False
    setup: set = field(default_factory=set)      # node / ToR names whose bridges must be re-checked
    ports: set = field(default_factory=set)      # node names whose interfaces changed
    seq: int = 0                                 # API writes requested so far (status board)
    triggers: set = field(default_factory=set)
    since: float | None = None                   # monotonic time of the first of these events


class Reconciler:
    def __init__(self, session_factory, switches, bootstrapper: NodeBootstrap | None, interval: float = 5.0,
                 audit_interval: float | None = None, check_incremental: bool | None = None,
                 startup_grace: float = STARTUP_GRACE, freeze_memory: bool = False):
        """`switches.session(dpid)` gives a connected switch's session (fathom.controller.switch);
        `bootstrapper`: the nodes' OVSDB (None: none, every node's check fails).

        `interval`: seconds between cheap checks (flow counts, OVSDB replicas); an audit reading
        switches back in turn (about AUDIT_FLOWS flows each time) runs every `audit_interval`
        (default: 60 checks, at least 5 minutes).
        `check_incremental`: after each pass, compile whole and assert equality (default: the
        environment's FATHOM_CHECK_INCREMENTAL=1, which the test suite sets).
        `startup_grace`: see STARTUP_GRACE.
        `freeze_memory`: what passes left alive is put out of the cyclic garbage collector's reach
        (`_freeze_memory`; the controller's process, not a test's), after a pass at most every
        `freeze_every` seconds and when the loop goes quiet."""
        self.Session = session_factory
        self.freeze_memory = freeze_memory
        self.freeze_every = FREEZE_EVERY
        self._frozen_at = -FREEZE_EVERY    # monotonic time of the last freeze
        self._freeze_due = False           # a pass ran since
        # after an API write only the parts of the store whose tables were written are read again
        engine = session_factory.kw.get("bind")     # a sessionmaker (fathom.store.db.session_factory)
        self._store_changes = TableChanges(engine) if engine is not None else None
        self._store_reader = StoreReader()
        self._written_last: set = set()             # tables (and port rows) the last store read was for
        # store reads so far, and the tables the last one read again (None: the whole store), for
        # extensions that keep reads of their own tables across passes (fathom.controller.hostlocal)
        self.store_reads, self.store_written = 0, None
        self.switches = switches
        self.bootstrapper: NodeBootstrap = bootstrapper if bootstrapper is not None else NoBootstrap()
        self.bootstrapper.on_change = self.ovsdb_changed
        self.interval = interval
        self.audit_interval = audit_interval if audit_interval is not None else max(300.0, 60 * interval)
        self.check_incremental = (os.environ.get("FATHOM_CHECK_INCREMENTAL") == "1" if check_incremental is None
                                  else check_incremental)
        self.board = StatusBoard()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._events_lock = threading.Lock()
        self._events = _Events(store=True, triggers={"start"})
        self.last = PassResult()
        self.passes = 0
        self.last_pass_seconds = 0.0
        # step -> seconds: the last pass's steps (`steps_total`: summed over every pass), /v1/health
        self.last_pass_steps: dict[str, float] = {}
        self.steps_total: dict[str, float] = {}
        self.lock = threading.Lock()  # one pass at a time (the loop, or an explicit sync)
        # What each switch holds after our last successful apply (the mirror: its flows and groups,
        # and the desired state they were made from): passes diff against it instead of reading
        # every flow back. Dropped on reconnect, failure, drift and audit.
        self.known: dict[int, tuple[set, set, SwitchState]] = {}
        self._had_meters: dict[int, bool] = {}  # dpid -> desired meters last pass (unknown: read)
        # providers of more switches and agents (the fabric, external gateways, host-local status)
        self.extensions: list[Extension] = []
        # kept across passes
        self.store_model: Snapshot | None = None
        self.model: Snapshot | None = None            # the last compiled model (store + runtime facts)
        self.parts: dict[str, _Part] = {}             # app (or "derive:" app) -> its desired state
        self.desired: dict[SwitchKey, SwitchState] = {}
        # switch -> (its desired state before this pass, what the pass took out, what it put in):
        # the change of a switch that holds that state, without a pass over all its flows
        self.edits: dict[SwitchKey, tuple[SwitchState, SwitchState, SwitchState]] = {}
        self._compiled: dict[SwitchKey, SwitchState] = {}   # union of the apps' compiles (before derive)
        self._foreign: dict[int, tuple[set, set]] = {}    # dpid -> flows and groups not ours, with `known`
        self.results: dict[SwitchKey, SwitchResult] = {}
        self.refused_at: dict[SwitchKey, dict[tuple[int, int], str]] = {}
        self._setup_due: set[str] = set()             # names whose bridges this pass re-checks
        self._checked_all = True                      # this pass re-checks every bridge
        self.recomputes: dict[str, int] = {}          # "app: reason" -> count (also in /metrics)
        self.drift: dict[str, int] = {}               # source -> count (also in /metrics)
        self.mismatches = 0                           # check_incremental failures (must stay 0)
        self.diffs = {"edit": 0, "whole": 0}          # switch changes worked out each way (also in /metrics)
        self.model_compiled: Snapshot | None = None   # the model the kept desired state was compiled from
        # switch -> (kind, object id) it holds something of -> how many parts' owners hold it there
        self._owners_at: dict[SwitchKey, Counter] = {}
        self._needs_index: dict = {}                  # its reverse: (kind, object id) -> switches
        self._needs_changed: set = set()              # its keys changed since statuses were decided
        self.port_statuses = status.PortStatuses()   # kept by decide from pass to pass
        self._stored: dict = {}                       # statuses in the store, read with the model
        self._node_states: dict[str, str] = {}        # node name -> bootstrap state last written
        self._pool: ThreadPoolExecutor | None = None   # applies to several switches at once
        self._setups = Setups(lambda node: self.bootstrapper.run(node),
                               lambda name: self._event("ovsdb", setup=name, ports=name))
        self._next_check = time.monotonic() + interval
        self._next_audit = time.monotonic() + self.audit_interval
        self._audited_last: SwitchKey | None = None    # the last switch the periodic audit read back
        self._busy = 0                                # passes in a row that found changes waiting
        self._grace_ends = time.monotonic() + startup_grace
        self._statuses_held = False                   # the last pass left the store's statuses alone
        self.compiled_nothing = False                 # the last pass's model compiled as the one before

    # ---------------------------------------------------------------------------- events

    def _event(self, trigger: str, store: bool = False, setup: str | None = None, ports: str | None = None,
               seq: bool = False) -> None:
        if seq:   # first: a pass that takes this event covers the write
            self.board.request()
        with self._events_lock:
            ev = self._events
            ev.store |= store
            if setup:
                ev.setup.add(setup)
            if ports:
                ev.ports.add(ports)
            ev.triggers.add(trigger)
            if ev.since is None:
                ev.since = time.monotonic()
        self._wake.set()

    def wake(self, *_args) -> None:
        """The store changed (an API write): reload it and reconcile what it changed."""
        self._event("api", store=True, seq=True)

    def ovsdb_changed(self, name: str, what: str) -> None:
        """A node's (or ToR's) OVSDB changed: "ports" (interfaces) or "setup" (bridges)."""
        if what == "setup":
            self._event("ovsdb", setup=name, ports=name)
        else:
            self._event("ovsdb", ports=name)

    def port_status(self, dpid: int) -> None:
        """An OpenFlow port-status from a switch: its ports changed (OVSDB says which). Not for a
        node's br-int whose OVSDB replica holds the port numbers the last pass compiled with: the
        replica's own notification of the change wakes a pass (it comes before or after this
        message), and the pass this one would wake finds nothing to do."""
        key = next((k for k, r in self.results.items() if r.dpid == dpid), None)
        if key is not None and key.bridge == BR_INT and self._compiled_with_replica(key.name):
            return
        self._event("port-status", ports=key.name if key is not None else None)

    def _compiled_with_replica(self, name: str) -> bool:
        model = self.model
        node = next((n for n in model.nodes if n.name == name), None) if model is not None else None
        got = self.bootstrapper.current(node) if node is not None else None
        return got is not None and dict(got[2]) == dict(node.ofports)

    def switch_changed(self, dpid: int, _datapath=None) -> None:
        """A switch connected or went away: forget what it held, reconcile it in full."""
        self.known.pop(dpid, None)
        self._had_meters.pop(dpid, None)
        name = next((k.name for k, r in self.results.items() if r.dpid == dpid), None)
        self._event("switch", setup=name)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._setups.stop()

    def _take_events(self) -> _Events:
        with self._events_lock:
            ev, self._events = self._events, _Events()
            self._wake.clear()
        ev.seq = self.board.requested
        return ev

    def setup_due(self, name: str) -> bool:
        """Whether this pass re-checks the bridges of a node or ToR (for extensions' `prepare`)."""
        return self._checked_all or name in self._setup_due

    # ---------------------------------------------------------------------------- the loop

    def run_forever(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            until = min(self._next_check, self._next_audit)
            if self._freeze_due:
                until = min(until, self._frozen_at + self.freeze_every)
            woken = self._wake.wait(max(0.0, until - now))
            if self._stop.is_set():
                break
            try:
                now = time.monotonic()
                if not woken and self._freeze_due and now >= self._frozen_at + self.freeze_every:
                    self._freeze()
                elif woken:
                    self.run_pass(audit=False)
                    self._busy = self._busy + 1 if self._wake.is_set() else 0
                    if self._busy >= BURST_PASSES:   # a sustained burst: see BURST_PAUSE
                        self._stop.wait(min(self.last_pass_seconds, BURST_PAUSE))
                elif now >= self._next_audit:
                    self._next_audit = now + self.audit_interval
                    self._next_check = now + self.interval
                    self.run_pass(audit=False, read_back=self.audit_turn())
                elif now >= self._next_check:
                    self._next_check = now + self.interval
                    self.check()
            except Exception:  # noqa: BLE001 - a broken pass must not end the loop
                LOG.exception("reconcile pass failed")
                self._event("retry", store=True)
                time.sleep(1)

    def check(self) -> bool:
        """The cheap periodic check: every node's OVSDB replica against the port numbers we compiled
        with, every known switch's flow count against what we installed (one aggregate-stats round
        trip: its cost does not grow with the tenant; groups and changed actions are the audit's). Whatever differs is logged, counted and repaired by a pass; nodes
        and switches in trouble are retried. Returns whether a pass was asked for."""
        with self.lock:
            return self._check()

    def _check(self) -> bool:
        found = False
        if self._statuses_held and time.monotonic() >= self._grace_ends:
            self._event("startup")        # a switch still away: now its objects' statuses say so
            found = True
        model = self.model
        for node in (model.nodes if model else ()):
            res = self.results.get(SwitchKey(BR_INT, node.name))
            if res is not None and res.setup == "error":
                if self._setups.due(node.name):
                    self._event("retry", setup=node.name, ports=node.name)
                    found = True
                continue
            got = self.bootstrapper.current(node)
            if got is None:   # its OVSDB connection is down: the node's status
                self._event("check", setup=node.name, ports=node.name)
                found = True
            elif got is not None and dict(got[2]) != dict(node.ofports):
                self._drift("ovsdb", f"node {node.name}: OVSDB interfaces differ from those compiled "
                                     "(a change notification was lost)")
                self._event("check", ports=node.name)
                found = True
        for ext in self.extensions:
            try:
                if ext.check(self):
                    self._event("check")   # e.g. an agent stopped reporting: its objects' status
                    found = True
            except Exception:  # noqa: BLE001 - one extension must not break the check
                LOG.exception("extension %s check failed", type(ext).__name__)
        for key, res in list(self.results.items()):
            if res.setup == "error":
                if self._setups.due(key.name):
                    self._event("retry", setup=key.name)
                    found = True
                continue
            session = self.switches.session(res.dpid)
            known = self.known.get(res.dpid)
            if session is None or known is None:
                if session is not None and not res.state.startswith("ok"):
                    self._event("retry")
                    found = True
                continue
            try:
                flows = session.count_flows()
            except Exception as e:  # noqa: BLE001 - the switch's health, seen by the next pass
                LOG.warning("%s: check failed: %s", key, e)
                continue
            if flows != len(known[0]):
                self._drift("openflow", f"{key}: {flows} flows, {len(known[0])} installed")
                self.known.pop(res.dpid, None)
                self._event("check")
                found = True
        return found

    def _drift(self, source: str, what: str) -> None:
        LOG.warning("drift (%s): %s", source, what)
        self.drift[source] = self.drift.get(source, 0) + 1
        METRICS.drift.labels(source).inc()

    # ---------------------------------------------------------------------------- one pass

    def audit_turn(self) -> frozenset[SwitchKey]:
        """The switches the next periodic audit reads back: in name order after those the last one
        read (wrapping around), until their desired flows reach AUDIT_FLOWS."""
        keys = sorted(self.results)
        last = self._audited_last
        start = next((i for i, k in enumerate(keys) if last is None or k > last), 0)
        turn, flows = [], 0
        for key in keys[start:] + keys[:start]:
            if turn and flows >= AUDIT_FLOWS:
                break
            turn.append(key)
            desired = self.desired.get(key)
            flows += len(desired.flows) if desired is not None else 0
        self._audited_last = turn[-1] if turn else None
        return frozenset(turn)

    def run_pass(self, audit: bool = True, read_back: frozenset[SwitchKey] | None = None) -> PassResult:
        """One pass; `audit` (an explicit sync) reads the store and every switch back, re-checks
        every bridge and compiles everything whole instead of trusting what we last loaded,
        applied, heard and compiled. `read_back` (the periodic audit): the store read whole, every
        bridge re-checked and these switches read back and diffed whole, compiled as any pass."""
        with self.lock:
            started = time.monotonic()
            steps = _Steps(started)
            ev = self._take_events()
            if ev.since is not None:
                steps.times["wait"] = started - ev.since   # from the first event to the pass's start
            label = ("audit" if audit else "audit turn" if read_back is not None
                     else ",".join(sorted(ev.triggers)) or "sync")
            METRICS.passes.labels(label).inc()
            kind = "audit of " + ", ".join(map(str, sorted(read_back))) if label == "audit turn" else label
            whole = audit or read_back is not None or self.store_model is None
            if ev.store or whole:
                self.store_model = self._read_store(whole=whole)
            steps.done("read")
            result = PassResult()
            self._checked_all = whole or self.model is None
            self._setup_due = ev.setup
            snapshot = self._prepare(self.store_model, result)
            steps.done("prepare")
            if not audit:   # its views are patched from those of the model compiled last (Snapshot.memo)
                snapshot.follow(self.model_compiled)
            compiled, refused = without_refused(snapshot)
            if not audit and compiled is not snapshot:
                compiled.follow(self.model_compiled)
            changed = self._compile(compiled, full=audit)
            steps.done("compile")
            result.desired = dict(self.desired)
            result.needs = self._needs(changed)
            result.needs_changed = self._needs_changed
            for port_id, reason in refused.items():
                result.refused[(ck.KIND_PORT, port_id)] = reason
            steps.done("needs")
            self._apply(snapshot, result, audit, changed, steps, read_back or frozenset())
            steps.done("break")
            self._ovsdb_lost_meanwhile(snapshot, result)
            for key, owners in self.refused_at.items():
                if key in result.desired:
                    result.refused.update(owners)
            for r in result.switches.values():
                if r.key.bridge == BR_INT and r.key.name in result.nodes:
                    n = result.nodes[r.key.name]
                    n.switch, n.changes, n.last_ok, n.apply_seconds = r.state, r.changes, r.last_ok, r.apply_seconds
            if not audit and self._nothing_new(ev, result):
                # an interface no object names came or went: every status stands as the last pass
                # decided it (no agent to run, nothing to write or publish)
                result.agents, result.dhcp_servers = self.last.agents, self.last.dhcp_servers
            else:
                for ext in self.extensions:
                    try:
                        ext.after_pass(self, snapshot, result)
                    except Exception:  # noqa: BLE001 - one extension must not break the pass
                        LOG.exception("extension %s failed", type(ext).__name__)
                steps.done("agents")
                self._write_statuses(snapshot, result, ev, steps)
            self.model = snapshot
            self.last = result
            # what the pass replaced (the switches' states before it) is freed now that the
            # statuses are out, not at the start of the next pass's compile: at 100 nodes x 100
            # ports a port's pass replaces every switch's state (mostly edits chained on a whole
            # set, see _Edited; the sets themselves when a chain is made whole)
            self.edits = {}
            steps.done("release")
            self.passes += 1
            self.last_pass_seconds = time.monotonic() - started
            self.last_pass_steps = steps.times
            for name, seconds in steps.times.items():
                self.steps_total[name] = self.steps_total.get(name, 0.0) + seconds
            LOG.info("pass %d (%s): %.1f ms, %d switches changed; %s", self.passes, kind,
                     1000 * self.last_pass_seconds, len(changed),
                     ", ".join(f"{k} {1000 * v:.1f}" for k, v in steps.times.items()))
            if self.freeze_memory:
                self._freeze_due = True
                if time.monotonic() >= self._frozen_at + self.freeze_every:
                    self._freeze()
            return result

    def _freeze(self) -> None:
        _freeze_memory()
        self._frozen_at, self._freeze_due = time.monotonic(), False

    def _nothing_new(self, ev: _Events, result: PassResult) -> bool:
        """Whether a pass woken only by a node's interfaces (OVSDB, port-status) found nothing a
        status depends on: the model compiled as before (only interfaces no object names changed,
        see compiles_the_same), and every node and switch is as the last pass left it."""
        if ev.store or ev.setup or not ev.triggers or not ev.triggers <= {"ovsdb", "port-status"}:
            return False
        if not self.compiled_nothing or self._statuses_held:
            return False
        last = self.last
        return (result.nodes.keys() == last.nodes.keys()
                and all((n.bootstrap, n.reason, n.switch) == (last.nodes[k].bootstrap, last.nodes[k].reason,
                                                              last.nodes[k].switch)
                        for k, n in result.nodes.items())
                and result.switches.keys() == last.switches.keys()
                and all((r.setup, r.state) == (last.switches[k].setup, last.switches[k].state)
                        for k, r in result.switches.items())
                and result.refused == last.refused)

    def _read_store(self, whole: bool) -> Snapshot:
        """The model from the store: every part of it (`whole`: the first pass, an explicit sync,
        the audit; rows written past the API are seen then), else only the parts whose tables
        were written since the last read. The tables of the read before are read again too: a
        write whose commit the previous read may have just missed is always followed by another
        wake-up, which reads it then."""
        taken = self._store_changes.take() if self._store_changes is not None else None
        written = None if whole or taken is None else taken | self._written_last
        self._written_last = taken or set()
        self.store_reads, self.store_written = self.store_reads + 1, written
        stored: dict = {}
        with self.Session() as session:
            session.connection(execution_options=READ_ONLY)
            model = self._store_reader.read(session, stored, written)
        self._stored = stored
        return model

    def _write_statuses(self, snapshot: Snapshot, result: PassResult, ev: _Events, steps: "_Steps") -> None:
        """Write the statuses that differ from the store's, then publish them on the board."""
        if time.monotonic() < self._grace_ends and any(r.state == "not connected" or r.setup == "checking"
                                                       for r in result.switches.values()):
            self._statuses_held = True    # see STARTUP_GRACE; the periodic check ends it in time
            return
        self._statuses_held = False
        decided = status.decide(snapshot, result, self.port_statuses)
        self._needs_changed = set()
        if self.check_incremental:
            self.assert_same_statuses(snapshot, result, decided)
        states = status.node_states(result)
        steps.done("decide")
        if ev.store:
            stored = self._stored       # as read with the model: an API write may have reset some
        else:
            stored = dict(self.board.statuses)
            stored.update({("node_state", name): st for name, st in self._node_states.items()})
        write = {k: v for k, v in decided.items() if stored.get(k) != v}
        node_states = {k: v for k, v in states.items() if stored.get(("node_state", k)) != v}
        if result.settled_at is not None and any(v[0] == "active" and (stored.get(k) or ("",))[0] != "active"
                                                 for k, v in write.items()):
            # a switch acknowledges a bundle once its tables hold it, but its datapath forwards by
            # the flows it cached from the tables before (a VIF that sent before its flows came has
            # a cached drop) until OVS's revalidators have gone over them: an object turns `active`
            # once they have had the settle time after the make, so that `active` means it forwards
            time.sleep(max(0.0, result.settled_at - time.monotonic()))
            self._barriers(result.made_on)
            steps.done("revalidate")
        if write or node_states:
            from fathom.store.status import write_statuses
            with self.Session() as session, session.begin():
                write_statuses(session, write, node_states)
            self._store_reader.statuses_written({**write, **{("node_state", k): v for k, v in node_states.items()}})
        self._node_states = states
        steps.done("statuses")
        self.board.publish(decided, ev.seq)
        steps.done("publish")

    def _prepare(self, snapshot: Snapshot, result: PassResult) -> Snapshot:
        """Add the switches' runtime facts (OpenFlow port numbers) to the model: from the OVSDB
        replica, or by re-checking the node's bridges where due (new, failed, changed, audit)."""
        ofports = {}
        current = self.bootstrapper.current
        got: dict[str, tuple] = {}
        checking = self._setups.pending()
        for node in snapshot.nodes:
            prior = self.results.get(SwitchKey(BR_INT, node.name))
            if (node.name not in checking and not self.setup_due(node.name)
                    and prior is not None and prior.setup == "ok"):
                replica = current(node)
                if replica is not None:
                    got[node.name] = replica
                    continue
            self._setup_due.add(node.name)
            self._setups.start(node)
            checking.add(node.name)
        in_error = {name for name, n in self.last.nodes.items() if n.bootstrap == "error"}
        checked = self._setups.take(checking, SETUP_WAIT, patient=checking - in_error) if checking else {}
        compiled_with = {n.name: dict(n.ofports) for n in self.model.nodes} if self.model is not None else {}
        for node in snapshot.nodes:
            answer = got.get(node.name) or checked.get(node.name)
            if answer is None:   # its check is still running: as the last pass left it
                last = self.last.nodes.get(node.name)
                answer = ((last.bootstrap, last.reason) if last is not None
                          else ("init", f"checking its OVSDB at {node.management_ip}:{OVSDB_PORT}")) + \
                    (compiled_with.get(node.name, {}),)
            state, reason, ports = answer
            result.nodes[node.name] = NodeResult(bootstrap=state, reason=reason)
            key = SwitchKey(BR_INT, node.name)
            # a node never read yet ("init": its first check still running, as at a controller's
            # start on a busy host): its port numbers are unknown, so its br-int is left alone (a
            # compile without them would take every port's flows off it until the check answers)
            setup = "error" if state == "error" else "checking" if state == "init" else "ok"
            result.switches[key] = SwitchResult(key, datapath_id(node.id), setup, reason)
            ofports[node.name] = ports
        snapshot = snapshot.with_ofports(ofports)
        for ext in self.extensions:
            try:
                snapshot = ext.prepare(self, snapshot, result)
            except Exception:  # noqa: BLE001
                LOG.exception("extension %s failed", type(ext).__name__)
        return snapshot

    def _ovsdb_lost_meanwhile(self, snapshot: Snapshot, result: PassResult) -> None:
        """A node whose switch failed during the pass and whose OVSDB connection is gone too: the
        OVSDB outage is the cause (a userspace OVS stops answering OpenFlow without ovsdb-server),
        so that is what its status says; the next pass re-checks it."""
        current = self.bootstrapper.current
        for node in snapshot.nodes:
            res = result.switches.get(SwitchKey(BR_INT, node.name))
            if res is None or res.setup != "ok" or res.state == "ok" or current(node) is not None:
                continue
            res.setup, res.reason = "error", f"OVSDB {node.management_ip}:{OVSDB_PORT}: connection lost"
            result.nodes[node.name] = NodeResult(bootstrap="error", reason=res.reason)
            self._event("ovsdb", setup=node.name, ports=node.name)

    # ---------------------------------------------------------------------------- compile

    def _compile(self, model: Snapshot, full: bool) -> set[SwitchKey]:
        """Bring the kept desired state up to `model`; returns the switches whose state changed."""
        before = self.model_compiled if not full else None
        self.edits = {}
        self._moves: dict[SwitchKey, tuple[list, list]] = {}   # owners replaced one by one: gone, got
        self._whole: set[SwitchKey] = set()                    # switches a part was set whole on
        self.compiled_nothing = before is not None and bool(self.parts) and compiles_the_same(before, model)
        if self.compiled_nothing:
            if self.check_incremental:
                self.assert_incremental(model)
            return set()
        changed: set[SwitchKey] = set()
        edits: dict[SwitchKey, _Edit] = {}
        apps = registry()
        for app in apps:
            part = self.parts.get(app.name)
            incremental = app.touched is not None
            reason = None
            owners = None
            if part is None or before is None:
                reason = "first pass" if part is None else "audit"
            elif incremental:
                owners = app.touched(before, model)
                if isinstance(owners, str):
                    reason, owners = owners, None
                elif part.cost(owners) > max(INCREMENTAL_LIMIT, INCREMENTAL_SHARE * part.size()):
                    reason, owners = f"{len(owners)} owners changed at once", None
            if owners is not None:
                if owners:
                    owners = frozenset(owners)
                    changed |= part.replace(owners, compile_owners(app, model, owners), edits, self._moves)
                METRICS.incremental.labels(app.name).inc()
                continue
            if part is None:
                part = self.parts[app.name] = _Part()
            if incremental:
                if reason != "first pass":
                    LOG.info("%s: compiled whole (%s)", app.name, reason)
                kind = re.sub(r"\d+", "N", reason)    # a bounded set of reasons: ids and counts out
                self.recomputes[f"{app.name}: {kind}"] = self.recomputes.get(f"{app.name}: {kind}", 0) + 1
                METRICS.recomputes.labels(app.name, kind).inc()
            whole = part.set_whole(app.compile(model), index=incremental, edits=edits)
            self._whole |= whole
            changed |= whole
        # the union of the apps' compiles (what `derive` reads), kept per switch like `desired`: a
        # switch only owners were replaced on gets its edit, any other the union of the parts
        compiled = self._compiled
        held = set().union(*(self.parts[app.name].keys() for app in apps))
        for key in changed | (set(compiled) - held):
            if key in compiled and key in held and key not in self._whole:
                compiled[key] = _edited(compiled[key], edits[key])
                continue
            states = [st for app in apps if (st := self.parts[app.name].state(key)) is not None]
            if states:
                compiled[key] = _union(states)
            else:
                compiled.pop(key, None)
        derived = []
        for app in apps:
            if app.derive is not None:
                part = self.parts.setdefault("derive:" + app.name, _Part())
                whole = part.set_whole(app.derive(model, compiled), index=False, edits=edits)
                self._whole |= whole
                changed |= whole
                derived.append(part)
        for key in changed:
            old = self.desired.get(key)
            states = [compiled[key]] if key in compiled else []
            states += [st for p in derived if (st := p.state(key)) is not None]
            if states:
                new = self.desired[key] = _union(states)
            else:
                new = self.desired.pop(key, None)
            edit = edits.get(key)
            if old is not None and new is not None and edit is not None:
                # what the switch loses and gains: what the parts lost that no part still holds,
                # and what they gained that was not held before (a flow may move between owners);
                # in a state this edit made from the one before, the owners' flows are their own:
                # a flow taken out is still held only if put in again, one put in was held before
                # only if taken out (no whole set is read for that)
                gone, got = edit.united()
                if isinstance(new, _Edited) and new.follows(old):
                    lost, gained = gone.flows - got.flows, got.flows - gone.flows
                else:
                    lost, gained = gone.flows - new.flows, got.flows - old.flows
                self.edits[key] = (old, SwitchState(lost, gone.groups - new.groups, gone.meters - new.meters),
                                   SwitchState(gained, got.groups - old.groups, got.meters - old.meters))
        self.model_compiled = model
        if self.check_incremental:
            self.assert_incremental(model)
        return changed

    def _needs(self, changed: set[SwitchKey]) -> dict:
        """(kind, object id) -> switches holding something of it, kept per switch: moved by the
        owners the pass replaced one by one (`_moves`, so the cost follows the change), and counted
        again for a switch a part was set whole on, or that came or went."""
        cache, needs = self._owners_at, self._needs_index
        again = self._whole | (set(cache) ^ set(self.desired))
        for key in again:
            old = cache.pop(key, Counter())
            new = self._switch_owners(key) if key in self.desired else Counter()
            if new:
                cache[key] = new
            for o in old.keys() - new.keys():
                _unneed(needs, o, key)
                self._needs_changed.add(o)
            for o in new.keys() - old.keys():
                needs.setdefault(o, set()).add(key)
                self._needs_changed.add(o)
        for key, (gone, got) in self._moves.items():
            if key in again:
                continue
            counts = cache.setdefault(key, Counter())
            for owner in gone:
                o = (owner.kind, owner.id)
                counts[o] -= 1
                if counts[o] <= 0:
                    del counts[o]
                    _unneed(needs, o, key)
                    self._needs_changed.add(o)
            for owner in got:
                o = (owner.kind, owner.id)
                counts[o] += 1
                if counts[o] == 1:
                    needs.setdefault(o, set()).add(key)
                    self._needs_changed.add(o)
            if not counts:
                del cache[key]
        if self.check_incremental:
            counted = {key: self._switch_owners(key) for key in self.desired}
            if {k: c for k, c in counted.items() if c} != cache:
                self.mismatches += 1
                differ = sorted(str(k) for k in set(counted) | set(cache) if counted.get(k) != cache.get(k))
                raise IncrementalMismatch(f"owners kept per switch differ from a count: {differ[:5]}")
        return needs

    def _switch_owners(self, key: SwitchKey) -> Counter:
        """(kind, object id) of everything the switch's desired state holds -> how many parts'
        owners hold it: from the parts' owner indexes where they keep one (no pass over every
        flow), else from the cookies."""
        out: Counter = Counter()
        for part in self.parts.values():
            if part.indexed:
                out.update((o.kind, o.id) for o in part.owners.get(key, ()))
            elif key in part.states:
                out.update(status.switch_owners(part.states[key]))
        return out

    def assert_incremental(self, model: Snapshot) -> None:
        """The kept desired state equals a compile of `model` from scratch (OVN's check after
        recompute); raises IncrementalMismatch naming what differs."""
        full = compile_all(replace(model))    # a copy: its views made afresh, not patched
        keep = lambda d: {k: v for k, v in d.items() if v.flows or v.groups or v.meters}  # noqa: E731
        mine, theirs = keep(self.desired), keep(full)
        if mine != theirs:
            lines = []
            for key in sorted(set(mine) | set(theirs)):
                a, b = mine.get(key, SwitchState()), theirs.get(key, SwitchState())
                if a != b:
                    lines.append(f"{key}: kept-only {sorted(f.to_ofctl() for f in a.flows - b.flows)[:5]} "
                                 f"full-only {sorted(f.to_ofctl() for f in b.flows - a.flows)[:5]} "
                                 f"groups kept-only {sorted(g.to_ofctl() for g in a.groups - b.groups)[:3]} "
                                 f"full-only {sorted(g.to_ofctl() for g in b.groups - a.groups)[:3]}")
            self.mismatches += 1
            LOG.error("incremental desired state differs from a full compile:\n%s", "\n".join(lines))
            self.parts, self.model_compiled, self._compiled = {}, None, {}    # the next pass compiles whole
            raise IncrementalMismatch("incremental desired state differs from a full compile:\n" + "\n".join(lines))

    def assert_same_statuses(self, snapshot: Snapshot, result: PassResult, decided: dict) -> None:
        """The statuses decided from those kept equal those decided whole (check_incremental);
        raises IncrementalMismatch naming what differs, and the next pass decides whole."""
        whole = status.decide(snapshot, result)
        if whole != decided:
            self.mismatches += 1
            self.port_statuses = status.PortStatuses()
            differ = sorted(str((k, decided.get(k), whole.get(k))) for k in set(whole) | set(decided)
                            if whole.get(k) != decided.get(k))
            LOG.error("statuses decided from those kept differ from a whole decision: %s", differ[:5])
            raise IncrementalMismatch(f"statuses decided from those kept differ: {differ[:5]}")

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

    # ---------------------------------------------------------------------------- apply

    def _apply(self, snapshot: Snapshot, result: PassResult, audit: bool, changed: set[SwitchKey],
               steps: _Steps | None = None, read_back: frozenset[SwitchKey] = frozenset()) -> None:
        """Diff every connected switch that changed or is not known (and read back every switch
        with `audit`, those in `read_back`), then make on all of them, then break on all of them
        (one bundle with both when a single switch changes). `steps` gets "make" once every switch
        acknowledged the new state (what traffic waits for)."""
        plans = []
        for key in sorted(result.desired, key=lambda k: (MAKE_ORDER.get(k.bridge, 9), k)):
            res = result.switches.get(key)
            if res is None:
                dpid = switch_dpid(key, snapshot)
                if dpid is None:
                    continue
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
                continue
            session = self.switches.session(res.dpid)
            if session is None:
                since = self.switches.lost_since(res.dpid)
                res.state = lost_state(key, since) if since is not None else "not connected"
                self.known.pop(res.dpid, None)
                continue
            audited = audit or key in read_back
            if not audited and key not in changed and res.dpid in self.known and res.state == "ok":
                continue   # holds what it should: nothing to diff, nothing to send
            desired = result.desired[key]
            was_known = res.dpid in self.known and res.state == "ok"
            try:
                edit = self.edits.get(key) if was_known else None
                change, foreign, mirror = self._diff(session, desired, audited, edit)
            except Exception as e:  # noqa: BLE001 - the switch's state, retried next pass
                self._failed(res, session, e)
                continue
            if mirror is not None and self.check_incremental:
                self.assert_same_change(key, change, desired, mirror)
            if audited and was_known and key not in changed and len(change):
                self._drift("audit", f"{key}: {len(change)} differences from what was installed")
            res.state = "applying"   # ok or error once sent
            plans.append((res, session, desired, change, foreign, mirror))
        for key in set(self.results) - set(result.desired):
            del self.results[key]

        held: dict[int, set] = {}     # dpid -> owners held back after a refusal
        busy = [p for p in plans if len(p[3])]
        whole = len(busy) == 1        # one switch changes: make and break in one atomic bundle

        def make(plan) -> None:
            res, session, desired, change, _, _ = plan
            self.known.pop(res.dpid, None)
            if len(change):
                LOG.info("%s %016x: %d flow puts, %d deletes, %d/%d/%d group add/mod/del, %d/%d/%d meter "
                         "add/mod/del", res.key, res.dpid, *map(len, change.__dict__.values()))
            try:
                held[res.dpid] = self._send(res, session, change, whole_messages if whole else make_messages,
                                            result)
            except Exception as e:  # noqa: BLE001
                self._failed(res, session, e)

        def break_(plan) -> None:
            res, session, desired, change, foreign, mirror = plan
            if res.state.startswith(("error", "lost")) or res.dpid not in held:
                return
            owners = held.get(res.dpid, set())
            if not whole:
                try:
                    owners |= self._send(res, session, change.without(owners), break_messages, result)
                except Exception as e:  # noqa: BLE001
                    self._failed(res, session, e)
                    return
            res.changes = len(change)
            res.state, res.last_ok = "ok", time.time()
            self._had_meters[res.dpid] = bool(desired.meters)
            refused = {(kind, obj): result.refused[(kind, obj)] for _app, kind, obj in owners
                       if (kind, obj) in result.refused}
            if refused:
                self.refused_at[res.key] = refused
            else:
                self.refused_at.pop(res.key, None)
            if owners:
                return
            if mirror is not None:   # the change followed the edit: so does the mirror
                flows, groups, gone, new = mirror
                flows -= gone.flows
                flows |= new.flows
                groups -= gone.groups
                groups |= new.groups
                self.known[res.dpid] = (flows, groups, desired)
                return
            self.known[res.dpid] = (set(desired.flows) | foreign[0], set(desired.groups) | foreign[1], desired)
            self._foreign[res.dpid] = foreign

        # by tier (ToR, br-phy, br-int): every switch of a tier at once (one round trip each, in
        # parallel); new state in from the physical network inwards, old state out the other way
        tiers: dict[int, list] = {}
        for plan in plans:
            tiers.setdefault(MAKE_ORDER.get(plan[0].key.bridge, 9), []).append(plan)
        for tier in sorted(tiers):
            self._each(make, tiers[tier])
        if busy:
            result.settled_at = time.monotonic() + max(p[1].settle for p in busy)
            result.made_on = tuple(p[0].dpid for p in busy)
        if steps is not None:
            steps.done("make")
        # several switches changed and something goes: the datapaths stop using what their
        # switches were told to replace (`settle`) before the old path is taken away, and a tier's
        # datapaths stop sending by the old path before the tier outside it takes it away (a ToR
        # must not drop a node's VLAN while the node's datapath still sends on it)
        settle = max((p[1].settle for p in busy), default=0.0) if not whole else 0.0
        breaking = [t for t in sorted(tiers, reverse=True) if any(p[3].breaks() for p in tiers[t])]
        if settle and breaking:
            time.sleep(settle)
            if steps is not None:
                steps.done("settle")
        for tier in sorted(tiers, reverse=True):
            if settle and tier in breaking[1:]:
                time.sleep(settle)
            self._each(break_, tiers[tier])

    def _barriers(self, dpids) -> None:
        """A barrier's round trip to each of these switches (those still connected), side by side:
        each has run its main loop since (`OsKenSession.barrier`). A switch that fails it is left
        to the next pass, which sees its connection gone."""
        def one(dpid) -> None:
            session = self.switches.session(dpid)
            if session is not None:
                try:
                    session.barrier()
                except Exception as e:  # noqa: BLE001 - the switch's health, seen by the next pass
                    LOG.warning("%016x: barrier failed: %s", dpid, e)
        dpids = list(dpids)
        if len(dpids) > 1 and self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="apply")
        futures = [self._pool.submit(one, d) for d in dpids[1:]]
        for d in dpids[:1]:
            one(d)
        for future in futures:
            future.result()

    def _each(self, fn, plans: list) -> None:
        """fn(plan) for every plan, at the same time when there are several switches with changes:
        all but one of those in the pool, the rest on this thread (a hand-over costs more than a
        plan with nothing to send)."""
        others = [p for p in plans if len(p[3])][1:]
        if others and self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="apply")
        futures = [self._pool.submit(fn, plan) for plan in others]
        for plan in plans:
            if not any(plan is o for o in others):
                fn(plan)
        for future in futures:
            future.result()

    def _diff(self, session, desired: SwitchState, audit: bool,
              edit: tuple | None) -> tuple[Change, tuple, tuple | None]:
        """The change that brings a switch to `desired`, what it holds that is not ours, and the
        mirror to update after the change (None: rebuilt from `desired`). A switch whose mirror is
        of the desired state this pass's `edit` started from gets the edit only (its cost follows
        the change, not the switch's flows); any other is diffed whole, against its mirror or what
        it holds read back."""
        known = None if audit else self.known.get(session.dpid)
        # meters are read only where some are wanted or some of ours may be left (ids carry the app)
        meters = session.read_meters() if desired.meters or self._had_meters.get(session.dpid, True) else None
        if known is not None and edit is not None and known[2] is edit[0] and session.dpid in self._foreign:
            _, gone, new = edit
            change = diff(SwitchState(new.flows, new.groups, desired.meters), gone.flows, gone.groups, meters)
            self._count_diff("edit")
            return change, self._foreign[session.dpid], (known[0], known[1], gone, new)
        flows, groups = known[:2] if known is not None else (session.read_flows(), session.read_groups())
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
        def send(c: Change) -> None:
            if half is whole_messages:
                plain, bundled, after = half(session.dp, c)
                session.plain(plain)
                session.bundle(bundled)
                session.plain(after)
                return
            first, second = half(session.dp, c)
            if half is make_messages:
                session.plain(first)
                session.bundle(second)
            else:
                session.bundle(first)
                session.plain(second)
        started = time.monotonic()
        try:
            send(change)
            return set()
        except ApplyError as e:
            owners = {parse_cookie(s.cookie) for s in e.refused}
            if not owners or not session.alive():   # a closing connection refuses nothing in particular
                raise
            LOG.warning("%s: refused %s: %s", res.key, sorted(owners), e)
            for _app, kind, obj in owners:
                result.refused[(kind, obj)] = f"{res.key}: {e}"
            send(change.without(owners))
            return owners
        finally:
            res.apply_seconds += time.monotonic() - started

    def _failed(self, res: SwitchResult, session, e: Exception) -> None:
        LOG.warning("%s: apply failed: %s", res.key, e)
        if isinstance(e, NotRegistered) and session.alive():
            # a connection that just came up, not yet usable for requests: not the switch's fault
            # nor ours; tried again shortly
            res.state = "not connected"
            retry = threading.Timer(0.5, self._event, ("retry",))
            retry.daemon = True
            retry.start()
        elif session.alive():
            res.state = f"error: {e}"
        else:   # the switch went away during the pass: that is its health, not our change
            res.state = lost_state(res.key, self.switches.lost_since(res.dpid) or time.time())
        self.known.pop(res.dpid, None)
        self._had_meters.pop(res.dpid, None)
