"""The desired state of every switch, kept from pass to pass: pure (no I/O, no sessions, no
OpenFlow), brought up to each pass's model by `DesiredState.update`.

Each app's desired state is a part (`_Part`), per switch and per owning object. An app that can
say which owners a change touches (`App.touched`) recompiles only those (`compile_owners`) and its
part is replaced owner by owner; other apps are compiled whole; a change no handler covers, or a
batch beyond INCREMENTAL_LIMIT owners and INCREMENTAL_SHARE of the app's, recompiles the app whole
(logged with its reason, counted in fathom_reconciler_recomputes_total). A switch's desired state
is the union of the parts there; what a pass took out of and put into it is its edit (`edits`,
fathom.controller.edits), which is all a switch that holds the state before is told.

`needs` keeps which switches hold something of each object (what its status waits for), moved
by the owners a pass replaced. With `check_incremental` every update is checked against a compile
of the model from scratch (`assert_incremental`) and `needs` against a count.

The values the apps derive from the model and share (the routers as the switches realise them,
the compilers' look-ups: fathom.model.views) are kept here too, in the `Views` of the pass
(`views`), handed to every app with the model: made once per model and patched from those of
the model compiled before, so that a pass's cost follows the change. The snapshot itself is
plain data; a compile without the views (the check's) makes them afresh.
"""
from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import fields, replace

from fathom.apps import Owner, OwnerOn, SwitchKey, by_owner, compile_all, compile_owners, registry
from fathom.controller import status
from fathom.controller.edits import Edit, Edited, edited, record_edit, union
from fathom.controller.metrics import METRICS
from fathom.model import Snapshot
from fathom.model.views import Views
from fathom.openflow.spec import SwitchState
from fathom.pipeline.infrastructure import is_infrastructure_interface, refused_ports

LOG = logging.getLogger("fathom.reconciler")   # one log for every part of the reconciler

# More owners touched in one pass than this, and than INCREMENTAL_SHARE of the app's owners, each
# counted once per switch it is on (`_Part.cost`, `_Part.size`): recompiling the app whole is
# cheaper (a compile per owner costs what the whole compile costs for those owners, plus the
# look-ups; a fabric filling at hundreds of ports a pass stays incremental).
INCREMENTAL_LIMIT = 256
INCREMENTAL_SHARE = 0.25


def without_refused(snapshot: Snapshot, views: Views | None = None) -> tuple[Snapshot, dict[int, str]]:
    """The model the apps compile, and the ports refused: a port bound to one of the fabric's own
    interfaces (refused_ports) is compiled by no app (the tenant compiler refuses it itself; a tap
    policy on it must not copy the tunnel either)."""
    refused = refused_ports(snapshot, views)
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
        if f.name not in ("nodes", "fabric") and getattr(before, f.name) is not getattr(after, f.name):
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
            state = self.states[key] = union(self.owners[key].values())
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
            record_edit(edits, key, [before[key]] if key in before else [],
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
            record_edit(edits, key, old.values(), new.values())
            if moves is not None:
                gone, got = moves.setdefault(key, ([], []))
                gone.extend(old)
                got.extend(new)
            self.states.pop(key, None)
            changed.add(key)
        return changed


def _unneed(needs: dict, owner: tuple[int, int], key: SwitchKey) -> None:
    """`key` holds nothing of `owner` (kind, object id) any more (DesiredState.needs)."""
    needs[owner].discard(key)
    if not needs[owner]:
        del needs[owner]


class DesiredState:
    """Every switch's desired state (`states`), kept from pass to pass, and how it got there.

    `update(snapshot, full)` compiles what changed and returns the switches whose state changed;
    `edits` then holds, per such switch, (its state before, what it lost, what it gained), and
    `needs()` which switches hold something of each object. With `check_incremental` each update
    and each `needs` is checked against a computation from scratch (IncrementalMismatch)."""

    def __init__(self, check_incremental: bool = False):
        self.check_incremental = check_incremental
        self.parts: dict[str, _Part] = {}             # app (or "derive:" app) -> its desired state
        self.states: dict[SwitchKey, SwitchState] = {}
        # switch -> (its desired state before this pass, what the pass took out, what it put in):
        # the change of a switch that holds that state, without a pass over all its flows
        self.edits: dict[SwitchKey, tuple[SwitchState, SwitchState, SwitchState]] = {}
        self.refused: dict[int, str] = {}             # port id -> why no app compiles it (last update)
        self.compiled_from: Snapshot | None = None    # the model `states` was compiled from
        self.views: Views | None = None               # the views of the last update's model
        self._basis: Views | None = None              # those of `compiled_from`: the next are patched from them
        self.compiled_nothing = False                 # the last update's model compiled as the one before
        self.recomputes: dict[str, int] = {}          # "app: reason" -> count (also in /metrics)
        self.mismatches = 0                           # check_incremental failures (must stay 0)
        self._compiled: dict[SwitchKey, SwitchState] = {}   # union of the apps' compiles (before derive)
        self._moves: dict[SwitchKey, tuple[list, list]] = {}   # owners replaced one by one: gone, got
        self._whole: set[SwitchKey] = set()                    # switches a part was set whole on
        # switch -> (kind, object id) it holds something of -> how many parts' owners hold it there
        self._owners_at: dict[SwitchKey, Counter] = {}
        self._needs_index: dict = {}                  # its reverse: (kind, object id) -> switches
        self.needs_changed: set = set()               # its keys changed since statuses were decided

    def statuses_decided(self) -> None:
        """The statuses were decided from `needs`: what changes in it is gathered afresh."""
        self.needs_changed = set()

    def release_edits(self) -> None:
        """The pass is over: what it replaced (the switches' states before it) may be freed."""
        self.edits = {}

    def update(self, snapshot: Snapshot, full: bool) -> set[SwitchKey]:
        """Bring the kept desired state up to `snapshot` (less its refused ports: `refused`), every
        app compiled whole with `full`; returns the switches whose state changed."""
        basis = self._basis if not full else None
        if basis is not None:
            basis.settle()     # the views of two passes at most are held
        views = Views(before=basis)
        if not full:   # its views are patched from those of the model compiled last
            views.follow(snapshot, self.compiled_from)
        model, self.refused = without_refused(snapshot, views)
        if not full and model is not snapshot:
            views.follow(model, self.compiled_from)
        changed = self._update(model, views, full)
        self.views = views
        if self.compiled_from is model:
            self._basis = views
        return changed

    def _update(self, model: Snapshot, views: Views, full: bool) -> set[SwitchKey]:
        before = self.compiled_from if not full else None
        self.edits = {}
        self._moves = {}
        self._whole = set()
        self.compiled_nothing = before is not None and bool(self.parts) and compiles_the_same(before, model)
        if self.compiled_nothing:
            if self.check_incremental:
                self.assert_incremental(model)
            return set()
        edits: dict[SwitchKey, Edit] = {}
        apps = registry()
        changed = self._compile_apps(apps, model, before, edits, views)
        compiled = self._unite(apps, changed, edits)
        derived, derived_changed = self._derive(apps, model, compiled, edits, views)
        changed |= derived_changed
        self._set_states(changed, compiled, derived, edits)
        self.compiled_from = model
        if self.check_incremental:
            self.assert_incremental(model)
        return changed

    def _compile_apps(self, apps, model: Snapshot, before: Snapshot | None, edits: dict,
                      views: Views) -> set[SwitchKey]:
        """Compile each app's part: owner by owner where it can say which owners changed since
        `before` (None: every app whole), else whole; returns the switches whose part changed."""
        changed: set[SwitchKey] = set()
        for app in apps:
            part = self.parts.get(app.name)
            incremental = app.touched is not None
            reason = None
            owners = None
            if part is None or before is None:
                reason = "first pass" if part is None else "audit"
            elif incremental:
                owners = app.touched(before, model, views)
                if isinstance(owners, str):
                    reason, owners = owners, None
                elif part.cost(owners) > max(INCREMENTAL_LIMIT, INCREMENTAL_SHARE * part.size()):
                    reason, owners = f"{len(owners)} owners changed at once", None
            if owners is not None:
                if owners:
                    owners = frozenset(owners)
                    changed |= part.replace(owners, compile_owners(app, model, owners, views), edits, self._moves)
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
            whole = part.set_whole(app.compile(model, views), index=incremental, edits=edits)
            self._whole |= whole
            changed |= whole
        return changed

    def _unite(self, apps, changed: set[SwitchKey], edits: dict) -> dict[SwitchKey, SwitchState]:
        """The union of the apps' compiles (what `derive` reads), kept per switch like `states`: a
        switch only owners were replaced on gets its edit, any other the union of the parts."""
        compiled = self._compiled
        held = set().union(*(self.parts[app.name].keys() for app in apps))
        for key in changed | (set(compiled) - held):
            if key in compiled and key in held and key not in self._whole:
                compiled[key] = edited(compiled[key], edits[key])
                continue
            states = [st for app in apps if (st := self.parts[app.name].state(key)) is not None]
            if states:
                compiled[key] = union(states)
            else:
                compiled.pop(key, None)
        return compiled

    def _derive(self, apps, model: Snapshot, compiled: dict, edits: dict,
                views: Views) -> tuple[list["_Part"], set[SwitchKey]]:
        """The apps' `derive` parts (switches that follow others) from the union of the compiles;
        returns them and the switches whose derived state changed."""
        derived, changed = [], set()
        for app in apps:
            if app.derive is not None:
                part = self.parts.setdefault("derive:" + app.name, _Part())
                whole = part.set_whole(app.derive(model, compiled, views), index=False, edits=edits)
                self._whole |= whole
                changed |= whole
                derived.append(part)
        return derived, changed

    def _set_states(self, changed: set[SwitchKey], compiled: dict, derived: list["_Part"], edits: dict) -> None:
        """Each changed switch's desired state, and its edit (`edits`): what it lost and gained."""
        for key in changed:
            old = self.states.get(key)
            states = [compiled[key]] if key in compiled else []
            states += [st for p in derived if (st := p.state(key)) is not None]
            if states:
                new = self.states[key] = union(states)
            else:
                new = self.states.pop(key, None)
            edit = edits.get(key)
            if old is not None and new is not None and edit is not None:
                # what the switch loses and gains: what the parts lost that no part still holds,
                # and what they gained that was not held before (a flow may move between owners);
                # in a state this edit made from the one before, the owners' flows are their own:
                # a flow taken out is still held only if put in again, one put in was held before
                # only if taken out (no whole set is read for that)
                gone, got = edit.united()
                if isinstance(new, Edited) and new.follows(old):
                    lost, gained = gone.flows - got.flows, got.flows - gone.flows
                else:
                    lost, gained = gone.flows - new.flows, got.flows - old.flows
                self.edits[key] = (old, SwitchState(lost, gone.groups - new.groups, gone.meters - new.meters),
                                   SwitchState(gained, got.groups - old.groups, got.meters - old.meters))

    def needs(self) -> dict:
        """(kind, object id) -> switches holding something of it, kept per switch: moved by the
        owners the pass replaced one by one (`_moves`, so the cost follows the change), and counted
        again for a switch a part was set whole on, or that came or went."""
        cache, needs = self._owners_at, self._needs_index
        again = self._whole | (set(cache) ^ set(self.states))
        for key in again:
            old = cache.pop(key, Counter())
            new = self._switch_owners(key) if key in self.states else Counter()
            if new:
                cache[key] = new
            for o in old.keys() - new.keys():
                _unneed(needs, o, key)
                self.needs_changed.add(o)
            for o in new.keys() - old.keys():
                needs.setdefault(o, set()).add(key)
                self.needs_changed.add(o)
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
                    self.needs_changed.add(o)
            for owner in got:
                o = (owner.kind, owner.id)
                counts[o] += 1
                if counts[o] == 1:
                    needs.setdefault(o, set()).add(key)
                    self.needs_changed.add(o)
            if not counts:
                del cache[key]
        if self.check_incremental:
            counted = {key: self._switch_owners(key) for key in self.states}
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
        full = compile_all(model)    # its views made afresh, not patched
        keep = lambda d: {k: v for k, v in d.items() if v.flows or v.groups or v.meters}  # noqa: E731
        mine, theirs = keep(self.states), keep(full)
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
            # the next pass compiles whole
            self.parts, self.compiled_from, self._compiled, self._basis = {}, None, {}, None
            raise IncrementalMismatch("incremental desired state differs from a full compile:\n" + "\n".join(lines))

