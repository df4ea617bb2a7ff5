"""A hostile tenant against real OVS: a port bound to the tunnel (vxlan0) or the uplink (patch-phy)
of a compute node would classify every tenant's traffic arriving there into the attacker's network.

The API refuses the binding (a member may not bind at all; nobody may bind a fabric interface),
and a port that reaches the store anyway (written there directly) is not compiled: it is marked
`error`, the attacker's VM receives nothing (tcpdump in its namespace) and the victims' pings
across the tunnel and the VLAN uplink are unaffected."""

import httpx
import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from fathom.lab.capture import Capture
from fathom.pipeline import stages as st
from fathom.store import models as m

from .util import ping, running_lab, lab_api

TOPOLOGY = """
networks:
  - {name: blue, type: vxlan, segmentation_id: 1101, cidr: 198.19.1.0/24, project: victim}
  - {name: green, type: vlan, segmentation_id: 130, cidr: 198.19.2.0/24, project: victim}
  - {name: evil, type: vxlan, segmentation_id: 1666, cidr: 198.19.6.0/24, project: mallory}
nodes:
  - name: compute1
    vms:
      - {name: vm1, mac: "02:fa:00:00:01:01", ip: 198.19.1.11/24, network: blue}
      - {name: grn1, mac: "02:fa:00:00:03:01", ip: 198.19.2.21/24, network: green}
  - name: compute2
    vms:
      - {name: vm2, mac: "02:fa:00:00:01:02", ip: 198.19.1.12/24, network: blue}
      - {name: grn2, mac: "02:fa:00:00:03:02", ip: 198.19.2.22/24, network: green}
      - {name: evil1, mac: "02:fa:00:00:06:01", ip: 198.19.6.11/24, network: evil}
underlay:
  cidr: 198.18.0.0/24
  mtu: 1600
"""


@pytest.fixture(scope="module")
def lab():
    with running_lab("sc1", TOPOLOGY, standalone=False) as lab:
        yield lab


def admin(lab) -> httpx.Client:
    return lab_api(lab)


def as_tenant(lab, project: str) -> httpx.Client:
    token = admin(lab).post("/tokens", json={"project_id": project, "roles": ["member"]}).json()["token"]
    return httpx.Client(base_url=lab.state()["controller"]["url"] + "/v1",
                        headers={"Authorization": f"Bearer {token}"}, timeout=30)


VICTIMS = (("vm1", "198.19.1.12"), ("grn1", "198.19.2.22"))   # across the tunnel, across the VLAN uplink


def test_the_api_refuses_the_binding(lab):
    evil_net = admin(lab).get("/networks", params={"name": "evil"}).json()[0]["id"]
    mallory = as_tenant(lab, "mallory")
    for interface in ("vxlan0", "patch-phy"):
        r = mallory.post("/ports", json={"network_id": evil_net, "node": "compute2", "interface_name": interface})
        assert r.status_code == 403 and r.json()["detail"][0]["loc"] == ["body", "node"], r.text
        r = admin(lab).post("/ports", json={"network_id": evil_net, "node": "compute2", "interface_name": interface,
                                            "project_id": "mallory"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "interface_name"], r.text
    # nothing was created, and the old identity headers grant nothing
    assert [p["name"] for p in mallory.get("/ports").json()] == ["evil1"]
    anon = httpx.post(lab.state()["controller"]["url"] + "/v1/ports", headers={"X-Roles": "admin"},
                      json={"network_id": evil_net, "node": "compute2", "interface_name": "vxlan0"})
    assert anon.status_code == 401


def test_a_trap_port_in_the_store_captures_nothing(lab, tmp_path):
    before = {src: ping(lab, src, dst).stdout for src, dst in VICTIMS}
    assert all(" 0% packet loss" in out for out in before.values()), before
    # the attack, past the API: rows written into the controller's store
    engine = create_engine(f"sqlite:///{lab.dir / 'fathom.db'}")
    with Session(engine) as s, s.begin():
        node = s.scalar(select(m.Node).where(m.Node.name == "compute2"))
        evil = s.scalar(select(m.Network).where(m.Network.name == "evil"))
        traps = [m.Port(name=f"trap-{i}", network_id=evil.id, mac_address=f"02:fa:00:00:06:f{k}", node_id=node.id,
                        interface_name=i, project_id="mallory", status="pending")
                 for k, i in enumerate(("vxlan0", "patch-phy"))]
        s.add_all(traps)
        s.flush()
        trap_ids = [t.id for t in traps]
    engine.dispose()
    api = admin(lab)
    api.post("/sync").raise_for_status()
    # the compiler refused both: error, with the reason
    for pid in trap_ids:
        port = api.get(f"/ports/{pid}").json()
        assert port["status"] == "error" and "belongs to the fabric" in port["status_reason"], port
    with Capture(lab.ns("evil1"), "eth0", tmp_path / "evil1.pcap", "icmp") as cap:
        after = {src: ping(lab, src, dst, count=20) for src, dst in VICTIMS}
    for src, r in after.items():
        assert "20 received" in r.stdout and " 0% packet loss" in r.stdout, (src, r.stdout)
    seen = cap.fields("ip.src")
    assert seen == [], f"the attacker's VM received {len(seen)} ICMP packets: {seen[:5]}"
    # the victims' ports stay active; the flows of node compute2 name no trap
    for port in api.get("/ports").json():
        if port["project_id"] == "victim":
            assert port["status"] == "active", port
    flows = api.get("/nodes/compute2/flows").json()
    assert flows["in_sync"]
    for pid in trap_ids:
        cookie = f"cookie={st.cookie(st.APP_TENANT, st.KIND_PORT, pid):#x},"
        assert not any(cookie in line for lines in flows["actual"].values() for line in lines)
    for pid in trap_ids:
        api.delete(f"/ports/{pid}").raise_for_status()
