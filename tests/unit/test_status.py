"""The status model (fathom/controller/status.py) covers every kind whose flows a switch holds."""
from __future__ import annotations

from fathom.controller import status
from fathom.pipeline import cookies as ck

from . import golden_flows


def test_every_kind_of_flow_owner_has_a_status_source():
    covered = {k for kinds in status.FLOW_KINDS.values() for k in kinds}
    seen = set()
    for _path, _variant, states in golden_flows.scenarios():
        for state in states.values():
            seen |= {ck.parse_cookie(s.cookie)[1] for s in (*state.flows, *state.groups, *state.meters)}
    # stage: the skeleton belongs to no object; node: a node's status is its br-int's; a security
    # group clause is shared by rules whose own flows sit on the same switches (their status)
    assert seen - {ck.KIND_STAGE, ck.KIND_NODE, ck.KIND_SECURITY_GROUP_CLAUSE} <= covered, seen
    assert set(status.FLOW_KINDS) <= set(status.SOURCES)
    assert {s for s in status.SOURCES.values()} >= {status.FLOWS}
