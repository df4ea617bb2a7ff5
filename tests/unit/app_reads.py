"""A view of the model that records what a compile reads, and the check that an app reads only what
it declares (fathom.apps.base.Reads).

`recording(model, log)` is a copy of the model whose collections' objects (and the fabric) note in
`log` every field read: (collection, field) and, for a field other than `id`, which object (an
object whose id alone is read, to index it, is not read). A node's `ofports` note the interfaces
looked up: a VIF's port number is its port's (`ofport`), the fabric's own interfaces the node's.
A compile that iterates a node's port numbers is taken to keep the fabric's own interfaces only
(the tenant app's check of ports bound to one): the check cannot tell what it keeps.
`problems(app, model)` compiles the app over it and names every read its declaration lacks; for
an app whose owners are declared, it compiles each owner alone and names every object of a
collection reached through `refs` that the owner read but does not reach: a change of that object
would leave the owner's flows stale.
"""
from __future__ import annotations

import dataclasses
import sys
from collections import defaultdict

from fathom.apps import App, Owner, compile_owners
from fathom.apps.incremental import _ids, reachable
from fathom.model import Snapshot
from fathom.pipeline.infrastructure import is_infrastructure_interface

COLLECTIONS = tuple(f.name for f in dataclasses.fields(Snapshot) if f.init)


class Log:
    def __init__(self):
        self.fields: set[tuple[str, str]] = set()           # (collection, field) read
        self.objects: dict[str, set] = defaultdict(set)     # collection -> ids of the objects read
        self.ofports: set[tuple[str, str]] = set()          # (node name, interface) looked up
        self.iterated: set[str] = set()                     # nodes whose port numbers were iterated

    def read(self, coll: str, obj_id, name: str) -> None:
        self.fields.add((coll, name))
        if name != "id":
            self.objects[coll].add(obj_id)


class _Ofports(dict):
    """A node's br-int port numbers, noting each interface looked up (all of them when iterated)."""
    def __init__(self, ports, node: str, log: Log):
        super().__init__(ports)
        self.node, self.log = node, log

    def get(self, key, default=None):
        self.log.ofports.add((self.node, key))
        return super().get(key, default)

    def __getitem__(self, key):
        self.log.ofports.add((self.node, key))
        return super().__getitem__(key)

    def __contains__(self, key):
        self.log.ofports.add((self.node, key))
        return super().__contains__(key)

    def _all(self):
        self.log.iterated.add(self.node)

    def items(self):
        self._all()
        return super().items()

    def keys(self):
        self._all()
        return super().keys()

    def values(self):
        self._all()
        return super().values()

    def __iter__(self):
        self._all()
        return super().__iter__()


_RECORDED: dict[type, type] = {}
_NOT_READS = ("__hash__", "__repr__")      # what hashing or printing an object reads is not an input


def _recorded_class(cls: type) -> type:
    if cls not in _RECORDED:
        names = {f.name for f in dataclasses.fields(cls)}

        def __getattribute__(self, name):
            d = object.__getattribute__(self, "__dict__")
            if name in names and "_log" in d and sys._getframe(1).f_code.co_name not in _NOT_READS:
                coll, log = d["_log"]
                log.read(coll, d.get("id"), name)
            return object.__getattribute__(self, name)
        _RECORDED[cls] = type(cls.__name__, (cls,), {"__getattribute__": __getattribute__})
    return _RECORDED[cls]


def _recorded(obj, coll: str, log: Log):
    new = object.__new__(_recorded_class(type(obj)))
    new.__dict__.update(obj.__dict__)
    if coll == "nodes":
        new.__dict__["ofports"] = _Ofports(obj.ofports, obj.name, log)
    new.__dict__["_log"] = (coll, log)
    return new


def recording(model: Snapshot, log: Log) -> Snapshot:
    """A copy of `model` noting in `log` what is read of it (and of the copies made of it)."""
    def __getattribute__(self, name):
        if name in COLLECTIONS and sys._getframe(1).f_code.co_name not in ("replace", "_replace"):
            log.fields.add((name, ""))      # (a copy made by dataclasses.replace is no read)
        return object.__getattribute__(self, name)
    cls = type("RecordingSnapshot", (Snapshot,), {"__getattribute__": __getattribute__})
    parts = {c: tuple(_recorded(o, c, log) for o in getattr(model, c)) for c in COLLECTIONS if c != "fabric"}
    return cls(**parts, fabric=_recorded(model.fabric, "fabric", log) if model.fabric is not None else None)


def _view(app: App, model: Snapshot) -> Snapshot:
    return app.reads.view(model) if app.reads.view is not None else model


def undeclared_reads(app: App, model: Snapshot, log: Log) -> list[str]:
    """The reads in `log` the app's declaration lacks."""
    fields, out = app.reads.fields, []
    ports = {(p.node, p.interface): p for p in _view(app, model).ports if p.node}
    for coll, name in sorted(log.fields):
        if coll not in fields:
            out.append(f"{app.name} reads the collection {coll!r} ({name or 'itself'})")
        elif name and name not in fields[coll] and not (coll == "nodes" and name == "ofports"):
            out.append(f"{app.name} reads {coll}.{name}")
    if log.iterated and "ofports" not in fields.get("nodes", ()):
        out.append(f"{app.name} iterates the port numbers of nodes")
    for node, interface in sorted(log.ofports, key=str):
        if is_infrastructure_interface(interface):
            if "ofports" not in fields.get("nodes", ()):
                out.append(f"{app.name} reads the port number of {interface} on {node}")
        elif (node, interface) in ports:
            if "ofport" not in fields.get("ports", ()):
                out.append(f"{app.name} reads the port number of port {ports[node, interface].id}")
            log.objects["ports"].add(ports[node, interface].id)
        else:
            out.append(f"{app.name} reads the port number of {interface} on {node}, which no port is bound to")
    return out


def problems(app: App, model: Snapshot) -> list[str]:
    """What `app` reads of `model` that it does not declare (see the module's docstring)."""
    if app.reads is None:
        return [f"{app.name} declares nothing it reads"]
    log = Log()
    view = _view(app, model)
    got = app.compile(recording(view, log))
    assert got == app.compile(model), f"{app.name}: the recording view compiles otherwise"
    out = undeclared_reads(app, model, log)
    reads, reached = app.reads, reachable(app.reads)
    out += [f"{app.name} names {c} among its owners or references but not among its reads"
            for c in sorted(reached - set(reads.fields))]
    for coll, kind in reads.owners.items():
        for o in getattr(view, coll):
            log = Log()
            compile_owners(app, recording(view, log), frozenset({Owner(app.app_id, kind, o.id)}))
            undeclared_reads(app, model, log)       # notes the ports whose port numbers were read
            mine = _reach(view, reads.refs, coll, o.id)
            for c in reached:
                for i in sorted(log.objects.get(c, set()) - mine.get(c, set())):
                    out.append(f"{app.name}: the owner {coll} {o.id} reads {c} {i}, which it does not reach")
    return out


def _reach(model: Snapshot, refs: dict, coll: str, obj_id) -> dict[str, set]:
    """collection -> ids of the objects `obj_id` of `coll` names, through any chain of `refs`."""
    out: dict[str, set] = defaultdict(set)
    todo = [(coll, obj_id)]
    while todo:
        c, i = todo.pop()
        if i is None or i in out[c]:
            continue
        out[c].add(i)
        obj = next((o for o in getattr(model, c) if o.id == i), None)
        if obj is not None:
            todo += [(target, j) for name, target in refs.get(c, {}).items() for j in _ids(getattr(obj, name))]
    return out


def models_compiled(rec) -> list[Snapshot]:
    """The models a reconciler (fathom.controller.reconciler.Reconciler) compiles from now on: each
    `run_pass` notes the model it leaves compiled."""
    seen: list[Snapshot] = []
    run = rec.run_pass

    def noted(*args, **kwargs):
        out = run(*args, **kwargs)
        if rec.desired.compiled_from is not None and not any(m is rec.desired.compiled_from for m in seen):
            seen.append(rec.desired.compiled_from)
        return out
    rec.run_pass = noted
    return seen


def problems_of(models: list[Snapshot]) -> list[str]:
    """What any app reads of these models that it does not declare."""
    from fathom.apps import registry
    return sorted({p for model in models for app in registry() for p in problems(app, model)})
