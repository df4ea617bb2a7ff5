"""The reconciler against fake switches (fathom.controller.fakeswitch): real store, real compilers,
real encoded OpenFlow messages decoded by the switch; no root, no OVS.

The cloud is registered through the API like the lab does (tests/unit/golden_flows.py); the only
stand-in is the OVSDB bootstrap, which reports fixed OpenFlow port numbers.
"""
from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from fathom.api.app import create_app

from .auth import headers_for
from fathom.apps import BR_INT, FABRIC_SWITCH, SwitchKey
from fathom.controller.extension import Extension, NodeBootstrap
from fathom.controller.fakeswitch import FakeSwitches
from fathom.controller.reconciler import Reconciler
from fathom.lab import topology
from fathom.model import datapath_id, datapath_id_phy, datapath_id_fabric
from fathom.openflow.spec import FlowSpec, Output
from fathom.pipeline import cookies as ck
from fathom.store.db import session_factory
from fathom.store.snapshot import load_snapshot

from . import golden_flows

LAB = golden_flows.ROOT / "fathom/lab/topologies"
BENCH = golden_flows.ROOT / "fathom/bench/topologies"


class FixedBootstrap(NodeBootstrap):
    """The node bootstrap without OVSDB: every node is complete, its ports numbered like the golden
    file's (vxlan0 = 1, patch-phy = 2, VMs from 10, network-node router interfaces from 100)."""

    def __init__(self, ofports):
        self.ofports = ofports
        self.nodes = {}
        self.failing: set[str] = set()
        self.held: dict[str, threading.Event] = {}
        self.runs: dict[str, int] = {}

    def run(self, node):
        self.runs[node.name] = self.runs.get(node.name, 0) + 1
        held = self.held.get(node.name)
        if held is not None:   # an OVSDB that does not answer yet
            held.wait(30)
        if node.name in self.failing:
            return "error", "OVSDB unreachable (test)", {}
        return "complete", None, self.ofports.get(node.name, {})

    def current(self, node):
        """What the OVSDB replica says (None: its connection is down)."""
        return None if node.name in self.failing else ("complete", None, dict(self.ofports.get(node.name, {})))


class FixedFabric(Extension):
    """The fabric extension without OVSDB: the fabric switch's port facing the i-th node is i; on every br-phy
    patch-int = 1, ul0 = 2 (as in the golden file)."""

    def __init__(self, topo):
        self.topo = topo

    def prepare(self, rec, snapshot, result):
        from dataclasses import replace
        fab = snapshot.fabric
        if fab is None or not fab.switches:
            return snapshot
        ports = {s.name: {n.name: i + 1 for i, n in enumerate(self.topo.nodes)} for s in fab.switches}
        phy = {n.name: {"patch-int": 1, "ul0": 2} for n in self.topo.nodes}
        return replace(snapshot, fabric=fab.with_ofports(ports)).with_phy_ofports(phy)

    def after_pass(self, rec, snapshot, result):
        pass


class Cloud:
    def __init__(self, tmp_path, path, with_fabric=False, mode="distributed", taps=False):
        self.topo = topology.load(path)
        self.api = create_app(f"sqlite:///{tmp_path}/fathom.db")
        self.client = TestClient(self.api, headers=headers_for(self.api))
        self.ids = golden_flows.register(self.client, self.topo, with_fabric, mode, taps=taps)
        with session_factory(self.api.state.engine)() as s:
            snap = load_snapshot(s)
        self.switches = FakeSwitches()
        self.boot = FixedBootstrap(golden_flows.ofports(self.topo, snap, mode))
        # a controller whose switches are all there from its first pass: no startup grace to wait out
        self.rec = self.controller(startup_grace=0.0)
        # as fathom.controller.server wires them: API writes wake the reconciler, long-polls wait on its board
        self.api.state.store.on_change = self.rec.wake
        self.api.state.status_board = self.rec.board
        self.rec.extensions.append(FixedFabric(self.topo))
        self.nodes = {n.name: n.id for n in snap.nodes}
        for node_id in self.nodes.values():
            self.switches.add(datapath_id(node_id))
            if with_fabric:
                self.switches.add(datapath_id_phy(node_id))
        if with_fabric:
            self.switches.add(datapath_id_fabric(snap.fabric.switches[0].id))

    def controller(self, startup_grace: float) -> Reconciler:
        """A controller (its reconciler) on this cloud's store and switches."""
        return Reconciler(session_factory(self.api.state.engine), self.switches, self.boot,
                          check_incremental=True, startup_grace=startup_grace)

    def br_int(self, node: str):
        return self.switches.switches[datapath_id(self.nodes[node])]

    def get(self, path: str):
        r = self.client.get("/v1" + path)
        assert r.status_code == 200, r.text
        return r.json()

    def call(self, method: str, path: str, **kw):
        r = self.client.request(method, "/v1" + path, **kw)
        assert r.status_code < 400, r.text
        return r.json() if r.content else None

    def close(self):
        self.client.close()
        self.api.state.engine.dispose()


@pytest.fixture
def cloud(tmp_path):
    c = Cloud(tmp_path, LAB / "default.yaml")
    yield c
    c.close()


def holds(switch, state) -> bool:
    """The switch holds exactly this state among what fathom owns (groups and meters by content)."""
    return ({f for f in switch.read_flows() if ck.owns_cookie(f.cookie)} == set(state.flows)
            and {g for g in switch.read_groups() if ck.owns_id(g.group_id)} == set(state.groups)
            and {m.key for m in switch.read_meters() if ck.owns_id(m.meter_id)} == {m.key for m in state.meters})


def test_first_pass_installs_everything_then_an_in_sync_pass_sends_nothing(cloud):
    result = cloud.rec.run_pass()
    for name in cloud.nodes:
        assert holds(cloud.br_int(name), result.br_int(name)), name
        assert result.nodes[name].switch == "ok"
    sent = len(cloud.switches.journal)
    assert sent > 0
    again = cloud.rec.run_pass(audit=True)          # reads every switch back
    assert len(cloud.switches.journal) == sent
    assert all(r.changes == 0 for r in again.switches.values())
    reads = sum(s.reads for s in cloud.switches.switches.values())
    cloud.rec.run_pass(audit=False)                 # trusts what it sent: not even a read
    assert len(cloud.switches.journal) == sent
    assert sum(s.reads for s in cloud.switches.switches.values()) == reads


def test_flows_of_others_are_left_alone(cloud):
    foreign = FlowSpec(0, 5, {"in_port": 77}, (Output(78),), 0)
    cloud.br_int("compute1").add_foreign_flow(foreign)
    cloud.rec.run_pass()
    assert foreign in cloud.br_int("compute1").read_flows()


def test_reconnect_rereads_and_repairs(cloud):
    cloud.rec.run_pass()
    sw = cloud.br_int("compute2")
    lost = next(f for f in sw.flows.values() if ck.parse_cookie(f.cookie)[1] == ck.KIND_PORT)
    del sw.flows[lost.key]                          # e.g. the switch restarted and lost a flow
    cloud.rec.run_pass(audit=False)                 # trusts its memory: does not see it
    assert lost not in sw.read_flows()
    reads = sw.reads
    cloud.rec.switch_changed(sw.dpid)               # the switch reconnects
    cloud.rec.run_pass(audit=False)
    assert sw.reads == reads + 1 and lost in sw.read_flows()
    assert [len(m) for how, m in sw.sent[-1:]] == [1]   # only the lost flow went out again


def test_groups_and_meters_are_ordered_around_the_bundle(cloud):
    cloud.rec.run_pass()
    for s in cloud.switches.switches.values():
        s.sent.clear()
    vms = [v.name for _, v in cloud.topo.vms()]
    tap = cloud.call("POST", "/taps", json={"sender": vms[0], "receiver": vms[1], "monitor": vms[2],
                                             "rate_pps": 100})
    cloud.rec.run_pass(audit=False)
    sender = cloud.br_int("compute1")
    kinds = [(how, [type(m).__name__ for m in msgs]) for how, msgs in sender.sent]
    # the meter exists before the bundle whose flows use it; in the bundle, groups before flows
    assert kinds[0] == ("plain", ["OFPMeterMod"]) and kinds[1][0] == "bundle"
    names = kinds[1][1]
    assert names.index("OFPGroupMod") < min(i for i, n in enumerate(names) if n == "OFPFlowMod")
    for s in cloud.switches.switches.values():
        s.sent.clear()
    cloud.call("DELETE", f"/taps/{tap['id']}")
    cloud.rec.run_pass(audit=False)
    kinds = [(how, [type(m).__name__ for m in msgs]) for how, msgs in sender.sent]
    # flows go first, then the group they used (same bundle), then the meter
    assert [k[0] for k in kinds] == ["bundle", "plain"] and kinds[1][1] == ["OFPMeterMod"]
    names = kinds[0][1]
    assert max(i for i, n in enumerate(names) if n == "OFPFlowMod") < names.index("OFPGroupMod")
    assert not sender.read_meters() and not [g for g in sender.read_groups() if ck.parse_group_id(g.group_id)[0] == 3]


def test_a_refused_change_marks_exactly_the_objects_it_carried(cloud):
    ports = cloud.ids["ports"]
    bad = ports["vm1"]
    sw = cloud.br_int("compute1")
    sw.refuse(lambda spec: ck.parse_cookie(spec.cookie)[1:] == (ck.KIND_PORT, bad))
    result = cloud.rec.run_pass()
    got = cloud.get(f"/ports/{bad}")
    assert got["status"] == "error" and "br-int compute1" in got["status_reason"]
    for name in ("vm2", "vm3", "vm4"):
        assert cloud.get(f"/ports/{ports[name]}")["status"] == "active", name
    # everything else reached the switch; nothing of vm1 did
    ours = {f for f in sw.read_flows() if ck.owns_cookie(f.cookie)}
    want = {f for f in result.br_int("compute1").flows if ck.parse_cookie(f.cookie)[1:] != (ck.KIND_PORT, bad)}
    assert ours == want
    assert result.nodes["compute1"].switch == "ok"
    sw.refuse(None)                                  # the switch takes it now: repaired next pass
    cloud.rec.run_pass()
    assert cloud.get(f"/ports/{bad}")["status"] == "active"
    assert holds(sw, cloud.rec.last.br_int("compute1"))


def test_a_restarted_controller_keeps_the_statuses_until_its_switches_are_back(cloud):
    ports = cloud.ids["ports"]
    cloud.rec.run_pass()
    assert all(cloud.get(f"/ports/{p}")["status"] == "active" for p in ports.values())
    compute2 = cloud.br_int("compute2").dpid
    cloud.switches.down.add(compute2)      # not reconnected yet to the new controller
    restarted = cloud.controller(startup_grace=60.0)
    restarted.run_pass()
    assert all(cloud.get(f"/ports/{p}")["status"] == "active" for p in ports.values())
    cloud.switches.down.clear()
    restarted.switch_changed(compute2)
    restarted.run_pass()
    assert all(cloud.get(f"/ports/{p}")["status"] == "active" for p in ports.values())
    assert restarted.results[SwitchKey(BR_INT, "compute2")].state == "ok"
    # a switch still away when the grace ends: the next check turns its objects pending
    cloud.switches.down.add(compute2)
    late = cloud.controller(startup_grace=60.0)
    late.run_pass()
    assert cloud.get(f"/ports/{ports['vm3']}")["status"] == "active"
    assert not late.check()
    late.statuses.grace_ends = time.monotonic()    # the grace ends (a set time: however long the pass took)
    assert late.check()
    late.run_pass()
    got = cloud.get(f"/ports/{ports['vm3']}")
    assert got["status"] == "pending" and "node compute2: br-int not connected" in got["status_reason"], got
    assert cloud.get(f"/ports/{ports['vm1']}")["status"] == "active"


def test_a_restarted_controller_leaves_a_node_it_has_not_read_yet_alone(cloud, monkeypatch):
    """A restarted controller on a busy host: a node's first OVSDB check answers after the pass
    stopped waiting for it. Without its port numbers, a compile would take every port's flows off
    its br-int until the check answers; its br-int is left as it is instead, and reconciled (nothing
    to change) once the check answers. Statuses stay the last controller's meanwhile."""
    from fathom.controller import setups
    monkeypatch.setattr(setups, "SETUP_WAIT", 0.05)
    ports = cloud.ids["ports"]
    cloud.rec.run_pass()
    compute2 = cloud.br_int("compute2")
    flows = dict(compute2.flows)
    cloud.boot.held["compute2"] = release = threading.Event()
    restarted = cloud.controller(startup_grace=60.0)
    cloud.switches.journal.clear()
    result = restarted.run_pass(audit=False)
    assert compute2.flows == flows and not [d for d, _, _ in cloud.switches.journal if d == compute2.dpid]
    assert result.switches[SwitchKey(BR_INT, "compute2")].state == "not reconciled (its OVSDB not read yet)"
    assert all(cloud.get(f"/ports/{p}")["status"] == "active" for p in ports.values())
    release.set()
    del cloud.boot.held["compute2"]
    deadline = time.monotonic() + 5
    while not restarted._setups._jobs["compute2"][1].done() and time.monotonic() < deadline:
        time.sleep(0.01)                                                  # its check answers
    restarted.run_pass(audit=False)
    assert restarted.results[SwitchKey(BR_INT, "compute2")].state == "ok" and compute2.flows == flows
    assert all(cloud.get(f"/ports/{p}")["status"] == "active" for p in ports.values())


def test_status_follows_the_switches(cloud):
    ports = cloud.ids["ports"]
    compute2 = cloud.br_int("compute2").dpid
    cloud.switches.down.add(compute2)               # not connected yet
    cloud.rec.run_pass()
    # compute2's own ports wait for it; vm1 and vm2 (compute1) have flows there too (the way to
    # reach them from compute2), but work for everyone else, and so do the network and subnet
    for name in ("vm3", "vm4"):
        got = cloud.get(f"/ports/{ports[name]}")
        assert got["status"] == "pending" and "node compute2: br-int not connected" in got["status_reason"], got
    for name in ("vm1", "vm2"):
        assert cloud.get(f"/ports/{ports[name]}")["status"] == "active", name
    assert cloud.get(f"/nodes/{cloud.nodes['compute2']}")["status"] == "pending"
    assert cloud.get(f"/nodes/{cloud.nodes['compute1']}")["status"] == "active"
    net = cloud.get(f"/networks/{cloud.ids['nets']['blue']}")
    subnet = cloud.get(f"/subnets/{cloud.ids['subnets']['blue']}")
    assert net["status"] == subnet["status"] == "active"
    cloud.switches.down.clear()
    cloud.rec.switch_changed(compute2)
    cloud.rec.run_pass()
    assert all(cloud.get(f"/ports/{p}")["status"] == "active" for p in ports.values())
    assert cloud.get(f"/subnets/{cloud.ids['subnets']['blue']}")["status"] == "active"
    # a node whose OVSDB fails: its node is in error, its br-int is left alone
    cloud.boot.failing.add("compute2")
    result = cloud.rec.run_pass()
    assert result.switches[SwitchKey(BR_INT, "compute2")].state.startswith("not reconciled")
    assert cloud.get(f"/nodes/{cloud.nodes['compute2']}")["status"] == "error"


def test_a_node_whose_check_hangs_holds_up_no_other_node(cloud):
    """A pass waits SETUP_WAIT at most for a node's OVSDB check; the node stays as the last pass
    left it while the check runs, the other nodes' changes go out, and the check's end wakes the
    pass that takes its answer."""
    from fathom.controller.setups import SETUP_WAIT
    cloud.rec.run_pass()
    local = {f for f in cloud.br_int("compute2").read_flows() if "in_port" in f.match_dict}
    cloud.boot.held["compute2"] = release = threading.Event()
    cloud.boot.failing.add("compute2")                  # what its check will find, once it ends
    cloud.rec.ovsdb_changed("compute2", "setup")        # its bridges to be checked again
    vm = cloud.call("POST", "/ports", json={"network_id": cloud.ids["nets"]["blue"], "name": "late",
                                             "node": "compute1", "interface_name": "tap-late"})
    cloud.boot.ofports["compute1"]["tap-late"] = 77
    t = time.monotonic()
    result = cloud.rec.run_pass(audit=False)
    assert time.monotonic() - t < SETUP_WAIT + 2
    assert holds(cloud.br_int("compute1"), result.br_int("compute1"))
    assert any(f.match_dict.get("in_port") == 77 for f in cloud.br_int("compute1").read_flows())
    assert result.nodes["compute2"].bootstrap == "complete"     # as before: its answer is not in
    # compiled with the port numbers it had: its own ports' flows stay
    assert holds(cloud.br_int("compute2"), result.br_int("compute2"))
    assert local <= set(cloud.br_int("compute2").read_flows())
    assert cloud.get(f"/nodes/{cloud.nodes['compute2']}")["status"] == "active"
    assert "ovsdb" not in cloud.rec._events.triggers             # nothing came back meanwhile
    release.set()
    deadline = time.monotonic() + 5
    while not cloud.rec._wake.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cloud.rec._events.setup == {"compute2"}          # the late answer woke a pass for it
    result = cloud.rec.run_pass(audit=False)
    assert result.nodes["compute2"].bootstrap == "error"
    assert cloud.get(f"/nodes/{cloud.nodes['compute2']}")["status"] == "error"
    assert cloud.get(f"/ports/{vm['id']}")["status"] == "active"


def test_a_node_in_error_is_checked_again_once_due_without_holding_up_any_pass(cloud, monkeypatch):
    """A dead host's node is checked again RETRY_FIRST after its failure (not by every pass: a pass
    and a check as fast as they failed kept a core busy at 100 unreachable nodes); those checks
    end at their connection timeout and no pass waits for them (their end wakes one that takes
    the answer)."""
    from fathom.controller import setups
    monkeypatch.setattr(setups, "RETRY_FIRST", 0.3)
    # a pass that waited for the hanging check would take SETUP_WAIT: long enough here that a pass
    # slowed by a loaded machine is told from one that waited
    SETUP_WAIT = 5.0
    monkeypatch.setattr(setups, "SETUP_WAIT", SETUP_WAIT)
    cloud.rec.run_pass()
    cloud.boot.failing.add("compute2")
    cloud.rec.ovsdb_changed("compute2", "setup")
    assert cloud.rec.run_pass(audit=False).nodes["compute2"].bootstrap == "error"
    runs = cloud.boot.runs["compute2"]
    cloud.rec.ovsdb_changed("compute2", "setup")
    assert cloud.rec.run_pass(audit=False).nodes["compute2"].bootstrap == "error"
    assert cloud.boot.runs["compute2"] == runs                     # not due yet: not checked
    time.sleep(0.35)
    cloud.boot.held["compute2"] = release = threading.Event()     # its next check hangs
    vm = cloud.call("POST", "/ports", json={"network_id": cloud.ids["nets"]["blue"], "name": "late",
                                             "node": "compute1", "interface_name": "tap-late"})
    cloud.boot.ofports["compute1"]["tap-late"] = 77
    t = time.monotonic()
    result = cloud.rec.run_pass(audit=False)
    assert time.monotonic() - t < SETUP_WAIT / 2
    assert any(f.match_dict.get("in_port") == 77 for f in cloud.br_int("compute1").read_flows())
    assert result.nodes["compute2"].bootstrap == "error"
    assert cloud.get(f"/ports/{vm['id']}")["status"] == "active"
    cloud.boot.failing.discard("compute2")                         # the host is back
    release.set()
    # the check's end posts its node's event, which wakes a pass (the port's write may have woken
    # the loop already: its wake can come after the pass above took the events)
    deadline = time.monotonic() + 5
    while "compute2" not in cloud.rec._events.setup and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cloud.rec._events.setup == {"compute2"} and cloud.rec._wake.is_set()
    assert cloud.rec.run_pass(audit=False).nodes["compute2"].bootstrap == "complete"
    assert cloud.get(f"/nodes/{cloud.nodes['compute2']}")["status"] == "active"


def test_a_lost_switch_marks_its_node_and_its_ports_only(cloud):
    ports = cloud.ids["ports"]
    cloud.rec.run_pass()
    compute2 = cloud.br_int("compute2").dpid
    cloud.switches.disconnect(compute2)              # its ovs-vswitchd died
    cloud.rec.switch_changed(compute2)
    result = cloud.rec.run_pass()
    assert result.switches[SwitchKey(BR_INT, "compute2")].state.startswith("lost: ")
    node = cloud.get(f"/nodes/{cloud.nodes['compute2']}")
    assert node["status"] == "error" and node["status_reason"].startswith("br-int's OpenFlow connection closed at ")
    assert node["status_reason"].endswith("(ovs-vswitchd down or unreachable)")
    for name in ("vm3", "vm4"):
        got = cloud.get(f"/ports/{ports[name]}")
        assert got["status"] == "error" and "node compute2: br-int's OpenFlow connection" in got["status_reason"], got
    for name in ("vm1", "vm2"):
        assert cloud.get(f"/ports/{ports[name]}")["status"] == "active", name
    assert cloud.get(f"/nodes/{cloud.nodes['compute1']}")["status"] == "active"
    assert cloud.get(f"/networks/{cloud.ids['nets']['blue']}")["status"] == "active"
    cloud.switches.add(compute2)                     # back, tables as they were
    cloud.rec.switch_changed(compute2)
    result = cloud.rec.run_pass()
    assert holds(cloud.br_int("compute2"), result.br_int("compute2"))
    assert all(cloud.get(f"/ports/{p}")["status"] == "active" for p in ports.values())


def test_a_switch_lost_while_it_is_written_is_lost_not_refusing(cloud):
    sw = cloud.br_int("compute2")

    def drop(spec):
        cloud.switches.disconnect(sw.dpid)           # the connection closes under the bundle
        return True
    sw.refuse(drop)
    result = cloud.rec.run_pass()
    assert result.switches[SwitchKey(BR_INT, "compute2")].state.startswith("lost: ")
    assert result.refused == {}
    assert cloud.get(f"/nodes/{cloud.nodes['compute2']}")["status"] == "error"
    assert cloud.get(f"/ports/{cloud.ids['ports']['vm1']}")["status"] == "active"


def test_tap_is_active_only_when_the_switches_hold_it(cloud):
    cloud.rec.run_pass()
    vms = [v.name for _, v in cloud.topo.vms()]
    tap = cloud.call("POST", "/taps", json={"sender": vms[0], "receiver": vms[1], "monitor": vms[2]})
    assert cloud.get(f"/taps/{tap['id']}")["status"] == "pending"
    # a tap has no home node: it waits only while no switch holding it is healthy
    cloud.switches.down.add(cloud.br_int("compute2").dpid)        # the monitor's node
    cloud.rec.run_pass()
    assert cloud.get(f"/taps/{tap['id']}")["status"] == "active"
    cloud.switches.down.add(cloud.br_int("compute1").dpid)        # the sender's too
    cloud.rec.run_pass()
    got = cloud.get(f"/taps/{tap['id']}")
    assert got["status"] == "pending" and "node compute1" in got["status_reason"]
    cloud.switches.down.clear()
    cloud.rec.run_pass()
    assert cloud.get(f"/taps/{tap['id']}")["status"] == "active"


def test_router_mode_change_is_make_before_break_across_switches(tmp_path):
    c = Cloud(tmp_path, BENCH / "l3.yaml", with_fabric=True)
    try:
        c.rec.run_pass()
        router = c.ids["routers"]["r1"]
        assert c.get(f"/routers/{router}")["status"] == "active"
        c.switches.journal.clear()
        for switch in c.switches.switches.values():   # as a real datapath's cached flows would
            switch.settle = 0.03
        c.call("PATCH", f"/routers/{router}", json={"mode": "fabric"})
        result = c.rec.run_pass(audit=False)
        adds = [i for i, (_, _, msgs) in enumerate(c.switches.journal) if any(_is_add(m) for m in msgs)]
        deletes = [i for i, (_, _, msgs) in enumerate(c.switches.journal) if any(not _is_add(m) for m in msgs)]
        assert adds and deletes and max(adds) < min(deletes)   # nothing leaves any switch before all is in
        assert c.rec.last_pass_steps["settle"] >= 0.03          # and the old path drained in between
        tor = c.switches.switches[result.switches[SwitchKey(FABRIC_SWITCH, "fabric")].dpid]
        assert holds(tor, result.desired[SwitchKey(FABRIC_SWITCH, "fabric")])
        assert c.get(f"/routers/{router}")["status"] == "active"
        c.switches.down.add(tor.dpid)                            # the router lives in the fabric switch now
        c.rec.run_pass()
        got = c.get(f"/routers/{router}")
        assert got["status"] == "pending" and "fabric switch fabric: not connected" in got["status_reason"]
        c.switches.disconnect(tor.dpid)                          # it was connected: lost
        c.rec.run_pass()
        got = c.get(f"/routers/{router}")
        assert got["status"] == "error" and "fabric switch fabric: OpenFlow connection closed" in got["status_reason"]
        switch = c.get("/fabric/switches")[0]
        assert switch["status"] == "error" and "(ovs-vswitchd down or unreachable)" in switch["status_reason"]
        # the nodes' own objects do not depend on the fabric switch's health
        assert {p["status"] for p in c.get("/ports") if p["node"]} == {"active"}
    finally:
        c.close()


class _Timed(list):
    """A switch journal that also keeps when each message set arrived."""

    def __init__(self):
        super().__init__()
        self.at: list[float] = []

    def append(self, item) -> None:
        self.at.append(time.monotonic())
        super().append(item)


def test_the_tor_takes_the_old_path_away_only_after_the_nodes_datapaths_let_go(tmp_path):
    """Back from `fabric`: the nodes stop sending the gateway MAC up the trunk and the fabric switch drops
    its router; between the nodes' break and the fabric switch's the pass waits the settle time, so no node
    datapath still sends by the fabric switch's router when it goes."""
    c = Cloud(tmp_path, BENCH / "l3.yaml", with_fabric=True)
    try:
        c.rec.run_pass()
        router = c.ids["routers"]["r1"]
        c.call("PATCH", f"/routers/{router}", json={"mode": "fabric"})
        result = c.rec.run_pass(audit=False)
        tor = result.switches[SwitchKey(FABRIC_SWITCH, "fabric")].dpid
        timed = _Timed()
        c.switches.journal = timed
        for switch in c.switches.switches.values():
            switch.journal, switch.settle = timed, 0.03
        c.call("PATCH", f"/routers/{router}", json={"mode": "distributed"})
        c.rec.run_pass(audit=False)
        breaks = [(at, dpid) for at, (dpid, _, msgs) in zip(timed.at, timed) if any(not _is_add(m) for m in msgs)]
        nodes_done = max(at for at, dpid in breaks if dpid != tor)
        tor_starts = min(at for at, dpid in breaks if dpid == tor)
        assert tor_starts - nodes_done >= 0.03, breaks
        assert c.get(f"/routers/{router}")["status"] == "active"
    finally:
        c.close()


def test_a_new_port_turns_active_once_the_datapaths_that_took_its_flows_settled(cloud):
    """A pass that only adds (a new port with its VIF: its flows on its node, its address on the
    others) has no old path to drain, so it does not wait before a break; but the port turns
    `active` only once the datapaths had the settle time after the make (a VIF that sent before
    its flows came has a cached drop until the revalidators go over it) and each switch that took
    the change answered a barrier after it."""
    cloud.rec.run_pass()
    timed = _Timed()
    cloud.switches.journal = timed
    for switch in cloud.switches.switches.values():
        switch.journal, switch.settle = timed, 0.03
    port = cloud.call("POST", "/ports", json={"network_id": cloud.ids["nets"]["blue"], "name": "new",
                                              "node": "compute1", "interface_name": "tap-new"})
    cloud.boot.ofports["compute1"]["tap-new"] = 77
    published = []
    publish = cloud.rec.board.publish
    cloud.rec.board.publish = lambda *a: (published.append(time.monotonic()), publish(*a))
    barriers = {dpid: s.barriers for dpid, s in cloud.switches.switches.items()}
    cloud.rec.run_pass(audit=False)
    made = {dpid for dpid, _, _ in timed}
    assert len(made) > 1                                                   # several switches changed
    assert "settle" not in cloud.rec.last_pass_steps                       # nothing to drain
    assert published[-1] - max(timed.at) >= 0.03                           # the settle time after the make
    assert {d for d, s in cloud.switches.switches.items() if s.barriers > barriers[d]} == made
    assert cloud.get(f"/ports/{port['id']}")["status"] == "active"
    # a pass that turns nothing active waits for nothing
    cloud.call("PATCH", f"/ports/{port['id']}", json={"name": "renamed"})
    cloud.rec.run_pass(audit=False)
    assert "revalidate" not in cloud.rec.last_pass_steps


def _is_add(msg) -> bool:
    ofp = msg.datapath.ofproto
    name = type(msg).__name__
    if name == "OFPFlowMod":
        return msg.command == ofp.OFPFC_ADD
    if name == "OFPGroupMod":
        return msg.command in (ofp.OFPGC_ADD, ofp.OFPGC_MODIFY)
    return msg.command in (ofp.OFPMC_ADD, ofp.OFPMC_MODIFY)


@pytest.mark.parametrize("path,with_fabric,mode", [
    (path, fab, mode) for path in golden_flows.TOPOLOGIES
    for _name, fab, mode in golden_flows.variants(topology.load(path))])
def test_every_shipped_topology_converges_in_one_pass_and_stays(tmp_path, path, with_fabric, mode):
    """Every switch of every shipped topology holds exactly its desired state after one pass
    (br-int, br-phy and fabric switch through the same path), and the next pass sends nothing."""
    c = Cloud(tmp_path, path, with_fabric, mode, taps=True)
    try:
        result = c.rec.run_pass()
        assert result.desired
        for key, state in result.desired.items():
            res = result.switches[key]
            assert res.state == "ok", (str(key), res.state)
            assert holds(c.switches.switches[res.dpid], state), str(key)
        sent = len(c.switches.journal)
        c.rec.run_pass(audit=True)
        assert len(c.switches.journal) == sent
        statuses = [x["status"] for kind in ("ports", "networks", "subnets", "routers", "taps")
                    for x in c.get(f"/{kind}")]
        assert set(statuses) <= {"active"}        # neutron.yaml has no object of its own
    finally:
        c.close()


def test_statuses_are_written_only_where_the_store_differs_a_fabric_switch_too(tmp_path, monkeypatch):
    """A pass that changes no status writes none, opening no write transaction (not even for the
    fabric switch's, kept with the fabric's part of the store); the fabric switch's status still follows its switch."""
    from fathom.store import status as store_status
    c = Cloud(tmp_path, BENCH / "l3.yaml", with_fabric=True)
    try:
        writes: list[dict] = []
        write = store_status.write_statuses
        monkeypatch.setattr(store_status, "write_statuses",
                            lambda session, statuses, node_states={}, notes=(): (
                                writes.append(dict(statuses)), write(session, statuses, node_states, notes)))
        tor = c.get("/fabric/switches")[0]
        c.rec.run_pass()
        assert c.get("/fabric/switches")[0]["status"] == "active"
        writes.clear()
        c.rec.run_pass(audit=False)                                    # nothing happened
        c.rec.wake()
        c.rec.run_pass(audit=False)                                    # an API write that changed nothing
        c.rec.wake()
        c.rec.run_pass(audit=False)
        assert writes == []
        c.switches.disconnect(datapath_id_fabric(tor["id"]))
        c.rec.run_pass(audit=False)
        got = c.get("/fabric/switches")[0]
        assert got["status"] == "error" and "connection closed" in got["status_reason"], got
        assert ("fabric_switch", tor["id"]) in writes[-1]
    finally:
        c.close()


def test_a_port_status_wakes_a_pass_only_when_the_replica_differs_from_what_was_compiled(cloud):
    """The OVSDB replica's notification of a plug wakes the pass; the switch's port-status about
    the same port wakes none when the replica holds the numbers the last pass compiled with, and
    one when it does not (the replica changed, its notification not yet taken, or lost)."""
    cloud.rec.run_pass()
    dpid = datapath_id(cloud.nodes["compute1"])
    cloud.rec._take_events()
    cloud.rec.port_status(dpid)
    assert not cloud.rec._wake.is_set()
    cloud.boot.ofports["compute1"]["vm-new"] = 77
    cloud.rec.port_status(dpid)
    assert cloud.rec._wake.is_set() and cloud.rec._take_events().ports == {"compute1"}
    cloud.rec.run_pass(audit=False)
    cloud.rec.port_status(dpid)
    assert not cloud.rec._wake.is_set()
    cloud.boot.failing.add("compute1")                 # its OVSDB connection is down: cannot tell
    cloud.rec.port_status(dpid)
    assert cloud.rec._wake.is_set()


def test_the_settle_time_is_the_operators_and_reaches_every_switch_session(monkeypatch):
    """`fathom controller --datapath-settle S` (bounded: 0 to 1 s) is what every OpenFlow session
    of the controller waits."""
    from click.testing import CliRunner
    from fathom.cli.main import cli
    from fathom.controller import server
    from fathom.controller.switch import DATAPATH_SETTLE, OsKenSwitches
    got = {}
    monkeypatch.setattr(server, "serve", lambda *a, **kw: got.update(kw))
    run = lambda *a: CliRunner().invoke(cli, ["controller", "--insecure", *a])  # noqa: E731
    assert run().exit_code == 0 and got["datapath_settle"] == DATAPATH_SETTLE
    assert run("--datapath-settle", "0.15").exit_code == 0 and got["datapath_settle"] == 0.15
    for bad in ("-0.01", "1.5", "x"):
        out = run("--datapath-settle", bad)
        assert out.exit_code == 2 and "--datapath-settle" in out.output, out.output

    class App:
        def datapath(self, dpid):
            return type("Dp", (), {"id": dpid})() if dpid == 7 else None
    switches = OsKenSwitches(App(), 0.15)
    assert switches.session(7).settle == 0.15 and switches.session(8) is None


def test_switches_and_statuses_on_metrics(cloud):
    """/metrics says which switch is connected and how many objects are in each status, as the last
    pass left them (what the alert rules FathomSwitchDisconnected and FathomPortError read)."""
    from prometheus_client import generate_latest

    from fathom.controller.metrics import export_state
    export_state(cloud.rec)
    cloud.rec.run_pass()

    def exported() -> str:
        return generate_latest().decode()
    ports = [p["status"] for p in cloud.get("/ports")]
    assert f'fathom_objects{{kind="port",status="active"}} {float(ports.count("active"))}' in exported()
    for name in cloud.nodes:
        assert f'fathom_switch_connected{{bridge="br-int",switch="{name}"}} 1.0' in exported()
    down = next(iter(cloud.nodes))
    cloud.switches.disconnect(datapath_id(cloud.nodes[down]))
    cloud.rec.run_pass(audit=False)
    assert f'fathom_switch_connected{{bridge="br-int",switch="{down}"}} 0.0' in exported()
