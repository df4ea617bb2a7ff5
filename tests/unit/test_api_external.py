"""External networks, router gateways and floating IPs through the REST API, on SQLite and PostgreSQL:
what is accepted, what is refused and with which field, and what the model then holds."""
from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from fathom.store.snapshot import load_snapshot

from .test_api import MEMBER, OTHER, Client, lists_in_fixed_statements  # noqa: F401 - the shared client


@pytest.fixture
def api(db_url):
    client = Client(db_url)
    yield client
    client.app.state.engine.dispose()


def loc(err: dict) -> list:
    return err["detail"][0]["loc"]


def cloud(api) -> dict:
    """A gateway node, an external VLAN network, and project p1's network behind a router."""
    api.post("/nodes", {"name": "c1", "tunnel_ip": "198.18.0.1"})
    api.post("/nodes", {"name": "gw", "role": "gateway", "tunnel_ip": "198.18.0.9"})
    ext = api.post("/networks", {"name": "ext", "type": "vlan", "segmentation_id": 300, "external": True,
                                 "upstream_mac": "02:fe:00:00:00:01"})
    api.post("/subnets", {"network_id": ext["id"], "cidr": "203.0.113.0/24"})
    net = api.post("/networks", {"name": "blue"}, headers=MEMBER)
    sub = api.post("/subnets", {"network_id": net["id"], "cidr": "10.0.0.0/24"}, headers=MEMBER)
    router = api.post("/routers", {"name": "r"}, headers=MEMBER)
    interface = api.post(f"/routers/{router['id']}/interfaces", {"subnet_id": sub["id"]}, headers=MEMBER)
    port = api.post("/ports", {"network_id": net["id"], "name": "vm", "node": "c1", "interface_name": "vm",
                               "project_id": "p1"})
    return {"ext": ext, "net": net, "sub": sub, "router": router, "interface": interface, "port": port}


def test_an_external_network_is_an_admins_provider_network(api):
    err = api.post("/networks", {"type": "vlan", "external": True}, status=403, headers=MEMBER)
    assert loc(err) == ["body", "external"]
    err = api.post("/networks", {"type": "vxlan", "external": True}, status=422)
    assert loc(err) == ["body", "type"]
    err = api.post("/networks", {"type": "vlan", "upstream_mac": "02:fe:00:00:00:01"}, status=422)
    assert loc(err) == ["body", "upstream_mac"]
    err = api.post("/networks", {"type": "flat", "external": True, "upstream_mac": "01:00:00:00:00:01"}, status=422)
    assert loc(err) == ["body", "upstream_mac"]    # a multicast MAC is no router
    api.post("/networks", {"type": "flat"})        # the uplink's flat network and ...
    ext = api.post("/networks", {"type": "flat", "external": True})   # ... the external port's are two
    assert ext["external"] is True
    api.post("/networks", {"type": "flat", "external": True}, status=409)


def test_a_router_gateway_and_a_floating_ip(api):
    c = cloud(api)
    # every project sees the external network (to take floating IPs from), and only that of admin's
    assert [n["name"] for n in api.get("/networks", headers=OTHER)] == ["ext"]
    assert api.get(f"/networks/{c['ext']['id']}", headers=OTHER)["external"] is True
    assert api.get("/networks", headers=MEMBER, name="ext")[0]["id"] == c["ext"]["id"]
    # seeing it is not using it as a tenant network
    api.post("/ports", {"network_id": c["ext"]["id"]}, status=404, headers=MEMBER)
    rid = c["router"]["id"]
    r = api.patch(f"/routers/{rid}", {"external_gateway": {"network_id": c["ext"]["id"]}}, headers=MEMBER)
    gw = r["external_gateway"]
    assert gw["ip_address"] == "203.0.113.2" and gw["node"] == "gw" and gw["enable_snat"] is True
    gw_node = next(n for n in api.get("/nodes") if n["name"] == "gw")
    api.delete(f"/nodes/{gw_node['id']}", status=409)      # it hosts the router's NAT
    fip = api.post("/floatingips", {"floating_network_id": c["ext"]["id"], "port_id": c["port"]["id"]},
                   headers=MEMBER)
    assert (fip["floating_ip_address"], fip["fixed_ip_address"], fip["router_id"], fip["project_id"]) == \
        ("203.0.113.3", "10.0.0.2", rid, "p1")
    assert api.get(f"/floatingips/{fip['id']}/status", headers=MEMBER)["kind"] == "floating_ip"
    with Session(api.app.state.engine) as s:
        snap = load_snapshot(s)
    (g,) = snap.router_gateways
    (f,) = snap.floating_ips
    assert (g.router_id, g.ip_address, g.node, g.snat) == (rid, "203.0.113.2", "gw", True)
    assert (f.ip_address, f.fixed_ip, f.port_id, f.router_id) == ("203.0.113.3", "10.0.0.2", c["port"]["id"], rid)
    assert g.ct_zone != f.ct_zone and min(g.ct_zone, f.ct_zone) >= 0x8000
    # the addresses' holder ports are nobody's workload: not in the model's ports, not deletable
    assert {p.name for p in snap.ports} == {"vm"}
    holders = [p for p in api.get("/ports") if p["name"].startswith(("router-gateway", "floating-ip"))]
    assert len(holders) == 2
    for p in holders:
        api.delete(f"/ports/{p['id']}", status=409)
        api.patch(f"/ports/{p['id']}", {"node": "c1", "interface_name": "x1"}, status=409)
    # what uses the gateway cannot go before it
    err = api.patch(f"/routers/{rid}", {"external_gateway": None}, status=409, headers=MEMBER)
    assert loc(err) == ["body", "external_gateway"]
    api.delete(f"/routers/{rid}/interfaces/{c['interface']['id']}", status=409, headers=MEMBER)
    api.delete(f"/routers/{rid}/interfaces?subnet_id={c['sub']['id']}", status=409, headers=MEMBER)
    api.delete(f"/routers/{rid}", status=409, headers=MEMBER)
    # disassociate, clear, delete: everything goes, the addresses are free again
    api.patch(f"/floatingips/{fip['id']}", {"port_id": None}, headers=MEMBER)
    api.patch(f"/routers/{rid}", {"external_gateway": None}, headers=MEMBER)
    api.delete(f"/floatingips/{fip['id']}", headers=MEMBER)
    assert [p for p in api.get("/ports") if p["network_id"] == c["ext"]["id"]] == []


def test_floating_ip_refusals_name_their_field(api):
    c = cloud(api)
    ext = c["ext"]["id"]
    # no router joins the port's subnet to the external network yet
    err = api.post("/floatingips", {"floating_network_id": ext, "port_id": c["port"]["id"]}, status=409,
                   headers=MEMBER)
    assert loc(err) == ["body", "port_id"]
    api.patch(f"/routers/{c['router']['id']}", {"external_gateway": {"network_id": ext}}, headers=MEMBER)
    # another project's port is refused as if it did not exist
    err = api.post("/floatingips", {"floating_network_id": ext, "port_id": c["port"]["id"]}, status=404,
                   headers=OTHER)
    assert loc(err) == ["body", "port_id"]
    # not an external network (or an unknown one)
    err = api.post("/floatingips", {"floating_network_id": c["net"]["id"]}, status=404, headers=MEMBER)
    assert loc(err) == ["body", "floating_network_id"]
    # an address in use: 409; a member may not choose one at all
    err = api.post("/floatingips", {"floating_network_id": ext, "floating_ip_address": "203.0.113.2"}, status=409)
    assert loc(err) == ["body", "floating_ip_address"]
    err = api.post("/floatingips", {"floating_network_id": ext, "floating_ip_address": "203.0.113.9"}, status=403,
                   headers=MEMBER)
    assert loc(err) == ["body", "floating_ip_address"]
    err = api.post("/floatingips", {"floating_network_id": ext, "floating_ip_address": "198.51.100.1"}, status=422)
    assert loc(err) == ["body", "floating_ip_address"]
    # one floating IP per port
    api.post("/floatingips", {"floating_network_id": ext, "port_id": c["port"]["id"]}, headers=MEMBER)
    err = api.post("/floatingips", {"floating_network_id": ext, "port_id": c["port"]["id"]}, status=409,
                   headers=MEMBER)
    assert loc(err) == ["body", "port_id"]
    # a fixed IP the port does not have
    other = api.post("/ports", {"network_id": c["net"]["id"]}, headers=MEMBER)
    fip = api.post("/floatingips", {"floating_network_id": ext}, headers=MEMBER)
    err = api.patch(f"/floatingips/{fip['id']}", {"port_id": other["id"], "fixed_ip_address": "10.0.0.99"},
                    status=422, headers=MEMBER)
    assert loc(err) == ["body", "fixed_ip_address"]
    # a router interface is not a target
    iface = api.get(f"/routers/{c['router']['id']}")["interfaces"][0]["id"]
    api.patch(f"/floatingips/{fip['id']}", {"port_id": iface}, status=409, headers=MEMBER)
    # another project sees none of it
    assert api.get("/floatingips", headers=OTHER) == []
    api.get(f"/floatingips/{fip['id']}", status=404, headers=OTHER)
    # deleting the associated port disassociates its floating IP
    api.delete(f"/ports/{c['port']['id']}", headers=MEMBER)
    assert all(f["port_id"] is None for f in api.get("/floatingips", headers=MEMBER))


def test_gateways_are_for_distributed_routers(api):
    c = cloud(api)
    rid, ext = c["router"]["id"], c["ext"]["id"]
    api.patch(f"/routers/{rid}", {"mode": "network-node"})
    err = api.patch(f"/routers/{rid}", {"external_gateway": {"network_id": ext}}, status=422)
    assert loc(err) == ["body", "external_gateway"]
    api.patch(f"/routers/{rid}", {"mode": "distributed"})
    api.patch(f"/routers/{rid}", {"external_gateway": {"network_id": ext}})
    err = api.patch(f"/routers/{rid}", {"mode": "network-node"}, status=422)
    assert loc(err) == ["body", "mode"]
    # a member chooses neither the address nor the node
    err = api.patch(f"/routers/{rid}", {"external_gateway": {"network_id": ext, "ip_address": "203.0.113.50"}},
                    status=403, headers=MEMBER)
    assert loc(err) == ["body", "external_gateway", "ip_address"]
    err = api.patch(f"/routers/{rid}", {"external_gateway": {"network_id": ext, "node": "c1"}}, status=409)
    assert loc(err) == ["body", "external_gateway", "node"]     # not a gateway node
    # an admin moves it to another address: the old one is free again
    r = api.patch(f"/routers/{rid}", {"external_gateway": {"network_id": ext, "ip_address": "203.0.113.50",
                                                           "enable_snat": False}})
    assert r["external_gateway"]["ip_address"] == "203.0.113.50" and r["external_gateway"]["enable_snat"] is False
    assert [p["fixed_ips"][0]["ip_address"] for p in api.get("/ports") if p["network_id"] == ext] == ["203.0.113.50"]


def test_a_list_of_routers_reads_their_gateways_in_as_many_statements_however_many_routers_it_holds(api):
    """Listing routers reads their external gateways (the address port and node of each) in a fixed
    number of statements, not in some per router."""
    c = cloud(api)

    def grow(_i):
        r = api.post("/routers", {"name": "more"}, headers=MEMBER)
        api.patch(f"/routers/{r['id']}", {"external_gateway": {"network_id": c["ext"]["id"]}}, headers=MEMBER)

    bigger = lists_in_fixed_statements(api, ("/routers",), grow)["/routers"]
    # and the answers still hold each router's gateway, as each router's own answer does
    gateways = [r["external_gateway"] for r in bigger if r["name"] == "more"]
    assert len({g["ip_address"] for g in gateways}) == 6 and {g["node"] for g in gateways} == {"gw"}
    assert bigger == [api.get(f"/routers/{r['id']}") for r in bigger]
