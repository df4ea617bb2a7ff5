"""The agent's side of host-local state, against the real pieces that run here.

* The follower (fathom.agent.follow) against the real API (an app over a real SQLite store, through
  httpx's ASGI transport): it applies the first answer, reports every object's status with the
  digest it applied, wakes on a change through the long-poll, keeps what it holds while the
  controller is unreachable, and resyncs with a restarted controller (a new app over the same
  store: the revision did not go back).
* The OVSDB bootstrap puts br-int and br-phy on a node's datapath type, against a real ovsdb-server.
"""
from __future__ import annotations

import random
import threading
import time
import warnings

import httpx
import pytest

from fathom.agent.follow import Follower
from fathom.model.hostlocal import RouterNamespace, digest, owner_key

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from fathom.api import create_app  # noqa: E402

from .auth import headers_for  # noqa: E402
from .test_spec_ovs import Ovs  # noqa: E402


class Recorder:
    """A handler of router namespaces that holds them in memory (the host side is the lab test's)."""
    KIND = RouterNamespace.KIND

    def __init__(self):
        self.held: dict[int, RouterNamespace] = {}
        self.applies = 0

    def apply(self, objects):
        self.applies += 1
        self.held = {o.router_id: o for o in objects}
        return {owner_key(o.owner): {"status": "active", "reason": None, "applied": digest([o])} for o in objects}


def _cloud(admin: TestClient) -> int:
    for body in ({"name": "c1"}, {"name": "gw", "role": "gateway"}):
        admin.post("/v1/nodes", json=body).raise_for_status()
    r = admin.post("/v1/routers", json={"name": "r"}).json()
    for i in (1, 2):
        net = admin.post("/v1/networks", json={"name": f"n{i}"}).json()
        sub = admin.post("/v1/subnets", json={"network_id": net["id"], "cidr": f"198.19.{i}.0/24"}).json()
        admin.post(f"/v1/routers/{r['id']}/interfaces", json={"subnet_id": sub["id"]}).raise_for_status()
    return r["id"]


def test_the_follower_applies_reports_wakes_and_resyncs(tmp_path):
    url = f"sqlite:///{tmp_path}/fathom.db"
    app = create_app(url)
    admin = TestClient(app, headers=headers_for(app))
    rid = _cloud(admin)
    admin.patch(f"/v1/routers/{rid}", json={"mode": "network-node", "gateway_node": "gw"}).raise_for_status()
    agent_headers = headers_for(app, roles=("agent",), node="gw")
    rec = Recorder()
    f = Follower(TestClient(app, headers=agent_headers), "gw", [rec], lambda: {"ovs_version": "3.1.0"},
                 report_interval=0.5, resync=3600)
    t = threading.Thread(target=f.run, daemon=True)
    t.start()
    try:
        for _ in range(100):
            if rec.held and admin.get("/v1/agents/gw").json()["objects"]:
                break
            time.sleep(0.05)
        assert set(rec.held) == {rid} and len(rec.held[rid].legs) == 2
        seen = admin.get("/v1/agents/gw").json()
        assert seen["state"] == "up" and seen["facts"]["ovs_version"] == "3.1.0"
        assert seen["objects"][f"router:{rid}"] == {"status": "active", "reason": None,
                                                    "applied": digest([rec.held[rid]])}
        first = f.revision
        # a change wakes the long-poll: the namespace goes when the router leaves network-node mode
        admin.patch(f"/v1/routers/{rid}", json={"mode": "distributed"}).raise_for_status()
        for _ in range(100):
            if not rec.held:
                break
            time.sleep(0.05)
        assert rec.held == {} and f.revision == first + 1
    finally:
        f.stop()
        t.join(10)

    # the controller is unreachable: nothing is taken away from the host, the agent retries
    admin.patch(f"/v1/routers/{rid}", json={"mode": "network-node"}).raise_for_status()
    dead = httpx.Client(base_url="http://127.0.0.1:9", timeout=0.5)
    rec2 = Recorder()
    rec2.held = {99: RouterNamespace(99, ())}
    g = Follower(dead, "gw", [rec2], lambda: {}, report_interval=0.5, backoff_max=0.2)
    t = threading.Thread(target=g.run, daemon=True)
    t.start()
    time.sleep(1.0)
    g.stop()
    t.join(10)
    assert rec2.applies == 0 and set(rec2.held) == {99} and g.failures >= 2

    # a restarted controller (a new process over the same store): the revision went on, not back
    app2 = create_app(url)
    h = Follower(TestClient(app2, headers=agent_headers), "gw", [rec], lambda: {})
    assert h.fetch(0.0) and h.revision == first + 2
    h.apply()
    assert set(rec.held) == {rid}


class Waiting(Recorder):
    """A handler whose objects wait for the host twice (`pending`, as a VIF not plugged yet)."""

    def apply(self, objects):
        out = super().apply(objects)
        if self.applies <= 2:
            return {k: {**v, "status": "pending", "reason": "waiting for interface"} for k, v in out.items()}
        return out


def test_an_object_pending_on_the_host_is_applied_again_before_the_resync(tmp_path):
    app = create_app(f"sqlite:///{tmp_path}/fathom.db")
    admin = TestClient(app, headers=headers_for(app))
    rid = _cloud(admin)
    admin.patch(f"/v1/routers/{rid}", json={"mode": "network-node", "gateway_node": "gw"}).raise_for_status()
    rec = Waiting()
    f = Follower(TestClient(app, headers=headers_for(app, roles=("agent",), node="gw")), "gw", [rec], lambda: {},
                 busy_interval=0.2, resync=3600)
    t = threading.Thread(target=f.run, daemon=True)
    t.start()
    try:
        for _ in range(100):
            if admin.get("/v1/agents/gw").json()["objects"].get(f"router:{rid}", {}).get("status") == "active":
                break
            time.sleep(0.05)
        assert rec.applies == 3, rec.applies
        assert admin.get("/v1/agents/gw").json()["objects"][f"router:{rid}"]["status"] == "active"
        time.sleep(0.6)
        assert rec.applies == 3        # then only the resync (an hour here) applies again
    finally:
        f.stop()
        t.join(10)


@pytest.fixture
def ovsdb(tmp_path):
    """ovsdb-server and a dummy-datapath ovs-vswitchd (it acknowledges each transaction), the
    database also on TCP at a loopback address of its own, as a node's is on its management address."""
    from fathom.controller import channels
    ip = f"127.{random.randint(64, 250)}.{random.randint(1, 250)}.{random.randint(1, 250)}"
    ovs = Ovs(tmp_path).start()
    ovs.run("ovs-appctl", "-t", f"{tmp_path}/ovsdb-server.{ovs.procs[0].pid}.ctl", "ovsdb-server/add-remote",
            f"ptcp:6640:{ip}")
    ovs.vsctl("add-br", "br-phy")
    channels.use_plain_tcp()
    yield ovs, ip
    ovs.stop()


def test_the_bootstrap_puts_the_bridges_on_the_nodes_datapath_type(ovsdb):
    from fathom.controller.bootstrap import NodeOvsdb
    ovs, ip = ovsdb

    def types():
        out = ovs.run("ovs-vsctl", f"--db={ovs.db}", "--columns=name,datapath_type", "-f", "csv",
                      "--no-headings", "list", "bridge")
        return dict(line.split(",") for line in out.split())
    node = NodeOvsdb("n1", ip)
    try:
        for _ in range(50):
            if node.api.idl._session.is_connected():
                break
            time.sleep(0.1)
        assert node.ensure(1, "198.18.0.1", "tcp:127.0.0.1:6653", None)
        assert types() == {"br-int": "netdev", "br-phy": '""""""'}   # new br-int: netdev; br-phy left alone (empty)
        assert node.ensure(1, "198.18.0.1", "tcp:127.0.0.1:6653", "system")
        assert types() == {"br-int": "system", "br-phy": "system"}
        assert not node.ensure(1, "198.18.0.1", "tcp:127.0.0.1:6653", "system")   # nothing to change
        assert node.ensure(1, "198.18.0.1", "tcp:127.0.0.1:6653", "netdev")
        assert types() == {"br-int": "netdev", "br-phy": "netdev"}
    finally:
        node.close()


def test_a_lab_gives_its_agents_a_controller_url_they_can_reach():
    """A lab node's loopback is its own: a controller on 127.0.0.1 is reached on the management
    bridge's address; any other address is kept."""
    from fathom.lab.lab import _reachable_from_nodes
    assert _reachable_from_nodes("http://127.0.0.1:8080", "198.18.128.1") == "http://198.18.128.1:8080"
    assert _reachable_from_nodes("http://localhost:8080/", "198.18.128.1") == "http://198.18.128.1:8080/"
    assert _reachable_from_nodes("https://10.0.0.5:8443", "198.18.128.1") == "https://10.0.0.5:8443"


def test_an_idle_agent_costs_the_store_nothing_and_its_long_poll_is_its_heartbeat(tmp_path):
    """While an agent holds its long-poll the controller reads and writes nothing; the agent is `up`
    even when its stored report is old (liveness is the long-poll), and `down` once it hung up and
    STALE_AFTER passed; a report that says nothing new writes nothing."""
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import event, update
    from sqlalchemy.orm import Session

    from fathom.api import agents as api_agents
    from fathom.store.agent_models import NodeAgent

    app = create_app(f"sqlite:///{tmp_path}/fathom.db")
    admin = TestClient(app, headers=headers_for(app))
    _cloud(admin)
    agent = TestClient(app, headers=headers_for(app, roles=("agent",), node="gw"))
    rev = agent.get("/v1/agents/gw/desired").json()["revision"]
    body = {"agent_started": 1.0, "applied_revision": rev, "facts": {"ovs_version": "3.1.0"}, "objects": {}}
    assert agent.post("/v1/agents/gw/report", json=body).status_code == 204
    # the stored report is old: only the long-poll can say the agent is alive
    old = datetime.now(timezone.utc) - timedelta(seconds=4 * api_agents.STALE_AFTER)   # < REPORT_INTERVAL / 2
    with Session(app.state.engine) as s, s.begin():
        s.execute(update(NodeAgent).values(reported_at=old))
    hub = app.state.agent_hub
    hub._heard["gw"] = old.timestamp()     # and this process last heard it as long ago
    assert admin.get("/v1/agents/gw").json()["state"] == "down"
    admin.get("/v1/agents/gw/desired")     # an admin reading the node's state is no heartbeat
    assert admin.get("/v1/agents/gw").json()["state"] == "down"

    statements: list[str] = []
    event.listen(app.state.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    answer: dict = {}
    poll = threading.Thread(target=lambda: answer.update(
        agent.get("/v1/agents/gw/desired", params={"after": rev, "timeout": 2.0}).json()))
    poll.start()
    time.sleep(0.5)       # its first look reads the store once (the report above changed it)
    statements.clear()
    time.sleep(1.0)
    held = list(statements)
    assert admin.get("/v1/agents/gw").json()["state"] == "up"
    poll.join(10)
    assert answer["revision"] == rev
    assert held == [], held
    assert admin.get("/v1/agents/gw").json()["state"] == "up"    # heard when it hung up, just now

    # a report that says nothing new: no write (its reported_at stays as the store has it)
    assert agent.post("/v1/agents/gw/report", json=body).status_code == 204
    with Session(app.state.engine) as s:
        stored = s.get(NodeAgent, s.scalar(select_node_id("gw"))).reported_at
    assert stored.replace(tzinfo=timezone.utc) == old or stored == old
    # hung up, and STALE_AFTER later: down
    hub._heard["gw"] = time.time() - api_agents.STALE_AFTER - 1
    assert admin.get("/v1/agents/gw").json()["state"] == "down"


def select_node_id(name: str):
    from sqlalchemy import select

    from fathom.store import models as m
    return select(m.Node.id).where(m.Node.name == name)
