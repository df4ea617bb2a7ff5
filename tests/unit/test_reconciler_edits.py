"""A known switch gets the change of its desired state worked out from the pass's edit (the owners
that changed), not from a diff of its whole state. Random sequences of writes through the API and
VIFs coming and going, against fake switches (fathom.controller.fakeswitch) with real compilers:
after every pass the change sent from the edit equals a diff of the whole desired state against
what the switch held (check_incremental, on in tests/unit/test_reconciler.Cloud: a difference
raises), every switch holds exactly its desired state, and the edit path is the one taken.
"""
from __future__ import annotations

import random

import pytest

from fathom.controller.edits import UNITE_AFTER, Edit, Edited, edited
from fathom.openflow.spec import SwitchState
from fathom.openflow.spec import FlowSpec
from fathom.pipeline import cookies as ck

from .test_reconciler import LAB, Cloud, holds

NODES = ("compute1", "compute2")


class Writer:
    """Random port, security group and router-interface writes, and VIFs plugged and unplugged."""

    def __init__(self, cloud: Cloud, rng: random.Random):
        self.cloud, self.rng = cloud, rng
        self.nets = list(cloud.ids["nets"].values())
        self.groups = [self.group(f"g{i}") for i in range(2)]
        self.made: dict[int, tuple[str, str]] = {}    # port id -> (node, interface)
        self.n = 0

    def group(self, name: str) -> int:
        return self.cloud.call("POST", "/security-groups", json={"name": name, "project_id": "demo"})["id"]

    def plug(self, node: str, interface: str) -> None:
        self.cloud.boot.ofports.setdefault(node, {})[interface] = 200 + self.n
        self.cloud.rec.ovsdb_changed(node, "ports")

    def unplug(self, node: str, interface: str) -> None:
        if self.cloud.boot.ofports.get(node, {}).pop(interface, None) is not None:
            self.cloud.rec.ovsdb_changed(node, "ports")

    def step(self) -> str:
        rng, cloud = self.rng, self.cloud
        op = rng.choice(["create"] * 4 + ["update", "move", "delete", "unplug", "group", "rule"])
        self.n += 1
        if op == "create" or not self.made:
            node, name = rng.choice(NODES), f"r{self.n}"
            body = {"network_id": rng.choice(self.nets), "name": name, "node": node, "interface_name": name,
                    "project_id": "demo"}
            if rng.random() < 0.5:
                body["security_groups"] = rng.sample(self.groups, rng.randrange(len(self.groups) + 1))
            port = cloud.call("POST", "/ports", json=body)
            self.made[port["id"]] = (node, name)
            if rng.random() < 0.8:
                self.plug(node, name)
            return "create"
        port_id = rng.choice(list(self.made))
        node, name = self.made[port_id]
        if op == "update":
            body = {"security_groups": rng.sample(self.groups, rng.randrange(len(self.groups) + 1))}
            if rng.random() < 0.2:
                body = {"port_security": False, "security_groups": []}
            cloud.call("PATCH", f"/ports/{port_id}", json=body)
        elif op == "move":
            to, iface = rng.choice(NODES), f"m{self.n}"
            cloud.call("PATCH", f"/ports/{port_id}", json={"node": to, "interface_name": iface})
            self.unplug(node, name)
            self.plug(to, iface)
            self.made[port_id] = (to, iface)
        elif op == "delete":
            cloud.call("DELETE", f"/ports/{port_id}")
            self.unplug(node, name)
            del self.made[port_id]
        elif op == "unplug":
            self.unplug(node, name)
        elif op == "group":
            self.groups.append(self.group(f"g{self.n}"))
        else:
            cloud.call("POST", "/security-group-rules", json={
                "security_group_id": rng.choice(self.groups), "direction": "ingress", "ethertype": "IPv4",
                "protocol": "tcp", "port_range_min": 1000 + self.n, "port_range_max": 1000 + self.n})
        return op


@pytest.mark.parametrize("with_fabric", [False, True], ids=["overlay", "fabric"])
@pytest.mark.parametrize("seed", [19, 20])
def test_the_change_from_the_edit_equals_a_whole_diff(tmp_path, seed, with_fabric):
    cloud = Cloud(tmp_path, LAB / "default.yaml", with_fabric=with_fabric)
    try:
        cloud.rec.run_pass()
        writer = Writer(cloud, random.Random(seed))
        before = dict(cloud.rec.applier.diffs)
        edited = 0
        for i in range(60):
            for _ in range(writer.rng.randrange(1, 4)):     # a few writes coalesced into one pass
                writer.step()
            cloud.rec.run_pass(audit=False)
            assert cloud.rec.mismatches == 0
            edited += sum(isinstance(st, Edited) for st in cloud.rec.desired.states.values())
            for key, res in cloud.rec.results.items():
                assert res.state == "ok", (i, key, res.state)
                assert holds(cloud.switches.switches[res.dpid], cloud.rec.desired.states[key]), (i, key)
        edits = cloud.rec.applier.diffs["edit"] - before["edit"]
        whole = cloud.rec.applier.diffs["whole"] - before["whole"]
        assert edits >= 60 and whole == 0, (edits, whole)
        assert edited > 0
        cloud.rec.run_pass(audit=True)                       # read back: nothing was missed
        assert all(r.changes == 0 for r in cloud.rec.last.switches.values())
    finally:
        cloud.close()


def test_a_refused_edit_marks_its_objects_and_the_switch_is_diffed_whole_next(tmp_path):
    cloud = Cloud(tmp_path, LAB / "default.yaml")
    try:
        cloud.rec.run_pass()
        nets = cloud.ids["nets"]
        bad = cloud.call("POST", "/ports", json={"network_id": nets["blue"], "name": "bad", "node": "compute1",
                                                 "interface_name": "bad"})
        good = cloud.call("POST", "/ports", json={"network_id": nets["blue"], "name": "good", "node": "compute1",
                                                  "interface_name": "good"})
        cloud.boot.ofports["compute1"].update(bad=30, good=31)
        sw = cloud.br_int("compute1")
        sw.refuse(lambda spec: ck.parse_cookie(spec.cookie)[1:] == (ck.KIND_PORT, bad["id"]))
        edits = cloud.rec.applier.diffs["edit"]
        cloud.rec.run_pass(audit=False)
        assert cloud.rec.applier.diffs["edit"] > edits                # the change came from the edit
        assert cloud.get(f"/ports/{bad['id']}")["status"] == "error"
        assert cloud.get(f"/ports/{good['id']}")["status"] == "active"
        ours = {f for f in sw.read_flows() if ck.owns_cookie(f.cookie)}
        want = {f for f in cloud.rec.last.br_int("compute1").flows
                if ck.parse_cookie(f.cookie)[1:] != (ck.KIND_PORT, bad["id"])}
        assert ours == want                                   # all but the refused port's flows
        assert sw.dpid not in cloud.rec.applier.known                 # so the next pass reads the switch back
        sw.refuse(None)
        reads, whole = sw.reads, cloud.rec.applier.diffs["whole"]
        cloud.call("PATCH", f"/ports/{good['id']}", json={"name": "good2"})   # any write wakes a pass
        cloud.rec.run_pass(audit=False)
        assert sw.reads > reads and cloud.rec.applier.diffs["whole"] > whole
        assert cloud.get(f"/ports/{bad['id']}")["status"] == "active"
        assert holds(sw, cloud.rec.last.br_int("compute1"))
    finally:
        cloud.close()


def test_an_edited_state_equals_the_state_it_stands_for():
    flow = lambda n: FlowSpec(0, 100, {"in_port": n}, (), n)   # noqa: E731
    plain = {flow(n) for n in range(1, 6)}
    state = SwitchState(frozenset(plain))
    rng = random.Random(3)
    united_at_limit = False
    for i in range(3 * UNITE_AFTER):
        edit = Edit()
        out = set(rng.sample(sorted(plain, key=lambda f: f.cookie), min(2, len(plain))))
        into = out & set(rng.sample(sorted(out, key=lambda f: f.cookie), len(out) // 2)) | {flow(100 + i)}
        edit.gone.append(SwitchState(frozenset(out)))
        edit.new.append(SwitchState(frozenset(into)))
        state = edited(state, edit)
        plain = plain - out | into
        # chained, not made whole, until UNITE_AFTER edits; then made whole at once
        assert (state._flows is None) == (state._depth < UNITE_AFTER), i
        united_at_limit = united_at_limit or state._depth == UNITE_AFTER
        if i < 20 and i % 7 == 0:   # read a few times (as an audit or the API would): equal, then whole
            expected = SwitchState(frozenset(plain))
            assert state == expected and expected == state and hash(state) == hash(expected)
            assert {expected: 1}[state] == 1 and state._base is None
    assert united_at_limit and state.flows == frozenset(plain) and state != SwitchState(frozenset({flow(1)}))
