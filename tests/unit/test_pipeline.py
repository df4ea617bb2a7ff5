"""The pipeline declarations (fathom/pipeline/catalogue.py) hold for every flow every app compiles,
and docs/pipeline.md shows exactly what they declare."""
from __future__ import annotations

from pathlib import Path

import pytest

from fathom.apps import registry
from fathom.openflow.spec import FlowSpec, GotoTable, GroupSpec, Group, Output, Resubmit, SetField
from fathom.pipeline import catalogue as cat
from fathom.pipeline import cookies as ck

from . import golden_flows

DOC = Path(__file__).resolve().parents[2] / "docs" / "pipeline.md"


@pytest.fixture(scope="module")
def compiled():
    return list(golden_flows.scenarios())


def test_every_compiled_flow_keeps_to_its_pipeline(compiled):
    checked = 0
    for path, variant, states in compiled:
        for key, state in states.items():
            problems = cat.PIPELINES[key.bridge].check(state.flows, state.groups)
            assert problems == [], (path.name, variant, str(key), problems[:5])
            checked += len(state.flows)
    assert checked > 2000


def test_every_app_writes_only_into_the_tables_it_declares(compiled):
    apps = {a.app_id: a for a in registry()}
    for _path, _variant, states in compiled:
        for key, state in states.items():
            pipeline = cat.PIPELINES[key.bridge]
            for f in state.flows:
                app = apps[ck.parse_cookie(f.cookie)[0]]
                assert pipeline.table(f.table).name in app.tables.get(key.bridge, ()), (app.name, str(key), f.to_ofctl())


def test_apps_declare_only_tables_of_the_catalogue():
    for app in registry():
        for bridge, tables in app.tables.items():
            assert set(tables) <= set(cat.PIPELINES[bridge].by_name), (app.name, bridge)


def test_only_classify_and_routing_stages_move_a_frame_between_networks():
    writers = {t.name for t in cat.BR_INT.tables if cat.REG_NETWORK in t.writes}
    # l3 routes between a router's subnets; nat-route and snat between them and its external network
    assert writers == {"classify", "l3", "nat-route", "snat"}
    assert {t.name for t in cat.BR_INT.tables if cat.REG_OUT_PORT in t.writes} == {"l2"}


def test_the_check_catches_what_breaks_the_declaration():
    l2, arp = cat.BR_INT.number("l2"), cat.BR_INT.number("arp")
    c = ck.cookie(ck.APP_TENANT, ck.KIND_PORT, 1)
    assert cat.BR_INT.check([FlowSpec(l2, 5, {}, (SetField(cat.REG_NETWORK, 2), Output(1)), c)])   # l2 writes reg6
    assert cat.BR_INT.check([FlowSpec(arp, 5, {}, (GotoTable(l2),), c)])                          # arp -> l2 skips
    assert cat.BR_INT.check([FlowSpec(33, 5, {}, (), c)])                                          # no table 33
    group = GroupSpec(7, "all", ((Resubmit(arp),),), c)
    assert cat.BR_INT.check([FlowSpec(l2, 5, {}, (Group(7),), c)], [group])                        # via a bucket
    assert cat.BR_INT.check([FlowSpec(l2, 5, {}, (SetField(cat.REG_OUT_PORT, 3),), c)]) == []


def test_a_declaration_cannot_go_backwards():
    with pytest.raises(ValueError):
        cat.Pipeline("x", skeleton_app=ck.APP_PIPELINE, tables=(
            cat.Table("a", 0, "", next=("b",)), cat.Table("b", 10, "", miss="a")))


def test_skeleton_is_one_miss_flow_per_table_plus_the_fixed_ones():
    for p in cat.PIPELINES.values():
        flows = p.skeleton()
        assert {f.table for f in flows if f.priority == 0} == {t.number for t in p.tables}
        assert len(flows) == len(p.tables) + sum(len(t.fixed) for t in p.tables)
        assert all(ck.parse_cookie(f.cookie)[:2] == (p.skeleton_app, ck.KIND_STAGE) for f in flows)


def test_the_doc_shows_the_declarations():
    text = DOC.read_text()
    assert cat.update_doc(text) == text, "run: .venv/bin/python -m fathom.pipeline.catalogue docs/pipeline.md"
    for p in cat.PIPELINES.values():
        assert cat.reference_markdown(p) in text
