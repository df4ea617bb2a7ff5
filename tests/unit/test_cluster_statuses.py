"""Two controller replicas on one real PostgreSQL store, each with its reconciler, over fake switches
(fathom.controller.fakeswitch) that each replica connects to under a role of its own: statuses and
agents agree whichever replica decides or is asked.

- A port whose flows the switch mastered by replica B refuses is `error`, and replica A (which does
  not master that switch) decides the same: it does not write `active` over it, and its status
  board (what A's long-polls answer) says `error` too. Once the switch takes them, both say `active`:
  A's board as soon as B's status write commits (the change feed), before any pass of A's.
- An agent that polls replica B is `up` in replica A's `GET /v1/agents`, and `down` in both once it
  stops.
Rounds are run by hand, so each step is deterministic."""
from __future__ import annotations

import time
import warnings

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from fathom.api import agents as agents_api
from fathom.api import create_app
from fathom.cluster import feed
from fathom.cluster.leases import Timing
from fathom.cluster.mastership import Mastership
from fathom.controller.cluster import ClusterMember, switch_name
from fathom.controller.fakeswitch import FakeSwitches
from fathom.controller.reconciler import Reconciler
from fathom.lab import topology
from fathom.lab.ovs import wait_for
from fathom.model import datapath_id
from fathom.pipeline import cookies as ck
from fathom.store.db import AT_ONCE, session_factory
from fathom.store.snapshot import load_snapshot
from fathom.store.status import STATUS_LOCK_WAIT, write_statuses

from . import golden_flows
from .auth import headers_for
from .test_reconciler import LAB, FixedBootstrap

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

# rounds are run by hand: leases long enough to outlast a pass on a busy machine
TIMING = Timing(renew=1.0, lease=30.0, guard=0.1)


class Connections:
    """One replica's connections to the fake switches (a switch's role is per connection)."""

    def __init__(self, fakes: FakeSwitches, name: str):
        self.fakes, self.name = fakes, name

    def session(self, dpid):
        sw = self.fakes.session(dpid)
        return sw.connect(self.name) if sw is not None else None

    def connected(self):
        return self.fakes.connected()

    def lost_since(self, dpid):
        return self.fakes.lost_since(dpid)


class Replica:
    def __init__(self, name: str, app, fakes: FakeSwitches, ofports):
        self.app, self.conns = app, Connections(fakes, name)
        self.rec = Reconciler(session_factory(app.state.engine), self.conns, FixedBootstrap(ofports),
                              check_incremental=True, startup_grace=0.0)
        self.mastership = Mastership(app.state.engine, lambda: [switch_name(d) for d in self.conns.connected()],
                                     replica_id=name, timing=TIMING, reachable_only=True,
                                     agents=app.state.agent_hub.present).join()
        app.state.agent_hub.heard_elsewhere = self.mastership.agent_heard
        self.member = ClusterMember(self.mastership, self.conns, self.rec)
        self.http = TestClient(app, headers=headers_for(app))
        # the statuses the other replica writes, as they commit (the change feed's status channel)
        self.feed = feed.Listener(feed.libpq_conninfo(app.state.engine), name, lambda _written: None,
                                  self.rec.board.heard).start()
        wait_for(lambda: self.feed.connected, 10, f"replica {name}'s change feed to connect")

    def status(self, port_id: int) -> tuple[str, str | None]:
        got = self.http.get(f"/v1/ports/{port_id}").json()
        return got["status"], got["status_reason"]

    def close(self):
        self.feed.stop()
        self.mastership.stop()
        self.member._roles.shutdown(wait=True)
        self.http.close()
        self.app.state.engine.dispose()


def golden_cloud(url: str):
    """The lab's default topology registered in the store at `url` (golden_flows, distributed
    routers), and a fake switch for each node: (topology, the ids registered, the store's snapshot,
    node name -> id, the fake switches, the nodes' OVSDB port numbers)."""
    topo = topology.load(LAB / "default.yaml")
    setup = create_app(url)
    ids = golden_flows.register(TestClient(setup, headers=headers_for(setup)), topo, False, "distributed")
    with session_factory(setup.state.engine)() as s:
        snap = load_snapshot(s)
    setup.state.engine.dispose()
    fakes = FakeSwitches()
    nodes = {n.name: n.id for n in snap.nodes}
    for node_id in nodes.values():
        fakes.add(datapath_id(node_id))
    ofports = golden_flows.ofports(topo, snap, "distributed")
    return topo, ids, snap, nodes, fakes, ofports


def share_switches(a: Replica, b: Replica, fakes: FakeSwitches):
    """Lease rounds until every switch has a master, a or b, then a pass each (a twice, to see
    b's statuses); returns the rounds, for the test to run again."""
    def rounds():   # three each: a lease freed toward b in a's second is b's in its, and a sees it in its third
        for r in (a, b, a, b, a, b):
            r.mastership.run_round()
    rounds()
    wait_for(lambda: all(a.member.masters(d) or b.member.masters(d) for d in fakes.switches), 5,
             "every switch mastered, by one replica or the other")
    for r in (a, b, a):
        r.rec.run_pass()
    return rounds


def test_replicas_decide_the_same_statuses_and_see_every_agent(postgres, monkeypatch):
    url = postgres.new_database(migrated=True)
    topo, ids, snap, nodes, fakes, ofports = golden_cloud(url)
    a, b = (Replica(name, create_app(url), fakes, ofports) for name in ("a", "b"))
    try:
        rounds = share_switches(a, b, fakes)
        assert all(a.status(p)[0] == "active" for p in ids["ports"].values())
        # a port on a node whose br-int b masters (b: the replica whose share has a node with VMs):
        # its flows go missing there, and the switch refuses them when b's audit sends them again
        vm, node = next((v.name, n.name) for r in (b, a) for n, v in topo.vms()
                        if r.member.masters(datapath_id(nodes[n.name])))
        if not b.member.masters(datapath_id(nodes[node])):
            a, b = b, a
        port = ids["ports"][vm]
        switch = fakes.switches[datapath_id(nodes[node])]
        mine = lambda spec: ck.parse_cookie(spec.cookie)[1:] == (ck.KIND_PORT, port)   # noqa: E731
        for key in [k for k, f in switch.flows.items() if mine(f)]:
            del switch.flows[key]
        switch.refuse(mine)
        b.rec.run_pass(audit=True)
        assert b.status(port)[0] == "error"
        a.rec.changed_elsewhere()       # before b's report reached it, a's pass writes nothing over it
        a.rec.run_pass()
        assert b.status(port)[0] == "error"
        rounds()                        # b's report reaches a
        a.rec.changed_elsewhere()       # a reads the store again (b wrote the status) and decides
        a.rec.run_pass()
        status, reason = a.status(port)
        assert status == "error" and f"br-int {node}" in reason, (status, reason)
        assert a.rec.board.statuses[("port", port)][0] == "error"
        others = [p for name, p in ids["ports"].items() if name != vm]
        assert all(a.status(p)[0] == "active" for p in others), {p: (a.status(p), b.status(p)) for p in others}
        # the switch takes the flows: b repairs it and writes `active`, which a's board (what its
        # long-polls answer) shows as b's write commits, with no pass of a's own
        switch.refuse(None)
        passes = a.rec.passes
        b.rec.run_pass(audit=True)
        wait_for(lambda: a.rec.board.statuses[("port", port)][0] == "active", 5,
                 "b's status write to reach a's board through the change feed")
        assert a.status(port)[0] == "active" and a.rec.passes == passes
        rounds()
        a.rec.run_pass()
        assert a.status(port)[0] == "active" and a.rec.board.statuses[("port", port)][0] == "active"

        # an agent polling b (its report an hour old: up only by being heard): up through a's API
        # too, and down in both once it stopped for longer than STALE_AFTER
        monkeypatch.setattr(agents_api, "STALE_AFTER", 3.0)
        agent = TestClient(b.app, headers=headers_for(b.app, "admin", ("agent",), node=node))
        assert agent.post(f"/v1/agents/{node}/report", json={}).status_code == 204
        with b.app.state.engine.begin() as conn:
            conn.execute(text("UPDATE node_agents SET reported_at = reported_at - interval '1 hour'"))
        b.app.state.agent_hub.hold(node)           # its long-poll, held on b

        def state(r: Replica) -> str:
            return next(x["state"] for x in r.http.get("/v1/agents").json() if x["node"] == node)
        assert state(a) == "down"                  # not heard by a, nor told yet
        rounds()
        assert (state(a), state(b)) == ("up", "up")
        b.app.state.agent_hub.release(node)        # the agent went away
        time.sleep(3.2)
        rounds()
        assert (state(a), state(b)) == ("down", "down")
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("at_once", [False, True])
def test_a_status_write_waits_for_a_row_another_transaction_holds_only_so_long(postgres, at_once):
    """A stopped peer's open transaction (a paused replica) holds its rows until PostgreSQL ends
    it: a pass's status write gives up after STATUS_LOCK_WAIT rather than hold every switch's
    changes behind it, and succeeds once the row is free; in a transaction, or at once (its one
    statement committing as it runs, as the reconciler writes objects' statuses alone), and then
    the wait is the statement's alone: the connection waits as long as ever after."""
    app = create_app(postgres.new_database(migrated=True))
    http = TestClient(app, headers=headers_for(app))
    net = http.post("/v1/networks", json={"name": "n"}).json()
    node = http.post("/v1/nodes", json={"name": "c1", "management_ip": "198.18.0.1"}).json()
    port = http.post("/v1/ports", json={"network_id": net["id"], "node": node["name"]}).json()
    engine, Session = app.state.engine, session_factory(app.state.engine)
    try:
        with engine.connect() as peer:
            peer.execute(text("SELECT id FROM ports WHERE id = :id FOR UPDATE"), {"id": port["id"]})
            t0 = time.monotonic()
            with pytest.raises(OperationalError, match="lock timeout"), Session() as s, s.begin():
                if at_once:
                    s.connection(execution_options=AT_ONCE)
                write_statuses(s, {("port", port["id"]): ("active", None)})
            assert STATUS_LOCK_WAIT <= time.monotonic() - t0 < STATUS_LOCK_WAIT + 5
            peer.rollback()
        with Session() as s, s.begin():
            if at_once:
                s.connection(execution_options=AT_ONCE)
            write_statuses(s, {("port", port["id"]): ("active", None)})
            if at_once:   # committed already, and the lock wait was the statement's only
                assert http.get(f"/v1/ports/{port['id']}").json()["status"] == "active"
                assert s.connection().exec_driver_sql("SHOW lock_timeout").scalar() == "0"
        assert http.get(f"/v1/ports/{port['id']}").json()["status"] == "active"
    finally:
        http.close()
        engine.dispose()
