"""Values derived from snapshots by pure functions (the routers as the switches realise them, the
compilers' look-ups, the refused ports), kept apart from the snapshots, which are plain data.

`Views` holds them: each is made once per snapshot however many apps read it, and, where its
maker gives a patch, worked out from the value of the snapshot compiled before and what changed
since (`Delta`), so that its cost follows the change, not the cloud. The reconciler's desired
state (fathom.controller.desired.DesiredState) owns one per pass and hands it to the apps with
the model; a caller without one passes None and every value is made afresh, the same value
(tests/unit/test_views.py compares them over random changes).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, fields
from typing import Callable, Mapping

from fathom.model import Port, Snapshot

DELTA_PORTS = 256      # a change of more ports than this (and an eighth) is not patched


@dataclass(frozen=True)
class Delta:
    """What changed from one snapshot to the next: what views are patched by.

    `ports`: the ids of the ports added, removed or changed, and of every port on a changed node
    (a port's facts depend on its node's port numbers); `before` / `after`: those ports as they were
    and are (id -> Port; a port added or removed is missing from one). `nodes`: the names of the
    nodes added, removed or changed. `fields`: the snapshot's other fields that differ."""
    fields: frozenset
    nodes: frozenset
    ports: frozenset
    before: Mapping
    after: Mapping

    def port_nodes(self) -> set:
        """The nodes the changed ports are bound to, before or after."""
        return {p.node for m in (self.before, self.after) for p in m.values()}

    def patched(self, view: Mapping, value) -> dict:
        """A copy of `view` (port id -> something) whose changed ports' entries are `value(port)`
        again: dropped where the port is gone or `value` gives None."""
        out = dict(view)
        for port_id in self.ports:
            p = self.after.get(port_id)
            if p is None or (v := value(p)) is None:
                out.pop(port_id, None)
            else:
                out[port_id] = v
        return out


_NONE = object()


class Views:
    """The views of the snapshots of one pass, and those of the pass before (`before`), which
    they are patched from. `get(views, snapshot, name, make, patch)` is how a view is asked for.

    Lifetime: a pass makes `Views(before=last)` and notes which snapshot follows which (`follow`);
    the next drops the pass before this one (`last.settle()`): the views of two passes at most
    are held, and none of them is part of a snapshot."""

    def __init__(self, before: "Views | None" = None):
        self.before = before
        self._values: dict[int, tuple[Snapshot, dict]] = {}   # id(snapshot) -> (it, name -> view)
        self._basis: dict[int, Snapshot] = {}     # id(snapshot) -> the snapshot (of `before`) it follows
        self._deltas: dict[int, Delta | None] = {}

    def follow(self, snapshot: Snapshot, basis: Snapshot | None) -> None:
        """Note that `snapshot` comes after `basis` (one the pass before compiled), so that its
        views may be patched from `basis`'s."""
        if basis is not None and basis is not snapshot and self.before is not None:
            self._values.setdefault(id(snapshot), (snapshot, {}))
            self._basis.setdefault(id(snapshot), basis)

    def settle(self) -> None:
        """The views of the pass before are no longer needed: they may be freed."""
        self.before, self._basis, self._deltas = None, {}, {}

    def delta(self, snapshot: Snapshot) -> Delta | None:
        """What changed since the snapshot `snapshot` follows, when the change is small (at most
        DELTA_PORTS ports, or an eighth of them where that is more); None otherwise."""
        key = id(snapshot)
        if key not in self._deltas:
            basis = self._basis.get(key)
            self._deltas[key] = changes(basis, snapshot) if basis is not None else None
        return self._deltas[key]

    def delta_from(self, before: Snapshot, after: Snapshot) -> Delta | None:
        """`delta(after)`, when the snapshot `after` follows is `before`."""
        return self.delta(after) if self._basis.get(id(after)) is before else None

    def _values_of(self, snapshot: Snapshot) -> dict:
        """The views held of `snapshot`: the pass before's, if it is that pass's snapshot."""
        for views in (self, self.before):
            if views is not None and (held := views._values.get(id(snapshot))) is not None \
                    and held[0] is snapshot:
                return held[1]
        return self._values.setdefault(id(snapshot), (snapshot, {}))[1]

    def _peek(self, snapshot: Snapshot, name: str):
        held = self._values.get(id(snapshot))
        return held[1].get(name, _NONE) if held is not None and held[0] is snapshot else _NONE

    def value(self, snapshot: Snapshot, name: str, make: Callable, patch: Callable | None):
        values = self._values_of(snapshot)
        if name in values:
            return values[name]
        value, old = None, _NONE
        basis = self._basis.get(id(snapshot))
        if basis is not None and self.before is not None:
            old = self.before._peek(basis, name)
            if old is not _NONE and patch is not None and (delta := self.delta(snapshot)) is not None:
                value = patch(old, snapshot, delta, self)
        if value is None:
            value = make(snapshot, self)
        if isinstance(value, Snapshot) and value is not snapshot and isinstance(old, Snapshot):
            self.follow(value, old)     # a derived model follows the one before it
        values[name] = value
        return value


def get(views: Views | None, snapshot: Snapshot, name: str, make: Callable, patch: Callable | None = None):
    """The view `name` of `snapshot`: `make(snapshot, views)` once per snapshot in `views` (every
    time without). `patch(view, snapshot, delta, views)`: the view worked out from the one of the
    snapshot `snapshot` follows and what changed since; it returns None for a change it does not
    cover, and `make` runs. It must give what `make` would."""
    if views is None:
        return make(snapshot, None)
    return views.value(snapshot, name, make, patch)


def ports_by_id(snapshot: Snapshot, views: Views | None = None) -> dict[int, Port]:
    """port id -> port (patched for the ports a change touched)."""
    return get(views, snapshot, "ports_by_id", lambda s, _v: {p.id: p for p in s.ports},
               lambda ports, _s, delta, _v: delta.patched(ports, lambda p: p))


def _changed_ports(before: tuple, after: tuple) -> tuple[list, list]:
    """(ports of `before` not in `after`, ports of `after` not in `before`), as objects: past the
    stretches both start and end with (the same objects at the same places, told apart at C
    speed), by identity."""
    if before is after:
        return [], []
    head = _first_false(list(map(operator.is_, before, after)))
    rest_b, rest_a = before[head:], after[head:]
    tail = _first_false(list(map(operator.is_, reversed(rest_b), reversed(rest_a))))
    ob = {id(p): p for p in rest_b[:len(rest_b) - tail]}
    oa = {id(p): p for p in rest_a[:len(rest_a) - tail]}
    return [ob[k] for k in ob.keys() - oa.keys()], [oa[k] for k in oa.keys() - ob.keys()]


def _first_false(same: list) -> int:
    try:
        return same.index(False)
    except ValueError:
        return len(same)


def changes(before: Snapshot, after: Snapshot) -> Delta | None:
    """The Delta from `before` to `after`; None for a change of many ports (see Views.delta).
    The ports are told apart by identity: the store's reader keeps the objects of the ports it did
    not read again, so this costs two C-level passes over the ports, not a comparison of each."""
    changed = frozenset(f.name for f in fields(Snapshot) if f.name not in ("nodes", "ports")
                        and (b := getattr(before, f.name)) is not (a := getattr(after, f.name)) and b != a)
    nb, na = {n.name: n for n in before.nodes}, {n.name: n for n in after.nodes}
    nodes = frozenset(name for name in nb.keys() | na.keys() if nb.get(name) != na.get(name))
    gone, new = _changed_ports(before.ports, after.ports)
    if len(gone) + len(new) > max(DELTA_PORTS, len(after.ports) // 8):
        return None
    ids = {p.id for p in gone} | {p.id for p in new}
    if not nodes:
        return Delta(changed, nodes, frozenset(ids), {p.id: p for p in gone}, {p.id: p for p in new})
    ids |= {p.id for p in before.ports if p.node in nodes} | {p.id for p in after.ports if p.node in nodes}
    if len(ids) > max(DELTA_PORTS, len(after.ports) // 8):
        return None
    return Delta(changed, nodes, frozenset(ids), {p.id: p for p in before.ports if p.id in ids},
                 {p.id: p for p in after.ports if p.id in ids})
