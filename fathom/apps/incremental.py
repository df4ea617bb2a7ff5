"""Which owners a change touches: `declared_touched` works it out from what an app declares it
reads (fathom.apps.base.Reads); `local_networks` is what the hand-written `touched` of the
external and fabric apps compare of the ports, computed once per model (fathom.model.views)."""
from __future__ import annotations

from collections.abc import Iterable

from fathom.apps.base import Owner, Reads
from fathom.model import Snapshot
from fathom.model.views import Views, get
from fathom.pipeline.infrastructure import is_infrastructure_interface


def declared_touched(app_id: int, reads: Reads):
    """The `touched(before, after)` of an app that declares `reads`: the owners (`reads.owners`)
    that changed in the fields read, or reach through `reads.refs` an object that did; a change
    in a collection no owner reaches compiles the app whole (its name is the reason)."""
    reached = reachable(reads)

    def touched(before: Snapshot, after: Snapshot, views: Views | None = None):
        if reads.quiet and not any(_collection(m, c) for m in (before, after) for c in reads.quiet):
            return set()
        b, a = (reads.view(before, views), reads.view(after, views)) if reads.view is not None else (before, after)
        hit: dict[str, set] = {}
        for coll, names in reads.fields.items():
            if coll in reached:
                hit[coll] = changed(b, a, coll, names, views)
            elif (getattr(b, coll) is not getattr(a, coll) or coll == "ports") \
                    and facts(b, coll, names) != facts(a, coll, names):   # (a port's facts are its node's too)
                return f"{coll} changed"
        grew = any(hit.values())
        while grew:             # an object naming a touched one is touched, until none is added
            grew = False
            for coll, refs in reads.refs.items():
                for m in (b, a):
                    for o in getattr(m, coll):
                        if o.id not in hit[coll] and any(i in hit[target] for name, target in refs.items()
                                                         for i in _ids(getattr(o, name))):
                            hit[coll].add(o.id)
                            grew = True
        return {Owner(app_id, kind, i) for coll, kind in reads.owners.items() for i in hit[coll]}
    return touched


def per_model(make):
    """`make(model)` once per model: kept for the last model asked about (a replica asks its apps'
    `reach` of each write about the model its last pass compiled, until the next pass)."""
    last: list = [None]

    def value(model: Snapshot):
        held = last[0]
        if held is not None and held[0] is model:
            return held[1]
        made = make(model)
        last[0] = (model, made)
        return made
    return value


def declared_reach(reads: Reads):
    """The `reach` (fathom.apps.base.App) of an app whose `touched` is declared_touched's: a port's
    write touches only the owners that name the port through `reads.refs`, so none names it: no
    switch; one does, or a port's change compiles the app whole: any switch (None)."""
    reached = reachable(reads)

    def reach(model: Snapshot, write) -> frozenset | None:
        if reads.quiet and not any(_collection(model, c) for c in reads.quiet):
            return frozenset()
        if "ports" not in reads.fields:
            return frozenset()
        if "ports" not in reached:
            return None
        for coll, refs in reads.refs.items():
            names = [name for name, target in refs.items() if target == "ports"]
            if names and any(write.port in _ids(getattr(o, name)) for o in getattr(model, coll) for name in names):
                return None
        return frozenset()
    return reach


def declared_facts(model: Snapshot, reads: Reads, without: frozenset = frozenset()) -> dict:
    """collection -> the declared fields of its objects, in order, of every collection `reads`
    declares but those `without`: what a `touched` that compiles whole on any change of them compares."""
    return {coll: facts(model, coll, names) for coll, names in reads.fields.items() if coll not in without}


def facts(model: Snapshot, coll: str, names: frozenset) -> tuple | None:
    """The declared fields `names` of every object of `coll` (of the fabric), in order."""
    if coll == "fabric":
        return fact(model.fabric, names)
    nodes = {n.name: n for n in model.nodes} if coll == "ports" and "ofport" in names else None
    return tuple(fact(o, names, nodes) for o in getattr(model, coll))


def reachable(reads: Reads) -> set[str]:
    """The collections whose objects an owner reaches through `reads.refs` (the owners' own too)."""
    out, todo = set(), list(reads.owners)
    while todo:
        coll = todo.pop()
        if coll not in out:
            out.add(coll)
            todo += reads.refs.get(coll, {}).values()
    return out


def changed(before: Snapshot, after: Snapshot, coll: str, names: frozenset, views: Views | None = None) -> set:
    """The ids of the objects of `coll` added, removed or changed in the fields `names`."""
    b, a = getattr(before, coll), getattr(after, coll)
    if coll == "ports" and "ofport" in names:
        delta = views.delta_from(before, after) if views is not None else None
        if delta is not None:       # the ports it names (those on a changed node too), else every one
            if not delta.ports:
                return set()
            b, a = delta.before.values(), delta.after.values()
        nb, na = {n.name: n for n in before.nodes}, {n.name: n for n in after.nodes}
        ob = {p.id: fact(p, names, nb) for p in b}
        oa = {p.id: fact(p, names, na) for p in a}
    elif b is a:
        return set()
    else:
        ob, oa = {o.id: fact(o, names) for o in b}, {o.id: fact(o, names) for o in a}
    return {i for i in ob.keys() | oa.keys() if ob.get(i) != oa.get(i)}


def fact(obj, names: frozenset, nodes: dict | None = None) -> tuple | None:
    """An object's fields `names`, as declared (Reads.fields): a node's `ofports` those of the
    fabric's own interfaces only, a port's `ofport` its interface's on its node (from `nodes`)."""
    if obj is None:
        return None
    out = []
    for name in sorted(names):
        if name == "ofport":
            node = nodes.get(obj.node)
            out.append(node.ofport(obj.interface) if node is not None else None)
        elif name == "ofports":
            out.append(tuple(sorted((i, o) for i, o in obj.ofports.items() if is_infrastructure_interface(i))))
        else:
            out.append(getattr(obj, name))
    return tuple(out)


def _ids(value) -> Iterable:
    """The ids a reference field holds: one, None or a tuple."""
    return value if isinstance(value, tuple) else (value,)


def _collection(model: Snapshot, name: str):
    """A collection of the model, or a field of its fabric ("fabric.<field>")."""
    if name.startswith("fabric."):
        return getattr(model.fabric, name.removeprefix("fabric."), None) if model.fabric is not None else None
    return getattr(model, name)


def local_networks(model: Snapshot, views: Views | None = None) -> dict:
    """node name -> the networks with a port plugged there."""
    def make(m: Snapshot, _views) -> dict:
        nodes, out = {n.name: n for n in m.nodes}, {}
        for p in m.ports:
            if p.node in nodes and nodes[p.node].ofport(p.interface) is not None:
                out.setdefault(p.node, set()).add(p.network_id)
        return {n: frozenset(s) for n, s in out.items()}
    return get(views, model, "local_networks", make)
