"""Datapath flushes after a router moves (fathom.controller.hostlocal, fathom.model.routers.router_paths)
over a real store (SQLite and PostgreSQL): which nodes are asked, when, and the router's status
until their agents say they flushed."""
from __future__ import annotations

import dataclasses
import time
import warnings

from sqlalchemy.orm import Session

from fathom.agent.datapath import DatapathFlushes
from fathom.agent.local import LocalOvs
from fathom.controller.hostlocal import HostLocalStatus
from fathom.controller.reconciler import Reconciler
from fathom.controller.results import PassResult
from fathom.model.hostlocal import DatapathFlush, digest, from_json, owner_key, to_json
from fathom.model.routers import router_paths, router_port_interface
from fathom.store import agents as ag
from fathom.store.db import session_factory

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from fathom.api import create_app  # noqa: E402

from .auth import headers_for  # noqa: E402
from .test_spec_ovs import Ovs  # noqa: E402


class Cloud:
    """Nodes c1, c2 (a VM each, on networks n1 and n2), c3 (no VM) and the gateway node gw; router r
    joins n1 and n2."""

    def __init__(self, db_url: str):
        app = create_app(db_url)
        self.http = TestClient(app, headers=headers_for(app))
        self.engine = app.state.engine
        for i, name in enumerate(("c1", "c2", "c3", "gw")):
            self.post("/nodes", {"name": name, "tunnel_ip": f"198.18.0.{i + 1}",
                                 **({"role": "gateway"} if name == "gw" else {})})
        self.router = self.post("/routers", {"name": "r"})
        for i, node in ((1, "c1"), (2, "c2")):
            net = self.post("/networks", {"name": f"n{i}"})
            sub = self.post("/subnets", {"network_id": net["id"], "cidr": f"10.0.{i}.0/24"})
            self.post("/ports", {"network_id": net["id"], "name": f"vm{i}", "node": node, "interface_name": f"tap{i}"})
            r = self.http.post(f"/v1/routers/{self.router['id']}/interfaces", json={"subnet_id": sub["id"]})
            assert r.status_code in (200, 201), r.text
        self.rec = Reconciler(session_factory(self.engine), None, None)
        self.asked: list[dict] = []
        self.hostlocal = HostLocalStatus(session_factory(self.engine), ask_flush=self.asked.append)

    def post(self, path, body):
        r = self.http.post("/v1" + path, json=body)
        assert r.status_code == 201, r.text
        return r.json()

    def snapshot(self, wired: bool = True):
        """The model as the reconciler reads it; with `wired`, the gateway node's br-int holds the
        router's legs (as OVSDB reports them once its agent built the namespace)."""
        snap = self.rec.store.read(whole=True)
        if not wired:
            return snap
        legs = {router_port_interface(ri.id): 100 + ri.id for ri in snap.router_interfaces}
        nodes = tuple(dataclasses.replace(n, ofports=legs) if n.name == "gw" else n for n in snap.nodes)
        return dataclasses.replace(snap, nodes=nodes)

    def pass_(self, snap) -> PassResult:
        result = PassResult()
        self.hostlocal.after_pass(self.rec, snap, result)
        return result

    def report(self, node: str, flush: DatapathFlush) -> None:
        with Session(self.engine) as s, s.begin():
            ag.record_report(s, node, agent_started=1.0, applied_revision=1, facts={},
                             objects={owner_key(flush.owner): {"status": "active", "reason": None,
                                                               "applied": digest([flush])}})

    def move(self, mode: str) -> None:
        r = self.http.patch(f"/v1/routers/{self.router['id']}",
                            json={"mode": mode, **({"gateway_node": "gw"} if mode == "network-node" else {})})
        assert r.status_code == 200, r.text


def test_router_paths_name_the_mode_the_switches_realise_and_the_nodes_they_route_on(db_url):
    cloud = Cloud(db_url)
    rid = cloud.router["id"]
    nets = frozenset(ri.network_id for ri in cloud.snapshot().router_interfaces)
    assert router_paths(cloud.snapshot())[rid] == ("distributed", None, nets, frozenset({"c1", "c2"}))
    cloud.move("network-node")
    assert router_paths(cloud.snapshot(wired=False))[rid][:2] == ("distributed", None)   # namespace not wired yet
    assert router_paths(cloud.snapshot())[rid] == ("network-node", "gw", nets, frozenset({"c1", "c2", "gw"}))


def test_a_move_asks_the_nodes_on_both_paths_once_and_the_router_waits_for_their_agents(db_url):
    cloud = Cloud(db_url)
    rid = cloud.router["id"]
    cloud.pass_(cloud.snapshot())
    assert cloud.asked == []                                   # the first pass learns the paths
    cloud.move("network-node")
    result = cloud.pass_(cloud.snapshot(wired=False))
    assert cloud.asked == []                                   # the switches still route distributed
    result = cloud.pass_(cloud.snapshot())
    (asked,) = cloud.asked
    assert sorted(asked) == ["c1", "c2", "gw"] and asked["c1"].routers == (rid,)
    first = asked["c1"].generation
    assert first >= int(time.time()) - 60             # from the clock: new to an agent a restart left behind
    st, reason = result.agents[("router", rid)]
    assert st == "error" and "flushing the datapath on node c1" in reason   # no agent ever reported
    for node in ("c1", "c2"):
        cloud.report(node, asked[node])
    st, reason = cloud.pass_(cloud.snapshot()).agents[("router", rid)]
    assert st == "error" and "node gw" in reason and "node c1" not in reason
    cloud.report("gw", asked["gw"])
    assert cloud.pass_(cloud.snapshot()).agents.get(("router", rid), ("active", None))[0] != "error"
    assert len(cloud.asked) == 1                               # nothing moved since
    cloud.move("distributed")
    cloud.pass_(cloud.snapshot())
    assert all(f.generation > asked[n].generation for n, f in cloud.asked[-1].items())
    assert sorted(cloud.asked[-1]) == ["c1", "c2", "gw"]


def test_a_node_on_the_kernel_datapath_is_not_asked_and_a_network_left_or_a_router_removed_reroutes(db_url):
    cloud = Cloud(db_url)
    rid = cloud.router["id"]
    with Session(cloud.engine) as s, s.begin():
        from fathom.store import models as m
        s.query(m.Node).filter_by(name="c2").update({"datapath_type": "system"})
    cloud.pass_(cloud.snapshot())
    cloud.move("network-node")
    cloud.pass_(cloud.snapshot())
    assert sorted(cloud.asked[-1]) == ["c1", "gw"]
    gen = {n: f.generation for n, f in cloud.asked[-1].items()}
    snap = cloud.snapshot()
    first, second = sorted(snap.router_interfaces, key=lambda ri: ri.id)
    r = cloud.http.delete(f"/v1/routers/{rid}/interfaces/{second.id}")
    assert r.status_code in (200, 204), r.text
    cloud.pass_(cloud.snapshot())
    assert sorted(cloud.asked[-1]) == ["c1", "gw"] and all(cloud.asked[-1][n].generation > gen[n] for n in gen)
    r = cloud.http.delete(f"/v1/routers/{rid}/interfaces/{first.id}")
    assert r.status_code in (200, 204), r.text
    cloud.pass_(cloud.snapshot())
    assert len(cloud.asked) == 3
    r = cloud.http.delete(f"/v1/routers/{rid}")
    assert r.status_code in (200, 204), r.text
    result = cloud.pass_(cloud.snapshot())
    assert len(cloud.asked) == 4 and cloud.asked[-1]["c1"] == cloud.asked[-2]["c1"]    # only its gateway node left
    assert cloud.asked[-1]["gw"].generation > cloud.asked[-2]["gw"].generation
    assert ("router", rid) not in result.agents and rid not in cloud.hostlocal.flushing


def test_a_flush_request_goes_over_the_wire_intact():
    flush = DatapathFlush(7, (3, 5))
    assert from_json(to_json(flush)) == flush and to_json(flush)["owner"] == ["datapath_flush", 7]


def test_the_agent_hub_serves_the_flush_with_the_node_s_desired_state_at_once(db_url):
    app = create_app(db_url)
    http = TestClient(app, headers=headers_for(app))
    assert http.post("/v1/nodes", json={"name": "c1", "tunnel_ip": "198.18.0.1"}).status_code == 201
    before = http.get("/v1/agents/c1/desired").json()
    cache = app.state.agent_desired
    app.state.agent_hub.ask_flush({"c1": DatapathFlush(1, (4,))})
    assert cache.holdoff() == 0.0                               # not coalesced with the writes before
    after = http.get("/v1/agents/c1/desired").json()
    assert after["revision"] != before["revision"]
    assert [from_json(o) for o in after["objects"] if o["kind"] == "datapath_flush"] == [DatapathFlush(1, (4,))]
    started = time.monotonic()
    again = http.get("/v1/agents/c1/desired", params={"after": after["revision"], "timeout": 0.2}).json()
    assert again["revision"] == after["revision"] and time.monotonic() - started >= 0.15


def test_the_agent_purges_once_a_request_on_netdev_only_and_never_twice_within_the_interval(tmp_path):
    """A real ovs-vswitchd: the purge is its `revalidator/purge`; a kernel-datapath bridge is left
    alone; the same request again is not carried out again; a new one that comes too soon waits."""
    ovs = Ovs(tmp_path).start()
    try:
        ovs.vsctl("add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=system")
        handler = DatapathFlushes(LocalOvs(ovs.db), min_interval=0.5)
        got = handler.apply([DatapathFlush(1, (4,))])
        assert got == {"datapath_flush:1": {"status": "active", "reason": None,
                                            "applied": digest([DatapathFlush(1, (4,))])}}
        assert handler.purged_at is None                                 # system: nothing to do
        ovs.vsctl("set", "bridge", "br-int", "datapath_type=netdev")
        assert handler.apply([DatapathFlush(2, (4,))])["datapath_flush:2"]["status"] == "active"
        first = handler.purged_at
        assert first is not None
        handler.apply([DatapathFlush(2, (4,))])
        assert handler.purged_at == first                                # carried out once
        handler.apply([DatapathFlush(3, (4, 5))])
        assert handler.purged_at - first >= 0.5                          # waited out the interval
        ovs.stop()
        broken = handler.apply([DatapathFlush(4, (4,))])["datapath_flush:4"]
        assert broken["status"] == "error" and "datapath flush" in broken["reason"]
        assert handler.done == 3                                         # tried again on the next apply
    finally:
        for p in ovs.procs:
            if p.poll() is None:
                p.terminate()
