"""Subnets' DHCP over the REST API and the store (SQLite and PostgreSQL): enable_dhcp, DNS servers
and host routes (bounded, field-level 422s), changed in place with the host-local DHCP servers
following; the DHCP servers' own status per node, shown on the subnet and never the network's."""
from __future__ import annotations

from sqlalchemy.orm import Session

from fathom.model.hostlocal_desired import dhcp_servers
from fathom.controller import status
from fathom.controller.results import PassResult
from fathom.model.hostlocal import DhcpServer, digest
from fathom.store import agents as ag
from fathom.store.snapshot import load_snapshot
from fathom.store.status import write_statuses

from .test_api import Client  # noqa: F401 - the api fixture's client
from .test_api import api  # noqa: F401 - fixture


def _snapshot(api):
    with Session(api.app.state.engine) as s:
        return load_snapshot(s)


def _bound(api, cidr="198.19.1.0/24", **subnet):
    """Node c1, network blue with one subnet (`subnet` fields) and a port bound to c1."""
    api.post("/nodes", {"name": "c1", "tunnel_ip": "198.18.0.1"})
    net = api.post("/networks", {"name": "blue"})
    sub = api.post("/subnets", {"network_id": net["id"], "cidr": cidr, **subnet})
    api.post("/ports", {"network_id": net["id"], "node": "c1", "interface_name": "tap1"})
    return net, sub


def test_defaults_are_neutrons_and_fields_round_trip(api):
    net, sub = api.network()
    assert (sub["enable_dhcp"], sub["dns_nameservers"], sub["host_routes"], sub["dhcp_status"]) == (True, [], [], [])
    routes = [{"destination": "10.9.0.0/16", "nexthop": "10.1.0.5"}, {"destination": "0.0.0.0/0", "nexthop": "10.1.0.1"}]
    got = api.post("/subnets", {"network_id": net["id"], "cidr": "10.1.0.0/24", "enable_dhcp": False,
                                "dns_nameservers": ["192.0.2.53", "192.0.2.54"], "host_routes": routes})
    assert api.get(f"/subnets/{got['id']}") == got
    assert got["enable_dhcp"] is False and got["dns_nameservers"] == ["192.0.2.53", "192.0.2.54"]
    assert got["host_routes"] == routes
    model = {s.id: s for s in _snapshot(api).subnets}[got["id"]]
    assert model.enable_dhcp is False and model.dns_nameservers == ("192.0.2.53", "192.0.2.54")
    assert model.host_routes == (("10.9.0.0/16", "10.1.0.5"), ("0.0.0.0/0", "10.1.0.1"))


def test_bad_dhcp_fields_are_field_level_422s_and_change_nothing(api):
    net, _ = api.network()                          # created into: 10.2.0.0/24 in it
    _, sub = api.network("red", "10.2.0.0/24")       # updated
    base = {"network_id": net["id"], "cidr": "10.2.0.0/24"}
    route = {"destination": "10.9.0.0/16", "nexthop": "10.2.0.5"}
    cases = [
        ({"dns_nameservers": ["192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4", "192.0.2.5", "192.0.2.6"]},
         ["dns_nameservers"], "at most 5"),
        ({"dns_nameservers": ["192.0.2.300"]}, ["dns_nameservers", 0], "IPv4"),
        ({"dns_nameservers": ["2001:db8::1"]}, ["dns_nameservers", 0], "IPv4"),
        ({"dns_nameservers": ["192.0.2.1", "192.0.2.1"]}, ["dns_nameservers"], "twice"),
        ({"host_routes": [route] * 21}, ["host_routes"], "at most 20"),
        ({"host_routes": [{**route, "destination": "10.9.0.1/16"}]}, ["host_routes", 0, "destination"], "host bits"),
        ({"host_routes": [route, {**route, "nexthop": "10.2.0.6"}]}, ["host_routes"], "twice"),
        ({"host_routes": [{**route, "nexthop": "10.3.0.5"}]}, ["host_routes", 0, "nexthop"], "outside"),
        ({"host_routes": [{**route, "nexthop": "10.2.0.255"}]}, ["host_routes", 0, "nexthop"], "broadcast"),
        ({"host_routes": [{**route, "via": "10.2.0.5"}]}, ["host_routes", 0, "via"], "xtra"),
        ({"host_routes": [{"destination": "10.9.0.0/16"}]}, ["host_routes", 0, "nexthop"], "required"),
        ({"enable_dhcp": "perhaps"}, ["enable_dhcp"], "bool"),
    ]
    for extra, loc, words in cases:
        got_loc, msg = api.error("POST", "/subnets", {**base, **extra}, 422)
        assert got_loc[:len(loc)] == loc and words.lower() in msg.lower(), (extra, got_loc, msg)
        got_loc, msg = api.error("PATCH", f"/subnets/{sub['id']}", extra, 422)
        assert got_loc[:len(loc)] == loc and words.lower() in msg.lower(), (extra, got_loc, msg)
    assert len(api.get("/subnets")) == 2 and api.get(f"/subnets/{sub['id']}") == sub


def test_an_update_changes_the_servers_in_place(api):
    net, sub = _bound(api, dns_nameservers=["192.0.2.53"])
    (before,) = dhcp_servers(_snapshot(api))["c1"]
    assert before.subnets[0].dns_nameservers == ("192.0.2.53",) and before.subnets[0].host_routes == ()
    got = api.patch(f"/subnets/{sub['id']}", {"dns_nameservers": ["192.0.2.54"],
                                              "host_routes": [{"destination": "10.9.0.0/16", "nexthop": "198.19.1.5"}]})
    assert got["name"] == sub["name"] and got["cidr"] == sub["cidr"]          # untouched fields stay
    (after,) = dhcp_servers(_snapshot(api))["c1"]
    assert after.subnets[0].dns_nameservers == ("192.0.2.54",)
    assert after.subnets[0].host_routes == (("10.9.0.0/16", "198.19.1.5"),)
    assert (after.network_id, after.mac, after.hosts) == (before.network_id, before.mac, before.hosts)
    assert api.patch(f"/subnets/{sub['id']}", {"name": "renamed"})["dns_nameservers"] == ["192.0.2.54"]
    api.patch(f"/subnets/{sub['id']}", {"dns_nameservers": []})
    assert dhcp_servers(_snapshot(api))["c1"][0].subnets[0].dns_nameservers == ()
    # desired state only for subnets with DHCP: off, the node runs no server for the network
    api.patch(f"/subnets/{sub['id']}", {"enable_dhcp": False})
    assert dhcp_servers(_snapshot(api)) == {}


def test_mtu_per_network_type(api):
    api.post("/nodes", {"name": "c1", "tunnel_ip": "198.18.0.1"})
    for i, kind in enumerate(("vxlan", "vlan", "flat")):
        net = api.post("/networks", {"name": kind, "type": kind})
        api.post("/subnets", {"network_id": net["id"], "cidr": f"198.19.{i}.0/24"})
        api.post("/ports", {"network_id": net["id"], "node": "c1", "interface_name": f"tap{i}"})
    nets = {n.id: n.type for n in _snapshot(api).networks}
    assert {nets[s.network_id]: s.mtu for s in dhcp_servers(_snapshot(api))["c1"]} == \
        {"vxlan": 1450, "vlan": 1500, "flat": 1500}


def test_dhcp_status_is_per_node_on_the_subnet_and_never_the_networks(api):
    net, sub = _bound(api)
    snap = _snapshot(api)
    (server,) = dhcp_servers(snap)["c1"]
    now = 1000.0
    desired = {"c1": [server]}

    def view(objects, reported):
        return ag.AgentView("c1", 1, 1, {}, objects, reported, now - 100)
    ok = {"dhcp_server:%d" % net["id"]: {"status": "active", "applied": digest([server])}}
    assert status.dhcp_servers(desired, {"c1": view(ok, now - 1)}, now, 15) == {net["id"]: (("c1", "active", None),)}
    silent = status.dhcp_servers(desired, {"c1": view(ok, now - 60)}, now, 15)
    assert silent[net["id"]][0][:2] == ("c1", "error") and "not reporting" in silent[net["id"]][0][2]
    # decided: on the subnet, per node; the network's status is the switches' word, not the agent's
    decided = status.decide(snap, PassResult(dhcp_servers=silent))
    assert decided[("subnet_dhcp", sub["id"])] == silent[net["id"]]
    assert decided[("network", net["id"])] == ("active", None)
    with Session(api.app.state.engine) as s, s.begin():
        write_statuses(s, {("subnet_dhcp", sub["id"]): decided[("subnet_dhcp", sub["id"])]})
    shown = api.get(f"/subnets/{sub['id']}")
    assert shown["dhcp_status"] == [{"node": "c1", "status": "error", "reason": silent[net["id"]][0][2]}]
    assert api.get(f"/networks/{net['id']}")["status"] != "error"
    # a subnet without DHCP has no servers to show
    api.patch(f"/subnets/{sub['id']}", {"enable_dhcp": False})
    assert status.decide(_snapshot(api), PassResult(dhcp_servers=silent))[("subnet_dhcp", sub["id"])] == ()


def test_server_object_is_owned_apart_from_its_network():
    server = DhcpServer(7, "0e:dc:00:00:00:07", 1450, 86400, (), ())
    assert server.owner == ("dhcp_server", 7)
