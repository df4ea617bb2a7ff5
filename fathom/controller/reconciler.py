"""The reconciler: model → every app's desired state per switch → diff → make, then break → status.

One thread runs passes: on every API change, on every switch (re)connect and every `interval`
seconds. A pass:

1. takes one snapshot of the store (the model) and adds the switches' runtime facts: each node's
   br-int is bootstrapped over OVSDB (its OpenFlow port numbers come back), then each extension
   `prepare`s its switches (the fabric: ToRs and br-phy, and the ToR port numbers);
2. runs every registered app (fathom.apps) and gets the desired state of every switch: br-int,
   br-phy and ToR alike, keyed by SwitchKey;
3. for every connected switch diffs desired against what it holds (read back, or what it was last
   sent) with one ownership rule (the cookie's app byte), and applies the difference in two halves
   across all switches: first every switch gets what is new (meters, groups, flows; one atomic
   bundle each), then every switch loses what is gone. So no switch stops using a path before
   every switch has the new one: moving a router between modes is make-before-break by
   construction. A switch that already holds its desired state is sent nothing;
4. a refused change marks exactly the objects whose messages the switch refused (by cookie) as
   `error` and the rest of the change is applied without them;
5. extensions run their agents (`after_pass`, e.g. network-node router namespaces) and statuses are
   written (fathom.controller.status, one table of where each kind's status comes from).

Desired state is per switch and, through the cookies, per owning object (fathom.apps.by_owner), so
a later incremental engine can recompile and diff only the owners a change touches.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace

from fathom.apps import BR_INT, BR_PHY, TOR, SwitchKey, compile_all
from fathom.apps.tenant.compiler import refused_ports
from fathom.controller import status
from fathom.controller.bootstrap import Bootstrapper
from fathom.controller.switch import ApplyError, Change, break_messages, diff, make_messages
from fathom.model import Snapshot, datapath_id, datapath_id_phy, datapath_id_tor
from fathom.openflow.spec import SwitchState
from fathom.pipeline import cookies as ck
from fathom.pipeline.cookies import owns_cookie, owns_id, parse_cookie
from fathom.store.db import READ_ONLY
from fathom.store.snapshot import load_snapshot

LOG = logging.getLogger("fathom.reconciler")

# New state goes to the switches nearest the physical network first, old state leaves the edge first.
MAKE_ORDER = {TOR: 0, BR_PHY: 1, BR_INT: 2}


@dataclass
class SwitchResult:
    key: SwitchKey
    dpid: int
    setup: str = "ok"               # the switch's bootstrap (OVSDB): ok | error
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


def compile_switches(snapshot: Snapshot) -> tuple[dict[SwitchKey, SwitchState], dict[int, str]]:
    """The desired state of every switch, and the ports refused: a port bound to one of the
    fabric's own interfaces (refused_ports) is compiled by no app (the tenant compiler refuses it
    itself; a tap policy on it must not copy the tunnel either)."""
    refused = refused_ports(snapshot)
    if refused:
        snapshot = replace(snapshot, ports=tuple(p for p in snapshot.ports if p.id not in refused))
    return compile_all(snapshot), refused


@dataclass
class PassResult:
    nodes: dict[str, NodeResult] = field(default_factory=dict)
    switches: dict[SwitchKey, SwitchResult] = field(default_factory=dict)
    desired: dict[SwitchKey, SwitchState] = field(default_factory=dict)
    # (kind, object id) -> reason: objects whose flows, groups or meters a switch refused
    refused: dict[tuple[int, int], str] = field(default_factory=dict)
    # (kind, object id) -> (status, reason) decided by an agent outside the switches (router namespaces)
    agents: dict[tuple[int, int], tuple[str, str | None]] = field(default_factory=dict)

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


class Reconciler:
    def __init__(self, session_factory, switches, bootstrapper: Bootstrapper, interval: float = 5.0):
        """`switches.session(dpid)` gives a connected switch's session (fathom.controller.switch)."""
        self.Session = session_factory
        self.switches = switches
        self.bootstrapper = bootstrapper
        self.interval = interval
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.last = PassResult()
        self.passes = 0
        self.last_pass_seconds = 0.0
        self.lock = threading.Lock()  # one pass at a time (the loop, or an explicit sync)
        # What each switch holds after our last successful apply: passes woken by API changes diff
        # against it instead of reading every flow back. Dropped on reconnect, failure and audit.
        self.known: dict[int, tuple[set, set]] = {}
        self._had_meters: dict[int, bool] = {}  # dpid -> desired meters last pass (unknown: read)
        # Providers of more switches and agents (the fabric): `prepare(reconciler, snapshot, result)`
        # bootstraps its switches and returns the snapshot with their runtime facts;
        # `after_pass(reconciler, snapshot, result)` runs its agents. They never write flows.
        self.extensions: list = []

    def wake(self, *_args) -> None:
        self._wake.set()

    def switch_changed(self, dpid: int, _datapath=None) -> None:
        """A switch connected or went away: forget what it held, reconcile it in full."""
        self.known.pop(dpid, None)
        self._had_meters.pop(dpid, None)
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run_forever(self) -> None:
        while not self._stop.is_set():
            woken = self._wake.wait(self.interval)
            if woken:
                # let a burst of API writes land in one pass; under a long burst, leave the API at
                # least as much time as a pass takes
                time.sleep(max(0.02, min(1.0, self.last_pass_seconds)))
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.run_pass(audit=not woken)
            except Exception:  # noqa: BLE001 - a broken pass must not end the loop
                LOG.exception("reconcile pass failed")
                time.sleep(1)

    # ---------------------------------------------------------------------------- one pass

    def run_pass(self, audit: bool = True) -> PassResult:
        """One pass; `audit` reads every switch back instead of trusting what we last applied."""
        with self.lock:
            started = time.monotonic()
            with self.Session() as session:
                session.connection(execution_options=READ_ONLY)
                snapshot = load_snapshot(session)
            result = PassResult()
            snapshot = self._prepare(snapshot, result)
            result.desired, refused = compile_switches(snapshot)
            for port_id, reason in refused.items():
                result.refused[(ck.KIND_PORT, port_id)] = reason
            self._apply(snapshot, result, audit)
            for r in result.switches.values():
                if r.key.bridge == BR_INT and r.key.name in result.nodes:
                    n = result.nodes[r.key.name]
                    n.switch, n.changes, n.last_ok, n.apply_seconds = r.state, r.changes, r.last_ok, r.apply_seconds
            for ext in self.extensions:
                try:
                    ext.after_pass(self, snapshot, result)
                except Exception:  # noqa: BLE001 - one extension must not break the pass
                    LOG.exception("extension %s failed", type(ext).__name__)
            status.write(self.Session, snapshot, result)
            self.last = result
            self.passes += 1
            self.last_pass_seconds = time.monotonic() - started
            return result

    def _prepare(self, snapshot: Snapshot, result: PassResult) -> Snapshot:
        """Bootstrap every switch and add their runtime facts (OpenFlow port numbers) to the model."""
        ofports = {}
        for node in snapshot.nodes:
            state, reason, ports = self.bootstrapper.run(node)
            result.nodes[node.name] = NodeResult(bootstrap=state, reason=reason)
            key = SwitchKey(BR_INT, node.name)
            result.switches[key] = SwitchResult(key, datapath_id(node.id), "error" if state == "error" else "ok",
                                                reason)
            ofports[node.name] = ports
        snapshot = snapshot.with_ofports(ofports)
        for ext in self.extensions:
            try:
                snapshot = ext.prepare(self, snapshot, result)
            except Exception:  # noqa: BLE001
                LOG.exception("extension %s failed", type(ext).__name__)
        return snapshot

    def _apply(self, snapshot: Snapshot, result: PassResult, audit: bool) -> None:
        """Diff every connected switch, then make on all of them, then break on all of them."""
        plans = []
        for key in sorted(result.desired, key=lambda k: (MAKE_ORDER.get(k.bridge, 9), k)):
            res = result.switches.get(key)
            if res is None:
                dpid = switch_dpid(key, snapshot)
                if dpid is None:
                    continue
                res = result.switches[key] = SwitchResult(key, dpid)
            if res.setup == "error":
                # without OVSDB we cannot tell the switch's ports (and a userspace OVS whose
                # ovsdb-server is gone does not answer OpenFlow either): leave its flows as they are
                res.state = "not reconciled (bootstrap failed)"
                continue
            session = self.switches.session(res.dpid)
            if session is None:
                since = self.switches.lost_since(res.dpid)
                if since is not None:
                    res.state = lost_state(key, since)
                continue
            desired = result.desired[key]
            try:
                change, foreign = self._diff(session, desired, audit)
            except Exception as e:  # noqa: BLE001 - the switch's state, retried next pass
                self._failed(res, session, e)
                continue
            plans.append((res, session, desired, change, foreign))

        held: dict[int, set] = {}     # dpid -> owners held back after a refusal
        for res, session, desired, change, _ in plans:
            self.known.pop(res.dpid, None)
            if len(change):
                LOG.info("%s %016x: %d flow puts, %d deletes, %d/%d/%d group add/mod/del, %d/%d/%d meter "
                         "add/mod/del", res.key, res.dpid, *map(len, change.__dict__.values()))
            try:
                held[res.dpid] = self._send(res, session, change, make_messages, result)
            except Exception as e:  # noqa: BLE001
                self._failed(res, session, e)
        for res, session, desired, change, foreign in reversed(plans):
            if res.state.startswith(("error", "lost")):
                continue
            owners = held.get(res.dpid, set())
            try:
                owners |= self._send(res, session, change.without(owners), break_messages, result)
            except Exception as e:  # noqa: BLE001
                self._failed(res, session, e)
                continue
            res.changes = len(change)
            res.state, res.last_ok = "ok", time.time()
            self._had_meters[res.dpid] = bool(desired.meters)
            if not owners:
                self.known[res.dpid] = (set(desired.flows) | foreign[0], set(desired.groups) | foreign[1])

    def _diff(self, session, desired: SwitchState, audit: bool) -> tuple[Change, tuple[set, set]]:
        known = None if audit else self.known.get(session.dpid)
        flows, groups = known if known is not None else (session.read_flows(), session.read_groups())
        # meters are read only where some are wanted or some of ours may be left (ids carry the app)
        meters = session.read_meters() if desired.meters or self._had_meters.get(session.dpid, True) else None
        foreign = ({f for f in flows if not owns_cookie(f.cookie)}, {g for g in groups if not owns_id(g.group_id)})
        return diff(desired, flows, groups, meters), foreign

    def _send(self, res: SwitchResult, session, change: Change, half, result: PassResult) -> set:
        """Send one half of a change; on a refusal, mark the refused owners and send the rest without
        them. Returns the owners held back."""
        def send(c: Change) -> None:
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
        if session.alive():
            res.state = f"error: {e}"
        else:   # the switch went away during the pass: that is its health, not our change
            res.state = lost_state(res.key, self.switches.lost_since(res.dpid) or time.time())
        self.known.pop(res.dpid, None)
        self._had_meters.pop(res.dpid, None)
