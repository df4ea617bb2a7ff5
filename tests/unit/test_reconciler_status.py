"""Which objects a node's trouble marks: the status model's write-back (fathom.controller.status)
over a real store (SQLite and PostgreSQL), from the flows the apps really compile."""
from __future__ import annotations

import warnings

import pytest
from sqlalchemy.orm import Session

from fathom.apps import BR_INT, SwitchKey, compile_all
from fathom.controller import status
from fathom.controller.results import PassResult, SwitchResult
from fathom.model import datapath_id
from fathom.store.db import session_factory
from fathom.store.snapshot import load_snapshot

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from fathom.api import create_app  # noqa: E402

from .auth import headers_for  # noqa: E402

LOST = "lost: br-int's OpenFlow connection closed at 12:00:00 (ovs-vswitchd down or unreachable)"


class Cloud:
    """Two nodes, a VXLAN network with a port on each, a router on it; statuses after one pass."""

    def __init__(self, db_url: str):
        app = create_app(db_url)
        self.http = TestClient(app, headers=headers_for(app))
        self.engine = app.state.engine
        for i in (1, 2):
            self.post("/nodes", {"name": f"c{i}", "tunnel_ip": f"198.18.0.{i}"})
        net = self.post("/networks", {"name": "blue"})
        sub = self.post("/subnets", {"network_id": net["id"], "cidr": "10.0.0.0/24"})
        for i in (1, 2):
            self.post("/ports", {"network_id": net["id"], "name": f"vm{i}", "node": f"c{i}", "interface_name": f"tap{i}"})
        router = self.post("/routers", {"name": "r"})
        self.post(f"/routers/{router['id']}/interfaces", {"subnet_id": sub["id"]})
        with Session(self.engine) as s:
            self.snapshot = load_snapshot(s).with_ofports(
                {f"c{i}": {"vxlan0": 1, "patch-phy": 2, f"tap{i}": 3} for i in (1, 2)})

    def post(self, path, body):
        r = self.http.post("/v1" + path, json=body)
        assert r.status_code == 201, r.text
        return r.json()

    def after_pass(self, **switch: str) -> dict[tuple[str, str], tuple[str, str | None]]:
        """(kind, name) -> (status, reason) once a pass saw each node's switch as given."""
        ids = {n.name: n.id for n in self.snapshot.nodes}
        switches = {SwitchKey(BR_INT, n): SwitchResult(SwitchKey(BR_INT, n), datapath_id(ids[n]), state=s)
                    for n, s in switch.items()}
        result = PassResult(switches=switches, desired=compile_all(self.snapshot))
        status.write(session_factory(self.engine), self.snapshot, result)
        out = {}
        for kind in ("nodes", "networks", "subnets", "ports", "routers"):
            for o in self.http.get(f"/v1/{kind}").json():
                out[(kind, o["name"])] = (o["status"], o["status_reason"])
        return out


@pytest.fixture
def cloud(db_url):
    return Cloud(db_url)


def test_all_switches_ok_all_active(cloud):
    assert {s for s, _ in cloud.after_pass(c1="ok", c2="ok").values()} == {"active"}


def test_a_lost_switch_is_an_error_of_its_node_and_its_ports_only(cloud):
    st = cloud.after_pass(c1="ok", c2=LOST)
    assert st[("nodes", "c2")] == ("error", LOST.removeprefix("lost: "))
    assert st[("ports", "vm2")][0] == "error" and "node c2" in st[("ports", "vm2")][1]
    # vm1 has flows on c2 too (the way to reach it from there), but works for everyone else
    assert st[("ports", "vm1")] == ("active", None)
    assert st[("nodes", "c1")] == ("active", None)
    for kind, name in (("networks", "blue"), ("routers", "r")):
        assert st[(kind, name)] == ("active", None), kind
    # and all is well again once the switch is back
    assert {s for s, _ in cloud.after_pass(c1="ok", c2="ok").values()} == {"active"}


def test_a_switch_not_connected_yet_is_pending_for_its_own_objects(cloud):
    st = cloud.after_pass(c1="ok", c2="not connected")
    assert st[("nodes", "c2")][0] == st[("ports", "vm2")][0] == "pending"
    assert st[("ports", "vm1")] == st[("networks", "blue")] == ("active", None)


def test_distributed_objects_wait_when_no_node_holds_them(cloud):
    st = cloud.after_pass(c1="not connected", c2=LOST)
    assert st[("networks", "blue")][0] == "error"        # the worst of what holds it back
    assert "node c1" in st[("networks", "blue")][1] and "node c2" in st[("networks", "blue")][1]
    assert st[("ports", "vm1")][0] == "pending" and st[("ports", "vm2")][0] == "error"


def test_a_refused_change_is_an_error_of_every_object_with_flows_there(cloud):
    st = cloud.after_pass(c1="ok", c2="error: switch fa00000000000002 refused the change: bad action")
    assert st[("nodes", "c2")][0] == "error"
    # any object with flows on c2 may be the cause
    for key in (("ports", "vm1"), ("ports", "vm2"), ("networks", "blue")):
        assert st[key][0] == "error" and "refused the change" in st[key][1], key
