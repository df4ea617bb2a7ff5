"""Apps: each turns the objects it owns into the desired state of the switches.

An app declares its id (the app byte of its cookies, group and meter ids), the tables it fills on
each bridge kind (names from fathom/pipeline/catalogue.py), and `compile(model, views)`: a pure
function from the model (fathom.model.Snapshot) to the desired state of every switch it has
something for, keyed by `SwitchKey(bridge, name)`; `views` (fathom.model.views.Views, or None) holds
the values derived from the model that apps share and that are kept from pass to pass, and gives
the same values as a compile without it. An app may also declare `derive(model, desired, views)` for switches
whose state follows from what the other switches are asked to hold (the fabric switch lets a VLAN onto a
trunk port when the node's br-int can send it): it runs after every app's `compile`, on their
union. The reconciler runs every registered app for every switch and diffs the union against what
the switch holds, through one path and one ownership rule (fathom.pipeline.cookies.owns_cookie).

A new app is a folder here (fathom/apps/<app>/) with its compiler and an `APP` object (an `App`
of fathom/apps/base.py), plus one line in `registry()`; its tables must already be declared in the
catalogue. Every flow an app compiles carries its cookie (app, kind, object id), so the desired
state of a switch can be split per owning object (`by_owner`), which is what an incremental
reconciler keeps.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Mapping

# the apps' names, here for callers
from fathom.apps.base import (  # noqa: F401
    BR_INT, BR_PHY, FABRIC_SWITCH, App, Owner, OwnerOn, PortWrite, Reads, SwitchKey,
)
from fathom.apps.incremental import declared_touched
from fathom.model import Snapshot
from fathom.model.views import Views
from fathom.openflow.spec import SwitchState
from fathom.pipeline import cookies as ck
from fathom.pipeline.catalogue import PIPELINES


def _skeleton(model: Snapshot, _views=None) -> dict[SwitchKey, SwitchState]:
    """The skeleton of every bridge: br-int on every node; br-phy and fabric switches once there is a fabric."""
    out = {SwitchKey(BR_INT, n.name): SwitchState(PIPELINES[BR_INT].skeleton()) for n in model.nodes}
    fabric = model.fabric
    if fabric is not None and fabric.switches:
        out.update({SwitchKey(BR_PHY, n.name): SwitchState(PIPELINES[BR_PHY].skeleton()) for n in model.nodes})
        out.update({SwitchKey(FABRIC_SWITCH, s.name): SwitchState(PIPELINES[FABRIC_SWITCH].skeleton()) for s in fabric.switches})
    return out


# The skeleton follows the set of switches only: compiled again (whole) when that changes.
SKELETON_READS = Reads({"nodes": frozenset({"name"}), "fabric": frozenset({"switches"})})
PIPELINE = App("pipeline", ck.APP_PIPELINE, {b: tuple(t.name for t in p.tables) for b, p in PIPELINES.items()},
               _skeleton, touched=declared_touched(ck.APP_PIPELINE, SKELETON_READS), reads=SKELETON_READS,
               reach=lambda _model, _write: frozenset())   # nodes and fabric switches only


def port_write_reach(model: Snapshot, writes, apps: tuple[App, ...] | None = None) -> frozenset[str] | None:
    """The nodes whose switches a port's write may change (every app's `reach` of each of
    `writes`, PortWrite), from the model before them; None: any switch."""
    out: set[str] = set()
    for app in apps or registry():
        if app.reach is None:
            return None
        for write in writes:
            nodes = app.reach(model, write)
            if nodes is None:
                return None
            out |= nodes
    return frozenset(out)


def registry() -> tuple[App, ...]:
    """Every app, in the order their states are merged (the order does not change the union)."""
    from fathom.apps.external import APP as EXTERNAL
    from fathom.apps.fabric import APP as FABRIC
    from fathom.apps.secgroups import APP as SECGROUPS
    from fathom.apps.sfc import APP as SFC
    from fathom.apps.tenant import APP as TENANT
    from fathom.apps.vtap import APP as VTAP
    return (PIPELINE, TENANT, FABRIC, VTAP, SECGROUPS, SFC, EXTERNAL)


def compile_all(model: Snapshot, apps: tuple[App, ...] | None = None,
                views: Views | None = None) -> dict[SwitchKey, SwitchState]:
    """The desired state of every switch: the union of every app's part (`compile`, then `derive`
    on that union). `views`: the views of the model the apps share (made afresh without)."""
    apps = apps or registry()
    views = views if views is not None else Views()
    out: dict[SwitchKey, SwitchState] = {}
    for app in apps:
        _merge(out, app.compile(model, views))
    compiled = dict(out)
    for app in apps:
        if app.derive is not None:
            _merge(out, app.derive(model, compiled, views))
    return out


def _merge(into: dict[SwitchKey, SwitchState], part: Mapping[SwitchKey, SwitchState]) -> None:
    for key, state in part.items():
        into[key] = into[key] | state if key in into else state


def compile_bridge(model: Snapshot, bridge: str) -> dict[str, SwitchState]:
    """Desired state of every switch of one bridge kind, by name (e.g. every br-int by node)."""
    return {k.name: s for k, s in compile_all(model).items() if k.bridge == bridge}


def by_owner(state: SwitchState) -> dict[Owner, SwitchState]:
    """A switch's desired state split by owning object, read from the cookies."""
    flows, groups, meters = defaultdict(set), defaultdict(set), defaultdict(set)
    for f in state.flows:
        flows[ck.parse_cookie(f.cookie)].add(f)
    for g in state.groups:
        groups[ck.parse_cookie(g.cookie)].add(g)
    for m in state.meters:
        meters[ck.parse_cookie(m.cookie)].add(m)
    return {Owner(*o): SwitchState(frozenset(flows[o]), frozenset(groups[o]), frozenset(meters[o]))
            for o in set(flows) | set(groups) | set(meters)}


def compile_owners(app: App, model: Snapshot, owners: frozenset,
                   views: Views | None = None) -> dict[SwitchKey, SwitchState]:
    """The desired state of exactly `owners` (each an `Owner` on every switch, or an `OwnerOn` one
    switch only): the app's own `compile_owners`, or its whole compile cut down to those owners."""
    if app.compile_owners is not None:
        return app.compile_owners(model, owners, views)
    out = {}
    for key, state in app.compile(model, views).items():
        parts = [s for o, s in by_owner(state).items() if o in owners or o.on(key) in owners]
        if parts:
            out[key] = SwitchState(frozenset().union(*(p.flows for p in parts)),
                                   frozenset().union(*(p.groups for p in parts)),
                                   frozenset().union(*(p.meters for p in parts)))
    return out
