"""The desired state on its own (fathom.controller.desired.DesiredState): pure, over models built
in memory and the real apps. A change recompiles only the owners it touches and the kept state
equals a whole compile (check_incremental raises otherwise); the edit of each changed switch is
what it lost and gained; a model that compiles the same compiles nothing; a batch beyond the limit
recompiles the app whole and is counted; `needs` follows the owners; a mismatch is raised and the
next update compiles whole; a port on one of the fabric's own interfaces is refused."""
from __future__ import annotations

import dataclasses

import pytest

from fathom.apps import BR_INT, SwitchKey
from fathom.controller import desired as ds
from fathom.controller.desired import DesiredState, IncrementalMismatch, compile_switches
from fathom.controller.metrics import METRICS
from fathom.model import TUNNEL_INTERFACE
from fathom.openflow.spec import SwitchState
from fathom.pipeline import cookies as ck

from .test_compiler_secgroups import DB, cloud

C1, C2 = SwitchKey(BR_INT, "c1"), SwitchKey(BR_INT, "c2")
WEB1 = 11      # port web1 on c1 (tests/unit/test_compiler_secgroups.cloud)


def kept(states: dict) -> dict:
    return {k: v for k, v in states.items() if v.flows or v.groups or v.meters}


def test_a_change_recompiles_its_owners_only_and_its_edit_is_what_changed():
    desired = DesiredState(check_incremental=True)
    before = cloud()
    assert desired.update(before, full=False) == set(kept(compile_switches(before)[0]))
    recomputes = dict(desired.recomputes)
    incremental = METRICS.incremental.labels("secgroups")._value.get()
    old = dict(desired.states)
    after = cloud(web1={"security_groups": (DB,)})
    changed = desired.update(after, full=False)
    assert changed and changed <= {C1, C2}
    assert desired.recomputes == recomputes                   # nothing compiled whole
    assert METRICS.incremental.labels("secgroups")._value.get() == incremental + 1
    assert kept(desired.states) == kept(compile_switches(after)[0])
    for key in changed:
        start, lost, gained = desired.edits[key]
        assert start is old[key]
        assert set(desired.states[key].flows) == (set(old[key].flows) - lost.flows) | gained.flows
        assert lost.flows and not lost.flows & desired.states[key].flows
    desired.release_edits()
    assert desired.edits == {}


def test_a_model_that_compiles_the_same_compiles_nothing():
    desired = DesiredState(check_incremental=True)
    before = cloud()
    desired.update(before, full=False)
    # the same store parts, a node's interface no port names renumbered (a VIF plugged early)
    nodes = tuple(dataclasses.replace(n, ofports={**n.ofports, "tap-nobody": 99}) if n.name == "c1" else n
                  for n in before.nodes)
    assert desired.update(dataclasses.replace(before, nodes=nodes), full=False) == set()
    assert desired.compiled_nothing
    assert desired.update(cloud(web1={"security_groups": (DB,)}), full=False)
    assert not desired.compiled_nothing


def test_a_batch_beyond_the_limit_recompiles_the_app_whole_and_is_counted(monkeypatch):
    monkeypatch.setattr(ds, "INCREMENTAL_LIMIT", 0)
    monkeypatch.setattr(ds, "INCREMENTAL_SHARE", 0.0)
    desired = DesiredState(check_incremental=True)
    desired.update(cloud(), full=False)
    assert not any("at once" in k for k in desired.recomputes)
    desired.update(cloud(web1={"security_groups": (DB,)}), full=False)
    assert any(k.startswith("secgroups: ") and k.endswith("owners changed at once") for k in desired.recomputes), \
        desired.recomputes
    assert all(not any(ch.isdigit() for ch in k) for k in desired.recomputes)   # a bounded set of labels


def holding(desired: DesiredState, owner: tuple[int, int]) -> set[SwitchKey]:
    """The switches whose desired flows carry something of `owner` (kind, object id), by cookie."""
    return {key for key, state in desired.states.items()
            if any(ck.parse_cookie(f.cookie)[1:] == owner for f in state.flows)}


def test_needs_follow_the_owners():
    web1 = (ck.KIND_PORT, WEB1)
    desired = DesiredState(check_incremental=True)
    model = cloud()
    desired.update(model, full=False)
    needs = desired.needs()
    assert needs[web1] == holding(desired, web1) and C1 in needs[web1]
    assert web1 in desired.needs_changed
    desired.statuses_decided()
    assert desired.needs_changed == set()
    desired.update(cloud(cli={"security_groups": (DB,)}), full=False)
    desired.needs()
    assert web1 not in desired.needs_changed                  # web1's switches stayed as they were
    gone = dataclasses.replace(model, ports=tuple(p for p in model.ports if p.id != WEB1))
    desired.update(gone, full=False)
    assert web1 not in desired.needs()                        # checked against a count (check_incremental)
    assert web1 in desired.needs_changed and holding(desired, web1) == set()


def test_a_mismatch_is_raised_and_the_next_update_compiles_whole():
    desired = DesiredState(check_incremental=True)
    model = cloud()
    desired.update(model, full=False)
    state = desired.states[C1]
    desired.states[C1] = SwitchState(frozenset(list(state.flows)[1:]), state.groups, state.meters)
    with pytest.raises(IncrementalMismatch, match="differs from a full compile"):
        desired.assert_incremental(desired.compiled_from)
    assert desired.mismatches == 1 and desired.parts == {} and desired.compiled_from is None
    first = {k: v for k, v in desired.recomputes.items() if k.endswith("first pass")}
    desired.update(cloud(web1={"security_groups": (DB,)}), full=False)
    assert all(desired.recomputes[k] == n + 1 for k, n in first.items())   # every app compiled whole again
    assert kept(desired.states) == kept(compile_switches(cloud(web1={"security_groups": (DB,)}))[0])


def test_a_port_on_the_fabric_own_interface_is_refused():
    desired = DesiredState(check_incremental=True)
    desired.update(cloud(web1={"interface": TUNNEL_INTERFACE}), full=False)
    assert set(desired.refused) == {WEB1}
    assert (ck.KIND_PORT, WEB1) not in desired.needs()


def test_the_views_are_patched_from_the_pass_before_and_two_passes_at_most_are_held():
    """The views the apps share (fathom.model.views) are kept by the desired state, not in the
    snapshot: a pass's are patched from those of the model compiled before, and a model two passes
    old is freed with its views."""
    import gc
    import weakref
    desired = DesiredState(check_incremental=True)
    first = cloud()
    desired.update(first, full=False)
    gone = weakref.ref(first)
    second = dataclasses.replace(first, ports=tuple(
        dataclasses.replace(p, security_groups=(DB,)) if p.id == WEB1 else p for p in first.ports))
    desired.update(second, full=False)
    delta = desired.views.delta(second)
    assert delta is not None and delta.ports == {WEB1}     # patched from the pass before: one port
    desired.update(cloud(), full=False)
    del first, second
    gc.collect()
    assert gone() is None
