"""The reconciler: store → compilers → diff against each switch → atomic apply → object status.

One thread runs passes: on every API change, on every switch (re)connect and every `interval`
seconds. A pass bootstraps the nodes over OVSDB, compiles the desired state of every br-int from
one store snapshot, reads each connected switch's flows and groups, and applies only the
difference. A switch that already holds the desired state is not written at all.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import select

from fathom.controller import switch as sw
from fathom.controller.bootstrap import Bootstrapper
from fathom.model import datapath_id
from fathom.openflow import encode
from fathom.openflow.spec import SwitchState
from fathom.pipeline import stages as st
from fathom.apps.fabric import compiler as fabric
from fathom.apps.tenant.compiler import compile_tenant
from fathom.apps.vtap.compiler import compile_vtap
from fathom.store import models as m
from fathom.store.db import READ_ONLY
from fathom.store.snapshot import Snapshot, load_snapshot

LOG = logging.getLogger("fathom.reconciler")

OUR_APPS = set(st.APPS)
KIND_MODEL = {st.KIND_NETWORK: m.Network, st.KIND_SUBNET: m.Subnet, st.KIND_PORT: m.Port,
              st.KIND_ROUTER: m.Router, st.KIND_ROUTER_INTERFACE: m.Port}


def owned(cookie, group_id: int | None = None) -> bool:
    if group_id is not None:
        return st.parse_group_id(group_id)[0] in OUR_APPS
    return st.parse_cookie(cookie)[0] in OUR_APPS


def compile_all(snapshot: Snapshot) -> dict[str, SwitchState]:
    """Every app's compiler, merged per node. New apps add their compiler here."""
    # issue 7: routers not in distributed mode are hidden from the tenant compiler (tenant_view);
    # the fabric adds its br-int flows (gateway MAC of fabric routers -> VLAN trunk).
    out = compile_tenant(fabric.tenant_view(snapshot))
    for node, extra in fabric.compile_edges(snapshot).items():
        out[node] = out.get(node, SwitchState()) | extra
    for node, extra in compile_vtap(fabric.tenant_view(snapshot)).items():  # vTAP (issue 4)
        out[node] = out.get(node, SwitchState()) | extra
    return out


@dataclass
class NodeResult:
    bootstrap: str = "init"
    reason: str | None = None
    switch: str = "not connected"   # ok | not connected | error: ...
    changes: int = 0
    last_ok: float | None = None


@dataclass
class PassResult:
    nodes: dict[str, NodeResult] = field(default_factory=dict)
    desired: dict[str, SwitchState] = field(default_factory=dict)
    # (kind, object id) -> (status, reason) decided by an extension (e.g. a router in the fabric),
    # written instead of what the br-int flows alone would say
    status_overrides: dict[tuple[int, int], tuple[str, str | None]] = field(default_factory=dict)


class Reconciler:
    def __init__(self, session_factory, app, bootstrapper: Bootstrapper, interval: float = 5.0):
        self.Session = session_factory
        self.app = app
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
        # more switches than the br-ints (issue 7: the fabric), each called in every pass as
        # ext.before_apply(reconciler, snapshot, result) before the br-ints are written, and
        # ext.after_pass(reconciler, snapshot, result) at the end
        self.extensions: list = []
        self._had_meters: dict[int, bool] = {}  # dpid -> desired meters last pass (unknown: read)

    def wake(self, *_args) -> None:
        self._wake.set()

    def switch_changed(self, dpid: int, _datapath=None) -> None:
        """A switch connected or went away: forget what it held, reconcile it in full."""
        self.known.pop(dpid, None)
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

    def run_pass(self, audit: bool = True) -> PassResult:
        """One pass; `audit` reads every switch back instead of trusting what we last applied."""
        with self.lock:
            started = time.monotonic()
            with self.Session() as session:
                session.connection(execution_options=READ_ONLY)
                snapshot = load_snapshot(session)
            result = PassResult()
            ofports = {}
            for node in snapshot.nodes:
                state, reason, ports = self.bootstrapper.run(node)
                result.nodes[node.name] = NodeResult(bootstrap=state, reason=reason)
                ofports[node.name] = ports
            snapshot = snapshot.with_ofports(ofports)
            result.desired = compile_all(snapshot)
            for ext in self.extensions:   # e.g. the fabric: new ToR paths in place before the nodes use them
                try:
                    ext.before_apply(self, snapshot, result)
                except Exception:  # noqa: BLE001
                    LOG.exception("extension %s failed", type(ext).__name__)
            for node in snapshot.nodes:
                res = result.nodes[node.name]
                dp = self.app.datapath(datapath_id(node.id))
                if dp is None:
                    continue
                if res.bootstrap == "error":
                    # without OVSDB we cannot tell the node's ports: leave its flows as they are
                    res.switch = "not reconciled (node bootstrap failed)"
                    continue
                try:
                    res.changes = self.reconcile_switch(dp, result.desired.get(node.name, SwitchState()), audit)
                    res.switch, res.last_ok = "ok", time.time()
                except Exception as e:  # noqa: BLE001 - recorded as the node's status, retried
                    LOG.warning("node %s: apply failed: %s", node.name, e)
                    res.switch = f"error: {e}"
            self._write_status(snapshot, result)
            for ext in self.extensions:
                try:
                    ext.after_pass(self, snapshot, result)
                except Exception:  # noqa: BLE001 - one extension must not break the pass
                    LOG.exception("extension %s failed", type(ext).__name__)
            self.last = result
            self.passes += 1
            self.last_pass_seconds = time.monotonic() - started
            return result

    def reconcile_switch(self, dp, desired: SwitchState, audit: bool = True) -> int:
        known = None if audit else self.known.get(dp.id)
        if known is None:
            known = (sw.read_flows(self.app, dp), sw.read_groups(self.app, dp))
        actual_flows, actual_groups = known
        change = sw.diff(set(desired.flows), set(desired.groups), actual_flows, actual_groups, owned)
        meters = self._meter_change(dp, desired)
        n = sum(len(c) for c in change) + sum(len(c) for c in meters)
        self.known.pop(dp.id, None)
        if meters[0] or meters[1]:   # meters the new flows use exist before the bundle
            sw.apply_plain(self.app, dp, [encode.meter_mod(dp, m, "add") for m in meters[0]]
                           + [encode.meter_mod(dp, m, "modify") for m in meters[1]])
        if sum(len(c) for c in change):
            LOG.info("switch %016x: %d flow puts, %d flow deletes, %d/%d/%d group add/mod/del",
                     dp.id, *map(len, change))
            sw.apply(self.app, dp, sw.messages(dp, *change))
        if meters[2]:                # and go after the flows that used them
            sw.apply_plain(self.app, dp, [encode.meter_mod(dp, m, "delete") for m in meters[2]])
        foreign = {f for f in actual_flows if not owned(f.cookie)}
        foreign_groups = {g for g in actual_groups if not owned(None, group_id=g.group_id)}
        self.known[dp.id] = (set(desired.flows) | foreign, set(desired.groups) | foreign_groups)
        return n

    def _meter_change(self, dp, desired: SwitchState) -> tuple[list, list, list]:
        """Meters are read only where some are wanted or some of ours may be left (ids carry the app)."""
        if not desired.meters and not self._had_meters.get(dp.id, True):
            return [], [], []
        actual = sw.read_meters(self.app, dp)
        change = sw.diff_meters(set(desired.meters), actual, lambda mid: st.parse_group_id(mid)[0] in OUR_APPS)
        self._had_meters[dp.id] = bool(desired.meters)
        return change

    # ---------------------------------------------------------------------------- status

    def _write_status(self, snapshot: Snapshot, result: PassResult) -> None:
        """Each object's status follows the switches that must hold its flows."""
        needs: dict[tuple[int, int], set[str]] = defaultdict(set)
        for node_name, state in result.desired.items():
            for flow in state.flows:
                app, kind, obj = st.parse_cookie(flow.cookie)
                if kind in KIND_MODEL:
                    needs[(kind, obj)].add(node_name)

        def node_problem(name: str) -> tuple[str, str] | None:
            """(status, reason) an object gets from a node that cannot hold its flows yet."""
            r = result.nodes.get(name)
            if r is None:
                return "error", f"unknown node {name}"
            if r.bootstrap == "error":
                return "error", f"node {name}: {r.reason}"
            if r.switch.startswith("error"):
                return "error", f"node {name}: switch {r.switch}"
            if r.switch != "ok":
                return "pending", f"node {name}: switch {r.switch}"
            return None

        with self.Session() as session, session.begin():
            for node in session.scalars(select(m.Node)):
                r = result.nodes.get(node.name)
                if r is None:
                    continue
                if r.bootstrap == "error":
                    _set(node, "error", r.reason, state="error")
                elif r.switch == "ok":
                    _set(node, "active", None, state="complete")
                elif r.switch.startswith("error"):
                    _set(node, "error", r.switch, state="device_created")
                else:
                    _set(node, "pending", "waiting for br-int to connect over OpenFlow", state="device_created")
            for kind, model in KIND_MODEL.items():
                for obj in session.scalars(select(model)):
                    if kind == st.KIND_ROUTER_INTERFACE and obj.router_id is None:
                        continue
                    if kind == st.KIND_PORT and obj.router_id is not None:
                        continue
                    if (kind, obj.id) in result.status_overrides:
                        _set(obj, *result.status_overrides[(kind, obj.id)])
                        continue
                    nodes = needs.get((kind, obj.id), set())
                    problems = sorted(filter(None, (node_problem(n) for n in nodes)))
                    if problems:
                        worst = "error" if any(p[0] == "error" for p in problems) else "pending"
                        _set(obj, worst, "; ".join(p[1] for p in problems))
                    elif nodes:
                        _set(obj, "active", None)
                    elif kind == st.KIND_PORT and obj.node_id is None:
                        _set(obj, "pending", "not bound to a node")
                    elif kind == st.KIND_PORT:
                        _set(obj, "pending", f"waiting for interface {obj.interface_name!r} on its node")
                    else:
                        # nothing to install anywhere yet (e.g. a network with no bound ports)
                        _set(obj, "active", None)


def _set(obj, status: str, reason: str | None, **extra) -> None:
    if obj.status != status or obj.status_reason != reason:
        obj.status, obj.status_reason = status, reason
    for k, v in extra.items():
        if getattr(obj, k) != v:
            setattr(obj, k, v)
