"""Fabric: the compiler (fabric switch, br-phy, br-int additions, tenant view) and the API checks."""
from __future__ import annotations

import json

import pytest

from fathom.apps import BR_PHY, SwitchKey, compile_bridge
from fathom.apps import compile_all as compile_switches
from fathom.apps.fabric import compiler as fc
from fathom.controller.fabric import lldp_parse, lldp_probe
from fathom.model import (
    FabricState, FixedIp, Link, Mode, Network, Node, Port, Router, RouterInterface, Snapshot, Subnet, FabricSwitch,
    datapath_id_fabric, routers,
)
from fathom.openflow.spec import DecTtl, Output, PushVlan, SetField, SwitchState
from fathom.pipeline import cookies as ck
from fathom.pipeline import stages as st

from .flowsim import compile_tenant


def compile_all(s: Snapshot) -> dict:
    """Every br-int of the snapshot, by node."""
    return compile_bridge(s, "br-int")


def snap(mode: str = "distributed", gw_ports: int = 0, links=("c1", "c2", "gw")) -> Snapshot:
    nodes = (Node(1, "c1", "compute", "198.18.0.1", None, "complete", {"patch-phy": 2, "va": 10, "vb": 11}),
             Node(2, "c2", "compute", "198.18.0.2", None, "complete", {"patch-phy": 2, "vc": 10, "vd": 11}),
             Node(3, "gw", "gateway", "198.18.0.3", None, "complete", {"patch-phy": 2, "qrp5": 20, "qrp6": 21}))
    nets = (Network(1, "red", "p", "vlan", 110), Network(2, "green", "p", "vlan", 120))
    subnets = (Subnet(1, "red", "p", 1, "198.19.10.0/24", "198.19.10.1"),
               Subnet(2, "green", "p", 2, "198.19.20.0/24", "198.19.20.1"))
    ports = [Port(1, "va", "p", 1, "02:00:00:00:0a:01", (FixedIp(1, "198.19.10.11"),), "c1", "va"),
             Port(2, "vb", "p", 2, "02:00:00:00:14:01", (FixedIp(2, "198.19.20.11"),), "c1", "vb"),
             Port(3, "vc", "p", 1, "02:00:00:00:0a:02", (FixedIp(1, "198.19.10.12"),), "c2", "vc"),
             Port(4, "vd", "p", 2, "02:00:00:00:14:02", (FixedIp(2, "198.19.20.12"),), "c2", "vd")]
    for i in range(gw_ports):
        ports.append(Port(10 + i, f"t{i}", "p", 1, f"02:00:00:00:ff:{i:02x}", (), "gw", f"t{i}"))
    ris = (RouterInterface(5, 1, 1, 1, "198.19.10.1", "02:fd:00:00:00:05"),
           RouterInterface(6, 1, 2, 2, "198.19.20.1", "02:fd:00:00:00:06"))
    modes = () if mode == "distributed" else (Mode(1, mode, "gw" if mode == "network-node" else None),)
    fab = FabricState((FabricSwitch(1, "tor", "198.18.1.9", "br-fabric", 100, 999),),
                      tuple(Link(1, n, None, n, "declared") for n in links) + (Link(1, "c2", 2, "c2", "lldp", 5.0),),
                      modes, {"tor": {"c1": 1, "c2": 2, "gw": 3}})
    return Snapshot(nodes, nets, subnets, tuple(ports), (Router(1, "r1", "p"),), ris, fabric=fab)


def fabric_vlans(s: Snapshot) -> dict:
    return fc.fabric_vlans(s, compile_all(s))


def compile_fabric_switches(s: Snapshot) -> dict:
    return fc.compile_fabric_switches(s, compile_all(s))


def test_vlans_allowed_only_where_the_network_has_ports():
    assert fabric_vlans(snap()) == {"tor": {"c1": {110, 120}, "c2": {110, 120}, "gw": set()}}
    assert fabric_vlans(snap(gw_ports=1))["tor"]["gw"] == {110}
    assert fabric_vlans(snap(gw_ports=2))["tor"]["gw"] == {110}
    flows = compile_fabric_switches(snap())["tor"].flows
    allow = {(dict(f.match)["in_port"], dict(f.match)["vlan_vid"] & 0xFFF) for f in flows
             if f.table == fc.FABRIC_TRUNK_IN and f.priority == fc.PRIO_ALLOW}
    assert allow == {(1, 110), (1, 120), (2, 110), (2, 120)}
    groups = {g.group_id: g.buckets for g in compile_fabric_switches(snap(gw_ports=1))["tor"].groups}
    assert groups[st.group_id(st.APP_FABRIC, 1)] == ((Output(1),), (Output(2),), (Output(3),))
    assert groups[st.group_id(st.APP_FABRIC, 2)] == ((Output(1),), (Output(2),))


def test_lldp_link_wins_over_declared_wiring():
    s = snap()
    assert s.fabric.node_ports(s.fabric.switches[0])["c2"] == ("c2", 2)
    # LLDP says c2 is behind port "x": the declared port is ignored for c2
    fab = s.fabric
    moved = FabricState(fab.switches, fab.links + (Link(1, "x", 7, "c2", "lldp", 9.0),), fab.modes,
                        {"tor": {"c1": 1, "c2": 2, "gw": 3, "x": 7}})
    assert moved.node_ports(fab.switches[0])["c2"] == ("x", 7)


def test_distributed_router_routes_in_br_int_not_the_tor():
    s = snap()
    tor = compile_fabric_switches(s)["tor"]
    assert not any(DecTtl() in f.actions for f in tor.flows)
    assert any(DecTtl() in f.actions for f in compile_all(s)["c1"].flows)


def test_fabric_router_routes_in_the_tor_and_nodes_only_switch():
    s = snap("fabric")
    br_int = compile_all(s)
    for node in ("c1", "c2", "gw"):
        assert not any(DecTtl() in f.actions for f in br_int[node].flows), node
    # the gateway MAC goes up the trunk with the network's VLAN
    up = [f for f in br_int["c1"].flows if dict(f.match).get("eth_dst") == "02:fd:00:00:00:05"
          and f.table == st.L2]
    assert up and PushVlan(0x8100) in up[0].actions and SetField("vlan_vid", 0x1000 | 110) in up[0].actions
    tor = compile_fabric_switches(s)["tor"].flows
    routes = [f for f in tor if f.table == fc.FABRIC_SVI and DecTtl() in f.actions]
    assert len(routes) == 2
    red_to_green = next(f for f in routes if dict(f.match)["vlan_vid"] == 0x1000 | 110)
    assert SetField("vlan_vid", 0x1000 | 120) in red_to_green.actions
    assert SetField("eth_src", "02:fd:00:00:00:06") in red_to_green.actions
    arp = [f for f in tor if f.table == fc.FABRIC_SVI and dict(f.match).get("arp_tpa") == "198.19.10.1"]
    assert len(arp) == 1


def test_network_node_router_becomes_ports_on_the_gateway():
    s = snap("network-node")
    view = routers.tenant_view(s)
    assert view.router_interfaces == ()
    interfaces = [p for p in view.ports if p.node == "gw"]
    assert {(p.interface, p.mac_address) for p in interfaces} == {("qrp5", "02:fd:00:00:00:05"), ("qrp6", "02:fd:00:00:00:06")}
    assert fabric_vlans(s)["tor"]["gw"] == {110, 120}
    assert not any(DecTtl() in f.actions for st_ in compile_all(s).values() for f in st_.flows)
    assert routers.network_node_legs(s) == {"gw": list(s.router_interfaces)}
    # the same thing without a fabric: only the tenant compiler (and the ports' security groups),
    # unchanged for distributed routers
    plain = Snapshot(s.nodes, s.networks, s.subnets, s.ports, s.routers, s.router_interfaces)
    assert {n: SwitchState(frozenset(f for f in st_.flows if ck.parse_cookie(f.cookie)[0] != ck.APP_SECGROUPS),
                           st_.groups) for n, st_ in compile_all(plain).items()} == compile_tenant(plain)


def test_br_phy_punts_lldp_and_switches_normally():
    flows = compile_switches(snap())[SwitchKey(BR_PHY, "c1")].flows
    assert {(f.priority, dict(f.match).get("eth_type")) for f in flows} == {(0, None), (1000, 0x88CC)}


def test_lldp_probe_round_trip():
    assert lldp_parse(lldp_probe(datapath_id_fabric(3), 7)) == (datapath_id_fabric(3), 7)
    assert lldp_parse(b"\x01\x80\xc2\x00\x00\x0e" + b"\x00" * 6 + b"\x88\xcc" + b"\x00" * 20) is None


# ---------------------------------------------------------------------------------------------- API


@pytest.fixture
def client(tmp_path):
    from fastapi.testclient import TestClient
    from fathom.api.app import create_app
    from .auth import headers_for
    app = create_app(f"sqlite:///{tmp_path}/f.db")
    c = TestClient(app, headers=headers_for(app))
    return c


def _loc(r):
    return r.json()["detail"][0]["loc"]


def test_api_fabric_checks(client):
    c = client
    c.post("/v1/nodes", json={"name": "c1"}).raise_for_status()
    vx = c.post("/v1/networks", json={"name": "vx", "type": "vxlan"}).json()
    old = c.post("/v1/networks", json={"name": "far", "type": "vlan", "segmentation_id": 3000}).json()
    # a switch whose range excludes an existing VLAN network is refused, naming the field
    r = c.post("/v1/fabric/switches", json={"name": "tor", "management_ip": "198.18.1.9"})
    assert r.status_code == 409 and _loc(r) == ["body", "vlan_min"]
    c.delete(f"/v1/networks/{old['id']}").raise_for_status()
    r = c.post("/v1/fabric/switches", json={"name": "tor", "management_ip": "198.18.1.9", "vlan_min": 200,
                                             "vlan_max": 100})
    assert r.status_code == 422
    r = c.post("/v1/fabric/switches", json={"name": "tor", "management_ip": "198.18.1.9", "links": {"nope": "p1"}})
    assert r.status_code == 404 and _loc(r) == ["body", "links", "nope"]
    assert c.get("/v1/fabric/switches").json() == []          # nothing half-applied
    sw = c.post("/v1/fabric/switches", json={"name": "tor", "management_ip": "198.18.1.9", "vlan_min": 200,
                                              "vlan_max": 201, "links": {"c1": "c1"}}).json()
    assert [x["source"] for x in sw["links"]] == ["declared"]
    # VLAN ids: out of the fabric range, in use, allocated from the range
    r = c.post("/v1/networks", json={"name": "v", "type": "vlan", "segmentation_id": 150})
    assert r.status_code == 422 and _loc(r) == ["body", "segmentation_id"]
    a = c.post("/v1/networks", json={"name": "a", "type": "vlan"}).json()
    assert a["segmentation_id"] == 200
    r = c.post("/v1/networks", json={"name": "b", "type": "vlan", "segmentation_id": 200})
    assert r.status_code == 409 and _loc(r) == ["body", "segmentation_id"]
    assert c.post("/v1/networks", json={"name": "b", "type": "vlan"}).json()["segmentation_id"] == 201
    r = c.post("/v1/networks", json={"name": "c", "type": "vlan"})
    assert r.status_code == 409 and _loc(r) == ["body", "segmentation_id"]
    # router modes
    sa = c.post("/v1/subnets", json={"network_id": a["id"], "cidr": "198.19.1.0/24"}).json()
    sx = c.post("/v1/subnets", json={"network_id": vx["id"], "cidr": "198.19.2.0/24"}).json()
    rt = c.post("/v1/routers", json={"name": "r"}).json()
    c.post(f"/v1/routers/{rt['id']}/interfaces", json={"subnet_id": sa["id"]}).raise_for_status()
    assert c.patch(f"/v1/routers/{rt['id']}", json={"mode": "fabric"}).status_code == 200
    r = c.post(f"/v1/routers/{rt['id']}/interfaces", json={"subnet_id": sx["id"]})
    assert r.status_code == 409 and _loc(r) == ["body", "subnet_id"]      # fabric routes VLANs only
    assert len(c.get(f"/v1/routers/{rt['id']}").json()["interfaces"]) == 1
    r = c.patch(f"/v1/routers/{rt['id']}", json={"mode": "network-node"})
    assert r.status_code == 409 and _loc(r) == ["body", "mode"]          # no gateway node
    assert c.get(f"/v1/routers/{rt['id']}").json()["mode"] == "fabric"
    c.patch(f"/v1/routers/{rt['id']}", json={"mode": "distributed"}).raise_for_status()
    c.post(f"/v1/routers/{rt['id']}/interfaces", json={"subnet_id": sx["id"]}).raise_for_status()
    r = c.patch(f"/v1/routers/{rt['id']}", json={"mode": "fabric"})
    assert r.status_code == 409 and _loc(r) == ["body", "mode"]          # a VXLAN interface
    c.post("/v1/nodes", json={"name": "g", "role": "gateway"}).raise_for_status()
    assert c.patch(f"/v1/routers/{rt['id']}", json={"mode": "network-node"}).json()["gateway_node"] == "g"
    r = c.patch(f"/v1/routers/{rt['id']}", json={"mode": "network-node", "gateway_node": "c1"})
    assert r.status_code == 409 and _loc(r) == ["body", "gateway_node"]
    r = c.patch(f"/v1/routers/{rt['id']}", json={"mode": "teleport"})
    assert r.status_code == 422
    # deleting the router removes its mode with it
    for interface in c.get(f"/v1/routers/{rt['id']}/interfaces").json():
        c.delete(f"/v1/routers/{rt['id']}/interfaces/{interface['id']}").raise_for_status()
    c.delete(f"/v1/routers/{rt['id']}").raise_for_status()
    c.delete("/v1/nodes/2").raise_for_status()


def test_fabric_mode_needs_a_switch(client):
    c = client
    rt = c.post("/v1/routers", json={"name": "r"}).json()
    r = c.patch(f"/v1/routers/{rt['id']}", json={"mode": "fabric"})
    assert r.status_code == 409 and _loc(r) == ["body", "mode"] and "fabric switch" in r.json()["detail"][0]["msg"]


def test_network_node_waits_for_its_namespace_before_switching():
    s = snap("network-node")
    gw = s.nodes[2]
    not_ready = Snapshot(s.nodes[:2] + (Node(3, "gw", "gateway", "198.18.0.3", None, "complete", {"patch-phy": 2}),),
                         s.networks, s.subnets, s.ports, s.routers, s.router_interfaces, fabric=s.fabric)
    assert gw.ofport("qrp5") == 20
    assert routers.effective_modes(not_ready) == {}                 # still routed distributed meanwhile
    assert any(DecTtl() in f.actions for f in compile_all(not_ready)["c1"].flows)
    assert routers.network_node_legs(not_ready) == {"gw": list(s.router_interfaces)}   # but being built
    assert 1 in routers.effective_modes(s)


def test_cli_fabric_verbs(tmp_path, monkeypatch):
    import warnings
    from click.testing import CliRunner
    from fathom.api import create_app
    from fathom import client as client_module
    from fathom.cli.main import cli
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient
    from .auth import headers_for
    app = create_app(f"sqlite:///{tmp_path / 'cli.db'}")
    monkeypatch.setenv("FATHOM_TOKEN", headers_for(app)["Authorization"].split()[1])
    monkeypatch.setattr(client_module.httpx, "Client",
                        lambda base_url, headers, timeout: TestClient(app, base_url=base_url, headers=headers))
    run = lambda *a: CliRunner().invoke(cli, list(a), catch_exceptions=False)  # noqa: E731
    assert run("node", "create", "c1").exit_code == 0
    out = run("fabric", "add", "tor", "--management-ip", "198.18.1.9", "--link", "c1=p1")
    assert out.exit_code == 0 and "fabric switch 1 (tor) registered" in out.output
    assert "p1→c1(declared)" in run("fabric", "list").output
    assert run("router", "create", "r1").exit_code == 0
    assert json.loads(run("router", "show", "r1", "--json").output)["mode"] == "distributed"
    assert json.loads(run("router", "update", "r1", "--mode", "fabric", "--json").output)["mode"] == "fabric"
    assert json.loads(run("router", "list", "--json").output)[0]["mode"] == "fabric"
    out = run("router", "update", "r1", "--mode", "network-node")
    assert out.exit_code != 0 and "mode: mode network-node needs a node of role gateway" in out.output
    app.state.engine.dispose()


def test_router_mode_on_the_router_resource(client):
    c = client
    r = c.post("/v1/routers", json={"name": "r", "mode": "fabric"})
    assert r.status_code == 409 and _loc(r) == ["body", "mode"]       # no fabric switch: not created
    assert c.get("/v1/routers").json() == []
    rt = c.post("/v1/routers", json={"name": "r"}).json()
    assert (rt["mode"], rt["gateway_node"]) == ("distributed", None)
    c.post("/v1/nodes", json={"name": "g", "role": "gateway"}).raise_for_status()
    out = c.patch(f"/v1/routers/{rt['id']}", json={"mode": "network-node"}).json()
    assert (out["mode"], out["gateway_node"], out["name"]) == ("network-node", "g", "r")
    assert c.patch(f"/v1/routers/{rt['id']}", json={"name": "r2"}).json()["mode"] == "network-node"
    r = c.patch(f"/v1/routers/{rt['id']}", json={"mode": "fabric"})
    assert r.status_code == 409 and _loc(r) == ["body", "mode"]
    assert c.get(f"/v1/routers/{rt['id']}").json()["mode"] == "network-node"


def test_a_list_of_switches_reads_in_as_many_statements_however_many_switches_it_holds(client):
    """Listing fabric switches reads the nodes' names and the switches' links in a fixed number of
    statements, not in some per switch."""
    from .test_api import lists_in_fixed_statements

    class Api:      # what lists_in_fixed_statements needs of the shared client: the app and a GET
        app = client.app

        @staticmethod
        def get(path):
            r = client.get("/v1" + path)
            assert r.status_code == 200, r.text
            return r.json()

    def grow(i: int):
        client.post("/v1/nodes", json={"name": f"c{i}"}).raise_for_status()
        client.post("/v1/fabric/switches", json={"name": f"tor{i}", "management_ip": f"198.18.1.{i + 1}",
                                                  "links": {f"c{i}": "p1"}}).raise_for_status()

    bigger = lists_in_fixed_statements(Api, ("/fabric/switches",), grow)["/fabric/switches"]
    # and the answers still hold each switch's links, as each switch's own answer does
    assert [[x["node"] for x in sw["links"]] for sw in bigger] == [[f"c{i}"] for i in range(6)]
    assert bigger == [Api.get(f"/fabric/switches/{sw['id']}") for sw in bigger]
