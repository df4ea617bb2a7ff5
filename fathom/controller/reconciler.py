"""The reconciler's loop: model → every app's desired state per switch → diff → make, then break → status.

One thread runs passes, woken by events only: an API write, an OVSDB change of a node (an interface
plugged, unplugged or renumbered; a bridge or controller changed), an OpenFlow port-status or a
switch (re)connecting. Nothing runs at rest but a cheap periodic check (each switch's flow
count against what we installed, each node's OVSDB replica against the port numbers we
compiled with) and, rarely, an audit reading a few switches back in turn (AUDIT_FLOWS); whatever
they find is logged and counted and repaired by a pass. Changes that arrive while a pass runs are
coalesced into the next one, which in a sustained burst starts after a pause (`burst_pause`: at
least as long as that pass and BURST_PERIOD after its start; none when a switch connected or became
this replica's meanwhile). In a cluster, a write that cannot change a switch this replica sets up
wakes no pass: the next one reads it, within DEFER (fathom.controller.cluster.ClusterMember.wakes_for).
A pass only orchestrates the parts that do the work:

1. it reads again the parts of the store the API wrote since the last pass (fathom.store.changes;
   the whole store on the first pass, an explicit sync and the audit), and adds the switches'
   runtime facts: a node whose OVSDB reported a bridge change (or that is new, or failed) is
   re-checked over OVSDB (fathom.controller.setups); the others' OpenFlow port numbers come from
   the OVSDB replica, with no round trip; then each extension `prepare`s its switches (the fabric:
   fabric switches and br-phy, and the fabric switch port numbers), re-checking only what changed (`setup_due`);
2. the desired state compiles what changed (fathom.controller.desired.DesiredState);
3. the switches it considers (`switches_to_reconcile`) are diffed and sent their changes, make on
   every switch before break on any (fathom.controller.apply.Applier); a refused change marks
   exactly the objects whose messages a switch refused as `error`;
4. extensions run their agents (`after_pass`, e.g. network-node router namespaces) and statuses
   are decided, written and published (fathom.controller.statuses.StatusWriter).

With `check_incremental` (on in the test suite) every pass also checks each part against a
computation from scratch: the desired state against a whole compile, every change from an edit
against a whole diff of the mirror, the statuses against a whole decision; and a pass that read
deferred writes alone must change no switch this replica masters.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

from fathom.apps import BR_INT, SwitchKey
from fathom.controller.apply import Applier
from fathom.controller.board import StatusBoard
from fathom.controller.bootstrap import OVSDB_PORT
from fathom.controller.desired import DesiredState
from fathom.controller.extension import Extension, NoBootstrap, NodeBootstrap
from fathom.controller import memory
from fathom.controller.metrics import METRICS
from fathom.controller.results import NodeResult, PassResult, SwitchResult
from fathom.controller.setups import Setups
from fathom.controller.statuses import StatusWriter
from fathom.controller.storeread import StoreReads
from fathom.model import Snapshot, datapath_id
from fathom.pipeline import cookies as ck

LOG = logging.getLogger("fathom.reconciler")

# Flows the periodic audit reads back, switch by switch in turn: an audit takes the next switches
# until their desired flows reach this (one switch at least), so a fabric of a hundred switches
# (1.4 million flows at 100 ports a node: 85 s of read-back at once) waits a few seconds for it
# at most; a lab's switches are all read back by every audit.
AUDIT_FLOWS = 20_000
# In a sustained burst (changes arrived while each of the last BURST_PASSES passes ran) a pass starts
# BURST_PERIOD seconds after the one before started at the soonest, and waits at least as long as
# the last one took, at most BURST_PAUSE (`burst_pause`): the burst is coalesced into fewer, larger
# passes, so that what a pass costs whatever its size (the store's read, the statuses' write, the
# compile's own work: a few ms of CPU with a network of 2,000 ports) is paid for more changes (a
# pause as long as the pass alone runs cheaper passes more often, which takes their saving back),
# and the API threads, which share the interpreter with the passes, are not starved. A change after
# a quiet moment, or the one or two that make a port up (its API call, its VIF), is reconciled at
# once; so is a switch that (re)connected or whose master role this replica gained (a switch nobody
# writes to waits for nothing: the pause ends when it comes).
BURST_PASSES = 2
BURST_PERIOD = 0.06
BURST_PAUSE = 0.25
# A switch's flows outlive its controller (fail-mode secure), and OVS reconnects within its backoff
# (8 s at most by default). For this long after the controller starts, while a switch has not
# connected yet, the statuses in the store (the last controller's word) stand: a restart does not
# turn every object at home there `pending` (and a Neutron port DOWN) for those seconds. Nor, while
# a node's OVSDB has not been read yet (its br-int is left alone meanwhile: see `_prepare`).
STARTUP_GRACE = 15.0
# In a cluster, a write that cannot change a switch this replica sets up (a port's on another
# replica's node: fathom.controller.cluster.ClusterMember.wakes_for) wakes no pass: the next pass
# reads it, and one runs at most this many seconds after the first such write (`defer_store`).
DEFER = 0.25


def burst_pause(last: float) -> float:
    """The pause before a pass in a sustained burst, the last pass having taken `last` seconds."""
    return min(max(last, BURST_PERIOD - last), BURST_PAUSE)


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
    setup: set = field(default_factory=set)      # node / fabric switch names whose bridges must be re-checked
    ports: set = field(default_factory=set)      # node names whose interfaces changed
    seq: int = 0                                 # API writes requested so far (status board)
    elsewhere: bool = False                      # read the store whole (changed_elsewhere)
    triggers: set = field(default_factory=set)
    since: float | None = None                   # monotonic time of the first of these events
    deferred: set = field(default_factory=set)   # nodes whose interfaces changed, no pass woken (cluster)
    store_later: bool = False                    # store writes with no pass woken, due within DEFER (cluster)
    store_events: int = 0                        # store events that woke a pass so far (model_current)


class Reconciler:
    """The loop: takes events, runs passes over the desired state (`desired`), the switches
    (`applier`) and the statuses (`statuses`), and the periodic check and audit."""

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
        (fathom.controller.memory; the controller's process, not a test's), after a pass at most
        every `freeze_every` seconds and when the loop goes quiet."""
        self.Session = session_factory
        self.freeze_memory = freeze_memory
        self.freeze_every = memory.FREEZE_EVERY
        self._frozen_at = -memory.FREEZE_EVERY    # monotonic time of the last freeze
        self._freeze_due = False           # a pass ran since
        # after an API write only the parts of the store whose tables were written are read again
        self.store = StoreReads(session_factory)
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
        self._switch_due = threading.Event()   # a switch (re)connected or gained: no burst pause
        self._events_lock = threading.Lock()
        self._events = _Events(store=True, triggers={"start"})
        self.last = PassResult()
        self.passes = 0
        self.last_pass_seconds = 0.0
        # step -> seconds: the last pass's steps (`steps_total`: summed over every pass), /v1/health
        self.last_pass_steps: dict[str, float] = {}
        self.steps_total: dict[str, float] = {}
        self.lock = threading.Lock()  # one pass at a time (the loop, or an explicit sync)
        # providers of more switches and agents (the fabric, external gateways, host-local status)
        self.extensions: list[Extension] = []
        # the parts a pass runs, each kept across passes
        self.desired = DesiredState(self.check_incremental)
        self.applier = Applier(switches, self._drift, lambda: self._event("retry"), self.check_incremental)
        self.statuses = StatusWriter(session_factory, self.board, self.store.reader, self.applier.barriers,
                                     self.desired.statuses_decided, time.monotonic() + startup_grace,
                                     self.check_incremental)
        self.store_model: Snapshot | None = None
        self.model: Snapshot | None = None            # the last compiled model (store + runtime facts)
        self._setup_due: set[str] = set()             # names whose bridges this pass re-checks
        self._checked_all = True                      # this pass re-checks every bridge
        self.drift: dict[str, int] = {}               # source -> count (also in /metrics)
        self._setups = Setups(lambda node: self.bootstrapper.run(node),
                               lambda name: self._event("ovsdb", setup=name, ports=name))
        self._next_check = time.monotonic() + interval
        self._next_audit = time.monotonic() + self.audit_interval
        self._audited_last: SwitchKey | None = None    # the last switch the periodic audit read back
        self._busy = 0                                # passes in a row that found changes waiting
        # this replica's part in a cluster (fathom.controller.cluster.ClusterMember); None: alone
        self.cluster = None
        # with a change feed (a cluster, API workers): () -> the other processes' writes a store
        # read now reads (fathom.cluster.feed.Claim); `_claim`: the last store read's
        self.claims = None
        self._claim = None
        self.defer = DEFER
        self._store_events = 0        # store events that woke a pass so far
        self._compiled_events = 0     # those the last pass's model had read
        # check_incremental: passes that read only deferred writes and changed a switch this
        # replica masters (ClusterMember.wakes_for let a write through that it should not have)
        self.defer_mismatches = 0

    @property
    def results(self) -> dict[SwitchKey, SwitchResult]:
        """Every switch as the last pass left it."""
        return self.applier.results

    @property
    def store_reads(self) -> int:
        """Store reads so far (for extensions that keep reads of their own: StoreReads)."""
        return self.store.reads

    @property
    def store_written(self) -> set | None:
        """The tables the last store read read again (None: the whole store)."""
        return self.store.written

    @property
    def mismatches(self) -> int:
        """check_incremental failures of every part (must stay 0)."""
        return self.desired.mismatches + self.applier.mismatches + self.statuses.mismatches + self.defer_mismatches

    # ---------------------------------------------------------------------------- events

    def _event(self, trigger: str, store: bool = False, setup: str | None = None, ports: str | None = None,
               seq: bool = False) -> None:
        if seq:   # first: a pass that takes this event covers the write
            self.board.request()
        with self._events_lock:
            ev = self._events
            ev.store |= store
            if store:
                self._store_events += 1
            if setup:
                ev.setup.add(setup)
            if ports:
                ev.ports.add(ports)
            ev.triggers.add(trigger)
            if ev.since is None:
                ev.since = time.monotonic()
        self._wake.set()

    def wake(self, *_args) -> None:
        """The store changed (an API write): reload it and reconcile what it changed; in a cluster,
        at once only if the write may change a switch this replica sets up
        (ClusterMember.wakes_for_own), else within `defer` seconds (`defer_store`)."""
        if self.cluster is not None and not self.cluster.wakes_for_own():
            self.board.request()
            self.defer_store()
            return
        self._event("api", store=True, seq=True)

    def defer_store(self) -> None:
        """A committed write needs no pass now: the next pass reads it, and one runs within `defer`
        seconds of the first such write (coalesced: one pass for all of them)."""
        with self._events_lock:
            ev = self._events
            first, ev.store_later = not ev.store_later, True
        if first:
            timer = threading.Timer(self.defer, self._deferred_due, (ev,))
            timer.daemon = True
            timer.start()

    def _deferred_due(self, ev: "_Events") -> None:
        with self._events_lock:
            if self._events is not ev:    # a pass took them meanwhile, and read the store
                return
        self._event("deferred", store=True)

    def model_current(self) -> bool:
        """Whether the model the last pass compiled read every store write that woke a pass (none
        is waiting for a pass, or being read by one)."""
        with self._events_lock:
            return self._store_events == self._compiled_events

    def changed_elsewhere(self) -> None:
        """Writes may have been missed, or statuses another replica wrote are this one's to write
        from now on: read the whole store."""
        with self._events_lock:
            self._events.elsewhere = True
        self._event("feed", store=True)

    def written_elsewhere(self, written: set | None = None) -> None:
        """Another process committed a write, which this process's table notes already count
        (the change feed: fathom.cluster.feed.follow; `written`: the tables and row tokens it
        names): read what it changed; in a cluster, at once only if it may change a switch this
        replica sets up (ClusterMember.wakes_for), else within `defer` seconds."""
        if self.cluster is not None and written is not None and not self.cluster.wakes_for(written):
            self.defer_store()
            return
        self._event("feed", store=True)

    def reported_elsewhere(self) -> None:
        """Another replica's report on the switches it masters changed: decide the statuses again."""
        self._event("cluster")

    def ovsdb_changed(self, name: str, what: str) -> None:
        """A node's (or fabric switch's) OVSDB changed: "ports" (interfaces) or "setup" (bridges).
        In a cluster, a node's interfaces matter now only to the replica that masters its switches
        (it compiles and writes what they hold, and the statuses of its ports): any other replica
        takes them with its next pass, which reads every node's interfaces from its OVSDB replica
        anyway, without waking for them (`deferred`)."""
        if what == "setup":
            self._event("ovsdb", setup=name, ports=name)
        elif self.cluster is not None and not self.cluster.concerns(name):
            with self._events_lock:
                self._events.deferred.add(name)
        else:
            self._event("ovsdb", ports=name)

    def port_status(self, dpid: int) -> None:
        """An OpenFlow port-status from a switch: its ports changed (OVSDB says which). Not for a
        node's br-int whose OVSDB replica holds the port numbers the last pass compiled with: the
        replica's own notification of the change wakes a pass (it comes before or after this
        message), and the pass this one would wake finds nothing to do. Nor, in a cluster, for a
        switch another replica masters (see ovsdb_changed)."""
        key = next((k for k, r in self.results.items() if r.dpid == dpid), None)
        if key is not None and key.bridge == BR_INT and self._compiled_with_replica(key.name):
            return
        if self.cluster is not None and (self.cluster.elsewhere(dpid)
                                         or key is not None and not self.cluster.concerns(key.name)):
            return   # another replica masters it: its OVSDB tells the change, taken by the next pass
        self._event("port-status", ports=key.name if key is not None else None)

    def _compiled_with_replica(self, name: str) -> bool:
        model = self.model
        node = next((n for n in model.nodes if n.name == name), None) if model is not None else None
        got = self.bootstrapper.current(node) if node is not None else None
        return got is not None and dict(got[2]) == dict(node.ofports)

    def recheck_setup(self, name: str) -> None:
        """Node `name`'s bridges are checked (and set up) again by the next pass."""
        self._event("setup", setup=name)

    def switch_changed(self, dpid: int, _datapath=None) -> None:
        """A switch connected or went away (or, in a cluster, became this replica's): forget what
        it held, check its node's (or fabric switch's) bridges again, reconcile it in full."""
        self.applier.forget(dpid)
        name = next((k.name for k, r in self.last.switches.items() if r.dpid == dpid), None)
        self._event("switch", setup=name)
        self._switch_due.set()

    def stop(self) -> None:
        self._stop.set()
        self._switch_due.set()
        self._wake.set()
        self._setups.stop()

    def _take_events(self) -> _Events:
        with self._events_lock:
            ev, self._events = self._events, _Events()
            self._wake.clear()
            self._switch_due.clear()
            ev.store |= ev.store_later
            ev.store_events = self._store_events
        ev.seq = self.board.requested
        return ev

    def setup_due(self, name: str) -> bool:
        """Whether this pass re-checks the bridges of a node or fabric switch (for extensions' `prepare`)."""
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
                    if self._busy >= BURST_PASSES:   # a sustained burst: see BURST_PERIOD
                        self._switch_due.wait(burst_pause(self.last_pass_seconds))
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
        """The cheap periodic check: every node's OVSDB replica (in a cluster, those of the nodes this
        replica sets up or masters: ClusterMember.checks) against the port numbers we compiled
        with, every known switch's flow count against what we installed (one aggregate-stats round
        trip: its cost does not grow with the tenant; groups and changed actions are the audit's).
        Whatever differs is logged, counted and repaired by a pass; nodes and switches in trouble
        are retried. Returns whether a pass was asked for."""
        with self.lock:
            return self._check()

    def _check(self) -> bool:
        found = False
        with self._events_lock:
            deferred = set(self._events.deferred)    # interfaces changed, for the next pass: no drift
        if self.statuses.held and time.monotonic() >= self.statuses.grace_ends:
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
            if self.cluster is not None and not self.cluster.checks(node):
                continue      # another replica's node (see ClusterMember.checks)
            got = self.bootstrapper.current(node)
            if got is None:   # its OVSDB connection is down: the node's status
                self._event("check", setup=node.name, ports=node.name)
                found = True
            elif got is not None and dict(got[2]) != dict(node.ofports) and node.name not in deferred:
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
        counted = []     # every switch's flow count is asked at once (Applier.checks)
        for key, res in list(self.results.items()):
            if res.setup == "error":
                if self._setups.due(key.name):
                    self._event("retry", setup=key.name)
                    found = True
                continue
            counted.append(res)
        for trigger in self.applier.checks(counted):
            if trigger is not None:
                self._event(trigger)
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
            desired = self.desired.states.get(key)
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
            heard_at, heard = self.board.take_heard()    # statuses other replicas wrote meanwhile
            if heard:
                self.store.reader.statuses_written(heard)
            if ev.store or whole:
                if self.claims is not None:   # before the read: the feed's writes it reads (Claim)
                    self._claim = self.claims()
                self.store_model = self.store.read(whole or ev.elsewhere)
            steps.done("read")
            result = PassResult()
            self._checked_all = whole or self.model is None
            self._setup_due = ev.setup
            snapshot = self._prepare(self.store_model, result)
            steps.done("prepare")
            changed = self.desired.update(snapshot, full=audit)
            steps.done("compile")
            result.desired = dict(self.desired.states)
            result.needs = self.desired.needs()
            result.needs_changed = self.desired.needs_changed
            result.views = self.desired.views
            for port_id, reason in self.desired.refused.items():
                result.refused[(ck.KIND_PORT, port_id)] = reason
            steps.done("needs")
            reconciled = self.switches_to_reconcile(result)
            if self.check_incremental and ev.triggers == {"deferred"} and changed & reconciled:
                self.defer_mismatches += 1
                LOG.error("check_incremental: a pass of deferred writes only changed %s, which this replica "
                          "masters: the write should have woken it (ClusterMember.wakes_for)",
                          ", ".join(map(str, sorted(changed & reconciled))))
            self.applier.apply(snapshot, result, reconciled, changed, self.desired.edits,
                               audit, read_back or frozenset(), steps)
            steps.done("break")
            self._ovsdb_lost_meanwhile(snapshot, result)
            for key, owners in self.applier.refused_at.items():
                if key in reconciled:
                    result.refused.update(owners)
            if self.cluster is not None:
                self.cluster.report(result, self.applier.refused_at)
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
                self.statuses.write(snapshot, result, self.store.stored if ev.store else None, ev.seq, steps,
                                    heard_at, self._claim)
            self.model = snapshot
            with self._events_lock:
                self._compiled_events = ev.store_events
            self.last = result
            # what the pass replaced (the switches' states before it) is freed now that the
            # statuses are out, not at the start of the next pass's compile: at 100 nodes x 100
            # ports a port's pass replaces every switch's state (mostly edits chained on a whole
            # set, see _Edited; the sets themselves when a chain is made whole)
            self.desired.release_edits()
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

    def switches_to_reconcile(self, result: PassResult) -> set[SwitchKey]:
        """The switches this pass diffs and sends their changes: every switch with a desired
        state; in a cluster, only those this replica is master of (a switch another replica
        masters is as its master reports it: its state, and the objects it refused)."""
        if self.cluster is None:
            return set(result.desired)
        keep = set()
        for key in result.desired:
            res = result.switches.get(key)
            if res is None or res.dpid is None:
                continue
            if self.cluster.masters(res.dpid):
                keep.add(key)
            elif self.cluster.elsewhere(res.dpid) and res.setup == "ok":
                res.state, refused = self.cluster.reported(res.dpid)
                result.refused.update(refused)
        return keep

    def _freeze(self) -> None:
        memory.freeze()
        self._frozen_at, self._freeze_due = time.monotonic(), False

    def _nothing_new(self, ev: _Events, result: PassResult) -> bool:
        """Whether a pass woken only by a node's interfaces (OVSDB, port-status) found nothing a
        status depends on: the model compiled as before (only interfaces no object names changed,
        see compiles_the_same), and every node and switch is as the last pass left it."""
        if ev.store or ev.setup or not ev.triggers or not ev.triggers <= {"ovsdb", "port-status"}:
            return False
        if not self.desired.compiled_nothing or self.statuses.held:
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

    def _prepare(self, snapshot: Snapshot, result: PassResult) -> Snapshot:
        """Add the switches' runtime facts (OpenFlow port numbers) to the model: from the OVSDB
        replica, or by re-checking the node's bridges where due (new, failed, changed, audit)."""
        def trusted(node) -> bool:   # set up, and nothing says its bridges changed
            # as the last pass found it, whether or not that pass reconciled its br-int (in a
            # cluster, another replica's node is read from the OVSDB replica too, not checked
            # again by every pass)
            prior = self.last.switches.get(SwitchKey(BR_INT, node.name))
            return not self.setup_due(node.name) and prior is not None and prior.setup == "ok"
        in_error = {name for name, n in self.last.nodes.items() if n.bootstrap == "error"}
        answers, checked = self._setups.answers(snapshot.nodes, trusted, self.bootstrapper.current, in_error)
        self._setup_due |= checked
        compiled_with = {n.name: dict(n.ofports) for n in self.model.nodes} if self.model is not None else {}
        ofports = {}
        for node in snapshot.nodes:
            answer = answers.get(node.name)
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
