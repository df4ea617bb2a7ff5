"""The desired flows of every shipped topology are exactly the committed ones (tests/unit/golden/),
and every app reads of those models only what it declares (fathom.apps.base.Reads).

A change of structure must not change what any switch is asked to hold. A deliberate change of
behaviour rewrites the file (`.venv/bin/python -m tests.unit.golden_flows --write`) and the diff
shows, flow by flow, what changed. An undeclared read is a change the incremental reconciler would
not see: a stale flow, not a failed test, without the check (tests/unit/app_reads.py).
"""
from __future__ import annotations

import difflib
from dataclasses import replace

from fathom.apps import registry
from tests.unit import golden_flows

from .app_reads import problems


def test_compiled_flows_match_the_golden_file():
    want = golden_flows.GOLDEN.read_text()
    got = golden_flows.render()
    if got != want:
        diff = "".join(list(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                                 "golden", "compiled", n=1))[:80])
        raise AssertionError("compiled flows differ from tests/unit/golden/flows.txt:\n" + diff)


def test_every_app_reads_only_what_it_declares():
    out = set()
    for path, name, model in golden_flows.models():
        for app in registry():
            out |= {f"{p} ({path.name} [{name}])" for p in problems(app, model)}
    assert not out, "\n".join(sorted(out))


def test_the_reads_check_sees_an_undeclared_field_and_a_dependency_no_reference_reaches():
    """A declaration missing a field the compile reads fails; so does an owner whose flows read an
    object its references do not name (here: a policy reading every port)."""
    _, _, model = next(m for m in golden_flows.models() if m[2].tap_policies)
    vtap = next(a for a in registry() if a.name == "vtap")
    fields = dict(vtap.reads.fields)
    fields["ports"] = fields["ports"] - {"mac_address"}
    missing = replace(vtap, reads=replace(vtap.reads, fields=fields))
    assert any("reads ports.mac_address" in p for p in problems(missing, model))

    def nosy(m, views=None):
        [p.node for p in m.ports]
        return vtap.compile(m, views)
    assert any("which it does not reach" in p
               for p in problems(replace(vtap, compile=nosy,
                                         compile_owners=lambda m, _owners, views=None: nosy(m, views)), model))
