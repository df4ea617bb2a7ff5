"""The fake switch answers role requests and a slave's writes as OVS does (tests/lab/test_cluster_roles.py
shows OVS itself): a newer master demotes the older, whose writes and older epoch are refused."""
from __future__ import annotations

import pytest

from fathom.controller.fakeswitch import FakeSwitch
from fathom.controller.switch import NO_GENERATION, NotMaster
from fathom.openflow.encode import Wire
from fathom.openflow.spec import FlowSpec, Output


def _flow(sw, cookie: int):
    f = FlowSpec(table=0, priority=10, match={"in_port": cookie & 0xff}, actions=(Output(2),), cookie=cookie)
    return [(f, Wire(sw.dp, "flow", f))]


def test_a_newer_epoch_fences_the_old_master():
    switch = FakeSwitch(0xc1)
    a, b = switch.connect("a"), switch.connect("b")
    a.bundle(_flow(switch, 0xa0))                # every connection starts equal: it may write
    assert a.request_role(5) == 5 and b.request_role(6) == 6
    assert switch.demoted == ["a"]
    with pytest.raises(NotMaster, match="IS_SLAVE"):
        a.bundle(_flow(switch, 0xa1))
    with pytest.raises(NotMaster, match="STALE"):
        a.request_role(5)
    b.bundle(_flow(switch, 0xb1))
    assert {f.cookie for f in switch.read_flows()} == {0xa0, 0xb1}
    assert a.request_role(None) == 6             # slave: carries no epoch of its own
    assert b.request_role(6) == 6                # an equal generation_id is not stale


def test_generation_ids_compare_in_circular_order():
    switch = FakeSwitch(0xc2)
    assert switch.request_role(None) == NO_GENERATION
    switch.request_role(2**64 - 1)
    assert switch.connect("b").request_role(0) == 0      # 0 follows 2^64 - 1
    with pytest.raises(NotMaster):
        switch.request_role(2**64 - 2)
