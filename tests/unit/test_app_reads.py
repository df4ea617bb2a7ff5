"""Every app reads only what it declares (fathom.apps.base.Reads): compiled over every golden
model (tests/unit/golden_flows.py) through a view that records what is read. An undeclared read is
a change the incremental reconciler would not see: a stale flow, not a failed test, without this.
tests/unit/test_incremental.py checks the models its changes make the same way."""
from __future__ import annotations

from dataclasses import replace

from fathom.apps import registry
from fathom.apps.base import Reads
from fathom.apps.incremental import declared_touched
from fathom.model import Node, Port, Snapshot

from . import golden_flows
from .app_reads import problems


def test_every_app_reads_only_what_it_declares():
    out = set()
    for path, name, model in golden_flows.models():
        for app in registry():
            out |= {f"{p} ({path.name} [{name}])" for p in problems(app, model)}
    assert not out, "\n".join(sorted(out))


def test_the_check_sees_an_undeclared_field_and_a_dependency_no_reference_reaches():
    """A declaration missing a field the compile reads fails; so does an owner whose flows read an
    object its references do not name (here: a policy reading every port)."""
    _, _, model = next(m for m in golden_flows.models() if m[2].tap_policies)
    vtap = next(a for a in registry() if a.name == "vtap")
    fields = dict(vtap.reads.fields)
    fields["ports"] = fields["ports"] - {"mac_address"}
    assert any("reads ports.mac_address" in p for p in problems(replace(vtap, reads=replace(vtap.reads, fields=fields)), model))

    def compile_all_ports(m):
        [p.node for p in m.ports]
        return vtap.compile(m)
    nosy = replace(vtap, compile=compile_all_ports, compile_owners=lambda m, owners: compile_all_ports(m))
    assert any("which it does not reach" in p for p in problems(nosy, model))


def test_declared_touched_follows_references_and_compiles_whole_on_a_collection_no_owner_reaches():
    reads = Reads({"nodes": frozenset({"name", "ofports"}), "ports": frozenset({"network_id", "ofport", "node", "interface"}),
                   "networks": frozenset({"id"}), "port_pairs": frozenset({"id", "ingress_port_id"})},
                  owners={"port_pairs": 7}, refs={"port_pairs": {"ingress_port_id": "ports"}})
    touched = declared_touched(9, reads)
    from fathom.model import PortPair
    node = Node(1, "n1", "compute", None, None, ofports={"a": 5})
    before = Snapshot(nodes=(node,), ports=(Port(1, "a", "", 1, "m", node="n1", interface="a"),
                                            Port(2, "b", "", 1, "m", node="n1", interface="b")),
                      port_pairs=(PortPair(3, "pp", "", 1, 2),))
    assert touched(before, before) == set()
    plugged = replace(before, nodes=(replace(node, ofports={"a": 6}),))
    assert touched(before, plugged) == {(9, 7, 3)}
    other = replace(before, nodes=(replace(node, ofports={"a": 5, "b": 1}),))   # not the pair's ingress
    assert touched(before, other) == set()
    tunnel = replace(before, nodes=(replace(node, ofports={"a": 5, "vxlan0": 1}),))
    assert touched(before, tunnel) == "nodes changed"
