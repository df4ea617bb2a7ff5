"""The console's change notices: after each reconciler pass, which projects' objects changed.

The reconciler's pass reads the store into a model (a Snapshot) and publishes every object's status
on the status board (fathom.controller.board). The feed keeps the model and statuses of the last
pass it saw; when a pass publishes, and only while a console listens, it compares them with the new
ones (a part of the model left untouched by the pass is the same tuple, and is skipped) and tells
every listener whose project has a changed object (an admin: any change) which kinds changed. A
notice carries no object: the page reads what it shows through the REST API with its own token.

Objects of no project (nodes, fabric switches) are told to admins only. Per listener a notice costs
a set lookup and one small write on its stream (fathom.api.console).

The feed also answers the topology's summary (`summary`, GET /v1/topology) from the same pass: per
node the caller's ports counted by status and, for an admin, the node's health (`node_row`).
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Callable

from fathom.apps import BR_INT, SwitchKey
from fathom.controller.extension import Extension
from fathom.model import Node, Snapshot, datapath_id
from fathom.store.agents import STALE_AFTER

ADMIN = None     # the "project" of objects no project owns: told to admins only

# The model's collections named as the status board's kinds name them.
KIND_FIELD = {"node": "nodes", "network": "networks", "subnet": "subnets", "subnet_dhcp": "subnets",
              "port": "ports", "router": "routers", "router_interface": "router_interfaces",
              "tap_policy": "tap_policies", "floating_ip": "floating_ips", "port_chain": "port_chains",
              "security_group": "security_groups"}
FIELD_KIND = {f: k for k, f in KIND_FIELD.items() if k != "subnet_dhcp"}
# Objects without a project of their own belong to their parent's: field -> (parent field, its id's attribute)
PARENT = {"router_interfaces": ("routers", "router_id"), "router_gateways": ("routers", "router_id"),
          "security_group_rules": ("security_groups", "group_id")}
COLLECTIONS = tuple(f.name for f in dataclasses.fields(Snapshot) if f.name not in ("fabric", "derived"))


class _Index:
    """id -> object per collection of one model, built on first use."""

    def __init__(self, snapshot: Snapshot | None):
        self.snapshot = snapshot
        self._by_id: dict[str, dict] = {}

    def get(self, field: str) -> dict:
        if field not in self._by_id:
            items = getattr(self.snapshot, field, ()) if self.snapshot is not None else ()
            self._by_id[field] = {getattr(o, "id", o): o for o in items}
        return self._by_id[field]

    def project(self, field: str, obj) -> str | None:
        if field in PARENT:
            parent_field, attr = PARENT[field]
            parent = self.get(parent_field).get(getattr(obj, attr, None))
            return getattr(parent, "project_id", ADMIN) if parent is not None else ADMIN
        return getattr(obj, "project_id", ADMIN)


def changes(old: Snapshot | None, new: Snapshot | None, old_statuses: dict, new_statuses: dict) -> dict:
    """project (ADMIN for objects of none) -> the kinds of its objects that changed between two passes
    (added, removed, edited, or a new status)."""
    out: dict[str | None, set[str]] = {}
    before, after = _Index(old), _Index(new)
    for field in COLLECTIONS:
        a = getattr(old, field, ()) if old is not None else ()
        b = getattr(new, field, ()) if new is not None else ()
        if a is b:
            continue
        was, now = before.get(field), after.get(field)
        kind = FIELD_KIND.get(field, field)
        for key in was.keys() | now.keys():
            x, y = was.get(key), now.get(key)
            if x is y or x == y:
                continue
            side, obj = (after, y) if y is not None else (before, x)
            out.setdefault(side.project(field, obj), set()).add(kind)
    if (old.fabric if old is not None else None) != (new.fabric if new is not None else None):
        out.setdefault(ADMIN, set()).add("fabric")
    if old_statuses is not new_statuses:
        for key in old_statuses.keys() | new_statuses.keys():
            if old_statuses.get(key) == new_statuses.get(key):
                continue
            kind, object_id = key
            field = KIND_FIELD.get(kind)
            if field is None:
                out.setdefault(ADMIN, set()).add(kind)
                continue
            side = after if object_id in after.get(field) else before
            obj = side.get(field).get(object_id)
            project = side.project(field, obj) if obj is not None else ADMIN
            out.setdefault(project, set()).add(FIELD_KIND[field])
    return out


def node_row(node: Node, statuses: dict, result, mirror: Callable, heard: Callable, now: float) -> dict:
    """A node as the topology's summary shows it to an admin: its status, its bridges' setup over
    OVSDB, its br-int's connection, its agent (up: heard within STALE_AFTER s), its flows desired
    and installed (the controller's mirror of what br-int holds, `mirror(dpid)`, kept by the
    reconciler and checked against the switch's flow count), in sync when the mirror is of the
    desired state. `result`: the pass's PassResult; `heard(node name)`: when its agent last called."""
    status, reason = statuses.get(("node", node.id), ("pending", None))
    res = result.nodes.get(node.name) if result is not None else None
    switch = result.switches.get(SwitchKey(BR_INT, node.name)) if result is not None else None
    desired = result.br_int(node.name) if result is not None else None
    known = mirror(datapath_id(node.id))
    last = heard(node.name)
    setup = node.state if switch is None else ("error" if switch.setup == "error" else
                                              "complete" if switch.state == "ok" else "device_created")
    return {"id": node.id, "name": node.name, "role": node.role, "tunnel_ip": node.tunnel_ip,
            "status": status, "status_reason": reason, "state": setup,
            "switch": res.switch if res is not None else "not connected",
            "agent": "never reported" if last is None else "up" if now - last <= STALE_AFTER else "down",
            "in_sync": known is not None and desired is not None and known[2] == desired,
            "flows_desired": len(desired.flows) if desired is not None else 0,
            "flows_actual": len(known[0]) if known is not None else None}


def port_counts(model: Snapshot | None, statuses: dict, project: str | None) -> tuple[dict, dict]:
    """(node name -> {status: ports}, {status: unbound ports}) of `project`'s ports (None: all)."""
    nodes: dict[str, dict[str, int]] = {}
    unbound: dict[str, int] = {}
    for p in model.ports if model is not None else ():
        if project is not None and p.project_id != project:
            continue
        status = statuses.get(("port", p.id), ("pending",))[0]
        counts = nodes.setdefault(p.node, {}) if p.node else unbound
        counts[status] = counts.get(status, 0) + 1
    return nodes, unbound


class Listener:
    """One console's stream: its scope (a project, or every project for an admin) and the notices
    not yet sent (`kinds`, set from the reconciler's thread, taken by the stream's task)."""

    def __init__(self, project: str | None, admin: bool):
        self.project, self.admin = project, admin
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()
        self.kinds: set[str] = set()
        self.seq = 0

    def concerned(self, changed: dict) -> set[str]:
        if self.admin:
            return set().union(*changed.values()) if changed else set()
        return changed.get(self.project, set())

    def take(self) -> tuple[int, list[str]]:
        self.event.clear()
        kinds, self.kinds = sorted(self.kinds), set()
        return self.seq, kinds


class ConsoleFeed(Extension):
    """Registered with the reconciler (for each pass's model, `after_pass`) and the status board
    (for its statuses, `published`, called after the pass's statuses are out)."""

    def __init__(self, max_listeners: int = 256, mirror: Callable = lambda dpid: None,
                 heard: Callable = lambda node: None):
        self.max_listeners = max_listeners
        self.mirror, self.heard = mirror, heard     # see node_row
        self._lock = threading.Lock()
        self._listeners: set[Listener] = set()
        self._pass: tuple = (None, None)        # the model and result of the pass now publishing
        self._seen: tuple = (None, {}, None)    # the last published pass: model, statuses, result
        self.seq = 0                            # notices so far

    def after_pass(self, rec, snapshot, result) -> None:
        self._pass = (snapshot, result)

    def summary(self, project: str | None, admin: bool) -> dict:
        """The topology as of the last pass published: per node the caller's ports counted by status
        (an admin: every port, and every node with its health, `node_row`; a member: the nodes its
        ports are on, by name); the ports on no node."""
        model, statuses, result = self._seen
        counts, unbound = port_counts(model, statuses, None if admin else project)
        if admin:
            now = time.time()
            nodes = [{**node_row(n, statuses, result, self.mirror, self.heard, now), "ports": counts.get(n.name, {})}
                     for n in (model.nodes if model is not None else ())]
        else:
            nodes = [{"name": name, "ports": c} for name, c in sorted(counts.items())]
        return {"nodes": nodes, "unbound_ports": unbound}

    def published(self, statuses: dict) -> None:
        model, result = self._pass
        (old, old_statuses, _), self._seen = self._seen, (model, statuses, result)
        with self._lock:
            listeners = list(self._listeners)
        if not listeners:
            return
        changed = changes(old, model, old_statuses, statuses)
        if not changed:
            return
        self.seq += 1
        for listener in listeners:
            kinds = listener.concerned(changed)
            if kinds:
                try:
                    listener.loop.call_soon_threadsafe(self._tell, listener, self.seq, kinds)
                except RuntimeError:   # its loop is closed: it is gone
                    self.leave(listener)

    @staticmethod
    def _tell(listener: Listener, seq: int, kinds: set[str]) -> None:
        listener.seq = seq
        listener.kinds |= kinds
        listener.event.set()

    def listen(self, project: str | None, admin: bool) -> Listener | None:
        """A new listener (in the event loop), or None when MAX listeners are open."""
        with self._lock:
            if len(self._listeners) >= self.max_listeners:
                return None
            listener = Listener(project, admin)
            self._listeners.add(listener)
            return listener

    def leave(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.discard(listener)

    def listening(self) -> int:
        return len(self._listeners)
