"""The console's change notices: after each reconciler pass, what changed, object by object.

The reconciler's pass reads the store into a model (a Snapshot) and publishes every object's status
on the status board (fathom.controller.board). The feed keeps the model and statuses of the last
pass it saw; when a pass publishes, and only while a console listens, it compares them with the new
ones (a part of the model left untouched by the pass is the same tuple, and is skipped; in a
collection that kept its length, only the objects that are not the same) and finds the objects
that changed: their kind, id and project. It reads them from the store once, as the API answers
them (`read`, fathom.api.console.read_objects; an object the store no longer holds is a deletion),
and encodes one `change` event per project: {seq, changes: [{kind, id, object} or {kind, id,
deleted: true}]}, a port's change also with `was` and `now`, its {node, status} in the last pass and
this one (what the topology's counts per node follow). Every listener of a project gets those same
bytes (an admin: every project's, and the nodes' and fabric switches', which are told to admins
only), so a console costs the controller a dictionary lookup and a write of bytes already made. A
pass that changed more than MAX_CHANGES objects sends `refresh` instead (the page reads everything
again), and so does a listener that fell MAX_BEHIND bytes behind (a console that does not read).
The reads and encoding run on the feed's own thread, in pass order, not the reconciler's.

A node's change carries the node as the topology's summary shows it (`node_row`: its health); the
feed also answers that summary (`summary`, GET /v1/topology): per node the caller's ports counted
by status as of the last pass, with that pass's `seq` (a notice of that pass or before is in it),
and the caller's networks and routers counted by status (a page lists them when they are few).
Before the first pass publishes (a controller's startup grace) it counts the last pass's model with
no statuses (every port `pending`), and that first publish tells every console `refresh`.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from fathom.api.console import event
from fathom.apps import BR_INT, SwitchKey
from fathom.controller.extension import Extension
from fathom.model import Node, Snapshot, datapath_id
from fathom.store.agents import STALE_AFTER

ADMIN = None     # the "project" of objects no project owns: told to admins only
MAX_CHANGES = 500          # objects in one pass's notice; more: `refresh`
MAX_BEHIND = 4 << 20       # bytes a listener may have waiting; more: its notices dropped, `refresh`

# model collection -> (the API kind of its objects, fn(object) -> other (kind, id) its change touches)
FIELDS = {
    "networks": ("network", lambda o: ()),
    "subnets": ("subnet", lambda o: (("network", o.network_id),)),     # the network lists its subnets
    "ports": ("port", lambda o: ()),
    "routers": ("router", lambda o: ()),
    "router_interfaces": ("port", lambda o: (("router", o.router_id),)),   # a port the router lists
    "router_gateways": (None, lambda o: (("router", o.router_id),)),
    "tap_policies": ("tap_policy", lambda o: ()),
    "security_groups": ("security_group", lambda o: ()),
    "security_group_rules": (None, lambda o: (("security_group", o.group_id),)),
    "port_pairs": ("port_pair", lambda o: ()),
    "port_pair_groups": ("port_pair_group", lambda o: ()),
    "flow_classifiers": ("flow_classifier", lambda o: ()),
    "port_chains": ("port_chain", lambda o: ()),
    "floating_ips": ("floating_ip", lambda o: ()),
}
# a status's kind -> the model collection of its object
STATUS_FIELD = {"network": "networks", "subnet": "subnets", "subnet_dhcp": "subnets", "port": "ports",
                "router": "routers", "router_interface": "router_interfaces", "tap_policy": "tap_policies",
                "floating_ip": "floating_ips", "port_chain": "port_chains", "security_group": "security_groups",
                "port_pair": "port_pairs", "port_pair_group": "port_pair_groups",
                "flow_classifier": "flow_classifiers"}
# Objects without a project of their own belong to their parent's: field -> (parent field, its id's attribute)
PARENT = {"router_interfaces": ("routers", "router_id"), "router_gateways": ("routers", "router_id"),
          "security_group_rules": ("security_groups", "group_id")}


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


def _differing(a: tuple, b: tuple, before: _Index, after: _Index, field: str) -> list[tuple]:
    """(old, new) of each object that differs between two versions of a collection (None: absent)."""
    if len(a) == len(b):     # edits only, most often: the objects not the same, in place
        pairs = [(x, y) for x, y in zip(a, b) if x is not y]
        if all(getattr(x, "id", x) == getattr(y, "id", y) for x, y in pairs):
            return [(x, y) for x, y in pairs if x != y]
    was, now = before.get(field), after.get(field)
    return [(was.get(k), now.get(k)) for k in was.keys() | now.keys()
            if was.get(k) is not now.get(k) and was.get(k) != now.get(k)]


def changes(old: Snapshot | None, new: Snapshot | None, old_statuses: dict,
            new_statuses: dict) -> tuple[dict, dict]:
    """(kind, id) -> project (ADMIN for objects of none) of the objects that changed between two
    passes (added, removed, edited, or a new status), as the API names them (nodes are not in it:
    see node_row); and port id -> its {node, status} in each pass (None: not in it) of the
    workload ports among them."""
    out: dict[tuple[str, int], str | None] = {}
    ports: dict[int, tuple] = {}      # port id -> (old, new) of the edited ports
    before, after = _Index(old), _Index(new)
    for field, (kind, touches) in FIELDS.items():
        a = getattr(old, field, ()) if old is not None else ()
        b = getattr(new, field, ()) if new is not None else ()
        if a is b:
            continue
        for x, y in _differing(a, b, before, after, field):
            side, obj = (after, y) if y is not None else (before, x)
            if field == "ports":
                ports[obj.id] = (x, y)
            project = side.project(field, obj)
            for key in ([(kind, obj.id)] if kind else []) + list(touches(obj)):
                out[key] = project
    old_fabric = old.fabric if old is not None else None
    new_fabric = new.fabric if new is not None else None
    if old_fabric != new_fabric:    # fabric switches, their links, router modes
        for f in (old_fabric, new_fabric):
            for s in f.switches if f is not None else ():
                out["fabric_switch", s.id] = ADMIN
            for md in f.modes if f is not None else ():
                router = after.get("routers").get(md.router_id) or before.get("routers").get(md.router_id)
                out["router", md.router_id] = getattr(router, "project_id", ADMIN)
    if old_statuses is not new_statuses:
        for (kind, object_id), _ in new_statuses.items() ^ old_statuses.items():
            if kind == "fabric_switch":
                out[kind, object_id] = ADMIN
            field = STATUS_FIELD.get(kind)
            if field is None:
                continue
            side = after if object_id in after.get(field) else before
            obj = side.get(field).get(object_id)
            project = side.project(field, obj) if obj is not None else ADMIN
            api_kind, touches = FIELDS[field]
            for key in [(api_kind or kind, object_id), *(touches(obj) if obj is not None else ())]:
                out[key] = project

    def place(port, statuses: dict) -> dict | None:
        return None if port is None else {"node": port.node, "status": statuses.get(("port", port.id), ("pending",))[0]}
    places = {}
    for kind, object_id in out:
        if kind == "port":
            x, y = ports.get(object_id) or (before.get("ports").get(object_id), after.get("ports").get(object_id))
            if x is not None or y is not None:
                places[object_id] = (place(x, old_statuses), place(y, new_statuses))
    return out, places


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


# the model's collections the topology's summary counts by status (the page lists them when few)
COUNTED = {"networks": "network", "routers": "router"}


def status_counts(model: Snapshot | None, statuses: dict, field: str, project: str | None) -> dict[str, int]:
    """{status: objects} of a collection, `project`'s (None: all; a member also counts the external
    networks, which the API lists to every project)."""
    counts: dict[str, int] = {}
    for o in getattr(model, field, ()) if model is not None else ():
        if project is not None and o.project_id != project and not getattr(o, "external", False):
            continue
        status = statuses.get((COUNTED[field], o.id), ("pending",))[0]
        counts[status] = counts.get(status, 0) + 1
    return counts


class Listener:
    """One console's stream: its scope (a project, or every project for an admin) and the bytes of
    the notices not yet sent (`chunks`, added in its event loop from the feed's thread, taken by the
    stream's task); `behind` once they would exceed MAX_BEHIND."""

    def __init__(self, project: str | None, admin: bool):
        self.project, self.admin = project, admin
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()
        self.chunks: list[bytes] = []
        self.waiting = 0
        self.behind = False

    def add(self, chunks: list[bytes]) -> None:
        size = sum(map(len, chunks))
        if self.behind or self.waiting + size > MAX_BEHIND:
            self.behind, self.chunks, self.waiting = True, [], 0
        else:
            self.chunks += chunks
            self.waiting += size
        self.event.set()

    def take(self) -> tuple[bool, bytes]:
        """(whether it fell behind, the bytes to send)."""
        self.event.clear()
        behind, chunks = self.behind, self.chunks
        self.behind, self.chunks, self.waiting = False, [], 0
        return behind, b"".join(chunks)


class ConsoleFeed(Extension):
    """Registered with the reconciler (for each pass's model, `after_pass`) and the status board
    (for its statuses, `published`, called after the pass's statuses are out). `read(keys)`: the
    objects of those (kind, id) as the API answers them (fathom.api.console.read_objects)."""

    def __init__(self, max_listeners: int = 256, mirror: Callable = lambda dpid: None,
                 heard: Callable = lambda node: None, read: Callable = lambda keys: {}):
        self.max_listeners = max_listeners
        self.mirror, self.heard, self.read = mirror, heard, read    # see node_row
        self._lock = threading.Lock()
        self._listeners: set[Listener] = set()
        self._pass: tuple = (None, None)        # the model and result of the pass now publishing
        self._seen: tuple = (None, {}, None, 0)  # the last published pass: model, statuses, result, seq
        self._rows: dict[str, dict] | None = None   # node rows as last told (None: not kept, no listener)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="console-feed")
        self.seq = 0                            # passes published so far

    def after_pass(self, rec, snapshot, result) -> None:
        self._pass = (snapshot, result)

    def summary(self, project: str | None, admin: bool) -> dict:
        """The topology as of the last pass published (`seq`): per node the caller's ports counted by
        status (an admin: every port, and every node with its health, `node_row`; a member: the
        nodes its ports are on, by name); the ports on no node."""
        model, statuses, result, seq = self._seen
        if model is None:    # no pass published yet (a controller's startup grace): the last pass's model
            (model, result), statuses = self._pass, {}
        counts, unbound = port_counts(model, statuses, None if admin else project)
        if admin:
            now = time.time()
            nodes = [{**node_row(n, statuses, result, self.mirror, self.heard, now), "ports": counts.get(n.name, {})}
                     for n in (model.nodes if model is not None else ())]
        else:
            nodes = [{"name": name, "ports": c} for name, c in sorted(counts.items())]
        return {"seq": seq, "nodes": nodes, "unbound_ports": unbound,
                **{field: status_counts(model, statuses, field, None if admin else project) for field in COUNTED}}

    def published(self, statuses: dict) -> None:
        model, result = self._pass
        self.seq += 1
        old, old_statuses, _, _ = self._seen
        self._seen = (model, statuses, result, self.seq)
        with self._lock:
            listeners = list(self._listeners)
        if not listeners:
            self._rows = None
            return
        changed, places = changes(old, model, old_statuses, statuses)
        rows, old_rows = self._node_rows(model, statuses, result), self._rows
        self._rows = rows
        nodes = [(("node", r["id"]), r) for name, r in rows.items() if old_rows is None or old_rows.get(name) != r]
        nodes += [(("node", r["id"]), None) for name, r in (old_rows or {}).items() if name not in rows]
        if not changed and not nodes:
            return
        # the first pass published: the summaries answered before it had no statuses, read again
        whole = old is None
        self._worker.submit(self._tell, listeners, self.seq, changed, nodes, places, whole)

    def _node_rows(self, model: Snapshot | None, statuses: dict, result) -> dict[str, dict]:
        now = time.time()
        return {n.name: node_row(n, statuses, result, self.mirror, self.heard, now)
                for n in (model.nodes if model is not None else ())}

    def _tell(self, listeners: list[Listener], seq: int, changed: dict, nodes: list, places: dict,
              whole: bool = False) -> None:
        """In the feed's thread: the notice encoded once a project (or `refresh`: `whole`, too many
        changes, or the encoding failed), handed to every listener concerned."""
        try:
            small = not whole and len(changed) + len(nodes) <= MAX_CHANGES
            out = self._encode(seq, changed, nodes, places) if small else None
        except Exception:  # noqa: BLE001 - a lost notice must not leave the consoles wrong: they read again
            logging.getLogger(__name__).exception("console notice failed")
            out = None
        if out is None:
            refresh = event("refresh", {"seq": seq})
            out = {project: refresh for project in {*changed.values(), ADMIN}}
        every = list({id(b): b for b in out.values()}.values())
        per_loop: dict = {}
        for listener in listeners:
            chunks = every if listener.admin else [out[listener.project]] if listener.project in out else []
            if chunks:
                per_loop.setdefault(listener.loop, []).append((listener, chunks))
        for loop, told in per_loop.items():
            try:
                loop.call_soon_threadsafe(self._deliver, told)
            except RuntimeError:   # its loop is closed: its listeners are gone
                for listener, _ in told:
                    self.leave(listener)

    def _encode(self, seq: int, changed: dict, nodes: list, places: dict) -> dict:
        """project -> the bytes of its `change` event (ADMIN: the nodes' and other changes of no project)."""
        objects = self.read(list(changed))
        by_project: dict[str | None, list[dict]] = {}
        for key, project in sorted(changed.items(), key=lambda kv: kv[0]):
            change = {"kind": key[0], "id": key[1], **({"object": objects[key]} if key in objects else {"deleted": True})}
            if key[0] == "port" and key[1] in places:
                change["was"], change["now"] = places[key[1]]
            by_project.setdefault(project, []).append(change)
        for (kind, object_id), row in nodes:
            by_project.setdefault(ADMIN, []).append(
                {"kind": kind, "id": object_id, **({"object": row} if row is not None else {"deleted": True})})
        return {project: event("change", {"seq": seq, "changes": c}) for project, c in by_project.items()}

    @staticmethod
    def _deliver(told: list) -> None:
        for listener, chunks in told:
            listener.add(chunks)

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

    def drain(self) -> None:
        """Until the notices handed to the feed's thread so far are out (tests)."""
        self._worker.submit(lambda: None).result()
