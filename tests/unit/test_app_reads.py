"""The engine that works out, from what an app declares it reads (fathom.apps.base.Reads), the
owners a change touches (fathom.apps.incremental.declared_touched). That every app reads only
what it declares is checked over the golden models (tests/unit/test_golden_flows.py, which makes
them) and over the models of tests/unit/test_incremental.py's changes (tests/unit/app_reads.py)."""
from __future__ import annotations

from dataclasses import replace

from fathom.apps.base import Reads
from fathom.apps.incremental import declared_touched
from fathom.model import Node, Port, PortPair, Snapshot


def test_declared_touched_follows_references_and_compiles_whole_on_a_collection_no_owner_reaches():
    reads = Reads({"nodes": frozenset({"name", "ofports"}), "ports": frozenset({"network_id", "ofport", "node", "interface"}),
                   "networks": frozenset({"id"}), "port_pairs": frozenset({"id", "ingress_port_id"})},
                  owners={"port_pairs": 7}, refs={"port_pairs": {"ingress_port_id": "ports"}}, quiet=("port_pairs",))
    touched = declared_touched(9, reads)
    node = Node(1, "n1", "compute", None, None, ofports={"a": 5})
    before = Snapshot(nodes=(node,), ports=(Port(1, "a", "", 1, "m", node="n1", interface="a"),
                                            Port(2, "b", "", 1, "m", node="n1", interface="b")),
                      port_pairs=(PortPair(3, "pp", "", 1, 2),))
    assert touched(before, before) == set()
    plugged = replace(before, nodes=(replace(node, ofports={"a": 6}),))        # the pair's ingress, moved
    assert touched(before, plugged) == {(9, 7, 3)}
    other = replace(before, nodes=(replace(node, ofports={"a": 5, "b": 1}),))   # a port the pair does not name
    assert touched(before, other) == set()
    renamed = replace(before, ports=(replace(before.ports[0], name="x"), before.ports[1]))  # a field not read
    assert touched(before, renamed) == set()
    tunnel = replace(before, nodes=(replace(node, ofports={"a": 5, "vxlan0": 1}),))
    assert touched(before, tunnel) == "nodes changed"
    # without a pair in either model, nothing is touched, whatever changed
    assert touched(replace(before, port_pairs=()), replace(tunnel, port_pairs=())) == set()
