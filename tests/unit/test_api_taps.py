"""/v1/taps over a real store (SQLite and PostgreSQL, as tests/unit/test_api.py)."""
from __future__ import annotations

import pytest

from fathom.apps.vtap import compiler as vtap
from fathom.model import taps as filters
from fathom.store.snapshot import load_snapshot, load_tap_view
from sqlalchemy.orm import Session

from .test_api import MEMBER, OTHER, Client, lists_in_fixed_statements


@pytest.fixture
def api(db_url):  # noqa: F811
    client = Client(db_url)
    client.post("/nodes", {"name": "c1", "tunnel_ip": "198.18.0.1"})
    client.post("/nodes", {"name": "c2", "tunnel_ip": "198.18.0.2"})
    net = client.post("/networks", {"name": "blue", "project_id": "p1"})
    client.post("/subnets", {"network_id": net["id"], "cidr": "198.19.1.0/24"})
    for i, node in ((1, "c1"), (2, "c1"), (3, "c1"), (4, "c2")):
        client.post("/ports", {"network_id": net["id"], "name": f"vm{i}", "node": node,
                               "interface_name": f"vm{i}", "project_id": "p1",
                               "mac_address": f"02:fa:00:00:01:0{i}",
                               "fixed_ips": [{"ip_address": f"198.19.1.1{i}"}]})
    other = client.post("/networks", {"name": "red", "project_id": "p2"})
    client.post("/subnets", {"network_id": other["id"], "cidr": "198.19.2.0/24"})
    client.post("/ports", {"network_id": other["id"], "name": "evil", "node": "c2", "interface_name": "evil",
                           "project_id": "p2"})
    client.net = net
    yield client
    client.app.state.engine.dispose()


def test_create_show_list_update_delete(api):
    before = api.changes
    t = api.post("/taps", {"name": "web", "sender": "vm1", "receiver": "vm2", "monitor": "vm3",
                           "ip_proto": "tcp", "tp_dst": 80, "match": {"ip_dscp": "*"}})
    assert api.changes == before + 1
    assert t["sender"]["port_name"] == "vm1" and t["receiver"]["ip"] == "198.19.1.12"
    assert t["filters"] == {"ip_proto": 6, "tp_dst": "80"}
    # no controller runs here: nothing holds the policy's flows, so it is not active
    assert (t["status"], t["status_reason"]) == ("pending", "waiting for the switches to hold it")
    assert t["markers"] == [filters.marker(t["id"], 0, 0)]
    assert api.get(f"/taps/{t['id']}")["name"] == "web"
    assert [x["id"] for x in api.get("/taps")] == [t["id"]]
    u = api.patch(f"/taps/{t['id']}", {"tp_dst": "1000-2000", "monitor2": "vm4", "direction": "both"})
    assert u["filters"] == {"ip_proto": 6, "tp_dst": "1000-2000"} and u["monitor2"]["port_name"] == "vm4"
    assert len(u["markers"]) == 4
    u = api.patch(f"/taps/{t['id']}", {"ip_proto": "*", "tp_dst": None, "monitor2": None})
    assert u["filters"] == {} and u["monitor2"] is None
    api.delete(f"/taps/{t['id']}")
    api.get(f"/taps/{t['id']}", status=404)


def test_identifiers_by_id_name_and_mac_ip(api):
    t = api.post("/taps", {"sender": {"mac": "02:FA:00:00:01:01", "ip": "198.19.1.11"},
                           "receiver": {"mac": "02:aa:00:00:00:09", "ip": "198.19.9.9"},
                           "monitor": {"port": "vm3"}})
    assert t["sender"]["port_name"] == "vm1"
    assert t["receiver"] == {"port_id": None, "port_name": None, "mac": "02:aa:00:00:00:09",
                             "ip": "198.19.9.9", "node": None}
    vm3 = api.get("/ports", name="vm3")[0]["id"]
    assert api.post("/taps", {"sender": "vm1", "receiver": "vm2", "monitor": vm3, "priority": 5})["monitor"]["port_id"] == vm3


@pytest.mark.parametrize("body,status,field", [
    ({"sender": "nope", "receiver": "vm2", "monitor": "vm3"}, 404, ["sender"]),
    ({"sender": "vm1", "receiver": "vm2", "monitor": "vm1"}, 422, ["monitor"]),
    ({"sender": "vm1", "receiver": "vm2", "monitor": "vm2"}, 422, ["monitor"]),
    ({"sender": "vm1", "receiver": {"mac": "02:zz", "ip": "198.19.1.12"}, "monitor": "vm3"}, 422, ["receiver", "mac"]),
    ({"sender": "vm1", "receiver": {"mac": "02:fa:00:00:01:02", "ip": "300.1.1.1"}, "monitor": "vm3"}, 422, ["receiver", "ip"]),
    ({"sender": {"mac": "02:fa:00:00:01:09", "ip": "198.19.1.99"}, "receiver": "vm2", "monitor": "vm3"}, 422, ["sender"]),
    ({"sender": "vm1", "receiver": "vm2", "monitor": "vm3", "match": {"tcp_window": 5}}, 422, ["match", "tcp_window"]),
    ({"sender": "vm1", "receiver": "vm2", "monitor": "vm3", "match": {"ipv4_dst": "1.1.1.1"}}, 422, ["match", "ipv4_dst"]),
    ({"sender": "vm1", "receiver": "vm2", "monitor": "vm3", "tp_dst": "9-1"}, 422, ["tp_dst"]),
    ({"sender": "vm1", "receiver": "vm2"}, 422, ["monitor"]),
    ({"sender": "vm1", "receiver": {"mac": "02:aa:00:00:00:09", "ip": "198.19.9.9"}, "monitor": "vm3",
      "direction": "both"}, 422, ["direction"]),
    ({"sender": "*", "receiver": "*", "monitor": "vm3"}, 422, ["receiver"]),
    ({"sender": "*", "receiver": {"mac": "02:aa:00:00:00:09", "ip": "198.19.9.9"}, "monitor": "vm3"}, 422,
     ["receiver"]),
    ({"sender": "*", "receiver": "vm2", "monitor": "vm2"}, 422, ["monitor"]),
    ({"sender": "*", "receiver": "vm2", "monitor": "*"}, 404, ["monitor"]),
])
def test_bad_input_names_the_field(api, body, status, field):
    loc, msg = api.error("POST", "/taps", body, status)
    assert loc == field, msg
    assert api.get("/taps") == []


def test_ownership(api):
    # a member of p1 may tap p1's ports; p2 may not tap them, nor tap p1 traffic to its own monitor
    mine = api.post("/taps", {"sender": "vm1", "receiver": "vm2", "monitor": "vm3"}, headers=MEMBER)
    assert mine["project_id"] == "p1"
    # another project's port is answered exactly as a missing one (by name and by id)
    loc, msg = api.error("POST", "/taps", {"sender": "vm1", "receiver": "vm2", "monitor": "evil"}, 404, headers=OTHER)
    assert loc == ["sender"] and msg == "no port named 'vm1'"
    assert api.error("POST", "/taps", {"sender": "nosuch", "receiver": "vm2", "monitor": "evil"}, 404,
                     headers=OTHER) == (["sender"], "no port named 'nosuch'")
    vm1 = api.get("/ports", name="vm1")[0]["id"]
    assert api.error("POST", "/taps", {"sender": vm1, "receiver": "vm2", "monitor": "evil"}, 404, headers=OTHER) \
        == (["sender"], f"port {vm1} does not exist")
    loc, _ = api.error("POST", "/taps", {"sender": "vm1", "receiver": "vm2", "monitor": "evil", "priority": 1},
                       404, headers=MEMBER)
    assert loc == ["monitor"]
    # p2 does not see p1's policies
    api.get(f"/taps/{mine['id']}", status=404, headers=OTHER)
    assert api.get("/taps", headers=OTHER) == []
    # nothing of the refused requests reached the store
    with Session(api.app.state.engine) as s:
        assert [t.id for t in load_snapshot(s).tap_policies] == [mine["id"]]


def test_overlap_at_equal_priority_is_refused(api):
    api.post("/taps", {"sender": "vm1", "receiver": "vm2", "monitor": "vm3", "ip_proto": 6})
    loc, msg = api.error("POST", "/taps", {"sender": "vm1", "receiver": "vm2", "monitor": "vm4",
                                           "ip_proto": 6, "tp_dst": 80}, 409)
    assert loc == ["priority"] and "overlaps" in msg
    api.post("/taps", {"sender": "vm1", "receiver": "vm2", "monitor": "vm4", "ip_proto": 6, "tp_dst": 80,
                       "priority": 200})
    api.post("/taps", {"sender": "vm1", "receiver": "vm2", "monitor": "vm4", "ip_proto": 17})


def test_deleting_a_port_puts_its_policies_in_error(api):
    t = api.post("/taps", {"sender": "vm1", "receiver": "vm2", "monitor": "vm4"})
    api.delete(f"/ports/{t['monitor']['port_id']}")
    got = api.get(f"/taps/{t['id']}")
    assert got["status"] == "error" and "monitor port was deleted" in got["status_reason"]
    with Session(api.app.state.engine) as s:
        snap = load_snapshot(s)
    assert vtap.compile_vtap(snap) == {}


def test_unbound_sender_is_pending(api):
    p = api.post("/ports", {"network_id": api.net["id"], "name": "loose", "project_id": "p1"})
    t = api.post("/taps", {"sender": p["id"], "receiver": "vm2", "monitor": "vm3"})
    assert t["status"] == "pending" and "not bound" in t["status_reason"]


def test_any_receiver_and_external_id(api):
    """Receiver "*": everything the sender sends (a TaaS tap flow of direction OUT); the Neutron
    driver keys the policy by the tap flow's UUID (external_id, service identity only)."""
    service = {**api.who(("services", "service")), "X-Project": "p1"}
    t = api.post("/taps", {"sender": "vm1", "receiver": "*", "monitor": "vm4", "external_id": "flow-uuid"},
                 headers=service)
    assert t["receiver"] == {"port_id": None, "port_name": None, "mac": "*", "ip": "*", "node": None}
    assert (t["external_id"], t["project_id"]) == ("flow-uuid", "p1")
    assert [x["id"] for x in api.get("/taps", headers=service, external_id="flow-uuid")] == [t["id"]]
    assert api.error("POST", "/taps", {"sender": "vm2", "receiver": "*", "monitor": "vm4", "external_id": "x"},
                     403, headers=MEMBER)[0] == ["external_id"]
    # the same sender, any receiver again, same priority: overlap
    assert api.error("POST", "/taps", {"sender": "vm1", "receiver": "*", "monitor": "vm3"}, 409)[0] == ["priority"]
    with Session(api.app.state.engine) as s:
        states = vtap.compile_vtap(load_snapshot(s).with_ofports({"c1": {"vm1": 5, "vm3": 6, "vxlan0": 1},
                                                                   "c2": {"vm4": 7, "vxlan0": 1}}))
    assert any(f.table == vtap.st.TAP_INGRESS for f in states["c1"].flows)


def test_any_sender_taps_what_a_port_receives(api):
    """Sender "*": everything the receiver port receives, from anyone (TaaS direction IN), tapped at
    the receiver's edge (tap-egress); direction both with receiver "*" taps a port both ways (BOTH)."""
    t = api.post("/taps", {"sender": "*", "receiver": "vm2", "monitor": "vm4", "ip_proto": "udp"}, headers=MEMBER)
    assert t["sender"] == {"port_id": None, "port_name": None, "mac": "*", "ip": "*", "node": None}
    assert t["receiver"]["port_name"] == "vm2" and t["project_id"] == "p1"
    assert t["markers"] == [filters.marker(t["id"], 0, 0)]
    # one tap point per port and table: vm2 sending (tap-ingress) does not overlap vm2 receiving
    out = api.post("/taps", {"sender": "vm2", "receiver": "*", "monitor": "vm4"})
    # ... but a second "what vm2 receives" does, also as the reverse direction of a policy
    assert api.error("POST", "/taps", {"sender": "*", "receiver": "vm2", "monitor": "vm3"}, 409)[0] == ["priority"]
    both = api.post("/taps", {"sender": "vm1", "receiver": "*", "monitor": "vm4", "direction": "both"})
    assert len(both["markers"]) == 2
    assert api.error("POST", "/taps", {"sender": "*", "receiver": "vm1", "monitor": "vm3"}, 409)[0] == ["priority"]
    # switch a policy between "*" and a port as the sender
    u = api.patch(f"/taps/{out['id']}", {"sender": "*", "receiver": "vm3", "monitor": "vm4"})
    assert u["sender"]["mac"] == "*" and u["receiver"]["port_name"] == "vm3"
    u = api.patch(f"/taps/{u['id']}", {"sender": "vm1", "receiver": "vm3", "priority": 5})
    assert u["sender"]["port_name"] == "vm1"
    # another project cannot tap what p1's port receives (answered as a missing port)
    assert api.error("POST", "/taps", {"sender": "*", "receiver": "vm2", "monitor": "evil", "priority": 1}, 404,
                     headers=OTHER)[0] == ["receiver"]
    with Session(api.app.state.engine) as s:
        states = vtap.compile_vtap(load_snapshot(s).with_ofports({"c1": {"vm1": 5, "vm2": 6, "vm3": 8, "vxlan0": 1},
                                                                   "c2": {"vm4": 7, "vxlan0": 1}}))
    egress = {(dict(f.match).get("reg7"), dict(f.match).get("ip_proto"))
              for f in states["c1"].flows if f.table == vtap.st.TAP_EGRESS}
    assert egress == {(6, 17), (5, None)}       # what vm2 receives (UDP), what vm1 receives (both)


def test_a_list_of_taps_reads_in_as_many_statements_however_many_taps_it_holds(api):
    """Listing policies reads their ports (names, addresses, nodes) in a fixed number of statements,
    not in some per policy."""
    def grow(i: int):
        api.post("/taps", {"sender": "vm1", "receiver": "vm2", "monitor": "vm3", "monitor2": "vm4",
                           "direction": "both", "priority": 10 + i})

    bigger = lists_in_fixed_statements(api, ("/taps",), grow)["/taps"]
    # and the answers still hold each port's name, address and node, as each policy's own answer does
    ends = [(t[k]["port_name"], t[k]["ip"], t[k]["node"]) for t in bigger for k in ("sender", "monitor2")]
    assert set(ends) == {("vm1", "198.19.1.11", "c1"), ("vm4", "198.19.1.14", "c2")}
    assert bigger == [api.get(f"/taps/{t['id']}") for t in bigger]


def test_a_policys_checks_read_the_ports_it_names_and_judge_as_from_the_whole_store(api):
    """The checks of every tap API call (deleted or unbound ports, markers) read the nodes, the
    policies, the ports those name, their networks and those on the markers' VNIs (load_tap_view),
    not every port or network, and judge as they would from the whole store."""
    loose = api.post("/ports", {"network_id": api.net["id"], "name": "loose", "project_id": "p1"})
    ok = api.post("/taps", {"sender": "vm1", "receiver": "vm2", "monitor": "vm3"})
    gone = api.post("/taps", {"sender": "vm1", "receiver": "vm2", "monitor": "vm4", "priority": 200})
    unbound = api.post("/taps", {"sender": loose["id"], "receiver": "*", "monitor": "vm3", "priority": 300})
    api.delete(f"/ports/{gone['monitor']['port_id']}")
    for i in range(5):       # ports and networks no policy names
        api.post("/ports", {"network_id": api.net["id"], "name": f"idle{i}", "project_id": "p1"})
        api.post("/networks", {"name": f"idle{i}", "project_id": "p1"})
    # a network (of another project) on the VNI that marks ok's copies: ok cannot be installed
    clash = api.post("/networks", {"name": "clash", "project_id": "p3", "segmentation_id": filters.marker(ok["id"], 0, 0)})
    with Session(api.app.state.engine) as s:
        view, whole = load_tap_view(s), load_snapshot(s)
    assert {p.id for p in view.ports} == {ok["sender"]["port_id"], ok["receiver"]["port_id"],
                                          ok["monitor"]["port_id"], loose["id"]}
    assert {n.id for n in view.networks} == {api.net["id"], clash["id"]}
    judged = filters.static_problems(view)
    assert judged == filters.static_problems(whole)
    assert judged[ok["id"]] == [f"tap marker VNI {clash['segmentation_id']} is used by a tenant network"]
    assert judged[gone["id"]] and judged[unbound["id"]]
    # one policy's answer reads that policy and its ports only, and judges it the same
    with Session(api.app.state.engine) as s:
        one = load_tap_view(s, policies=[gone["id"]])
    assert [p.id for p in one.tap_policies] == [gone["id"]]
    assert {p.id for p in one.ports} == {gone["sender"]["port_id"], gone["receiver"]["port_id"]}
    assert filters.static_problems(one) == {gone["id"]: judged[gone["id"]]}
    shown = api.get(f"/taps/{gone['id']}")
    assert (shown["status"], shown["status_reason"]) == ("error", "; ".join(judged[gone["id"]]))
    assert [t["status_reason"] for t in api.get("/taps") if t["id"] == unbound["id"]] == ["; ".join(judged[unbound["id"]])]


def test_an_overlap_is_judged_from_the_named_ports_and_the_routes_as_from_the_whole_store(api):
    """The overlap check of a create or update reads the policies' ports, the subnets and the
    routers' interfaces (how a policy's traffic is routed and which MAC its frames carry), not every
    port, and finds the same overlaps as from the whole store: among routed and same-network policies
    at equal priority."""
    green = api.post("/networks", {"name": "green", "project_id": "p1"})
    sub = api.post("/subnets", {"network_id": green["id"], "cidr": "198.19.3.0/24"})
    far = api.post("/ports", {"network_id": green["id"], "name": "far", "node": "c2", "interface_name": "far",
                              "project_id": "p1", "fixed_ips": [{"ip_address": "198.19.3.10"}]})
    router = api.post("/routers", {"name": "r", "project_id": "p1"})
    blue_subnet = api.get("/subnets", network_id=api.net["id"])[0]
    for subnet in (blue_subnet, sub):
        api.post(f"/routers/{router['id']}/interfaces", {"subnet_id": subnet["id"]})
    for i in range(5):       # ports no policy names
        api.post("/ports", {"network_id": green["id"], "name": f"idle{i}", "project_id": "p1"})
    routed = api.post("/taps", {"sender": "vm1", "receiver": far["id"], "monitor": "vm3", "ip_proto": "tcp"})
    local = api.post("/taps", {"sender": "vm1", "receiver": "vm2", "monitor": "vm3", "priority": 200})
    # vm2's address in another network of the project: the frames carry another MAC, no overlap
    twin_net = api.post("/networks", {"name": "twin", "project_id": "p1"})
    api.post("/subnets", {"network_id": twin_net["id"], "cidr": "198.19.1.0/24"})
    twin = api.post("/ports", {"network_id": twin_net["id"], "name": "twin", "node": "c2", "interface_name": "twin",
                               "project_id": "p1", "fixed_ips": [{"ip_address": "198.19.1.12"}]})
    api.post("/taps", {"sender": "vm1", "receiver": twin["id"], "monitor": "vm3", "priority": 200})
    # vm1 to any address at the routed policy's priority: its routed traffic overlaps; refused
    loc, msg = api.error("POST", "/taps", {"sender": "vm1", "receiver": "*", "monitor": "vm4", "ip_proto": "tcp",
                                           "tp_dst": 80}, 409)
    assert loc == ["priority"] and f"overlaps policy {routed['id']}" in msg
    with Session(api.app.state.engine) as s:
        view, whole = load_tap_view(s, routes=True), load_snapshot(s)
    interfaces = {ri.id for ri in whole.router_interfaces}
    assert len(interfaces) == 2 and {ri.id for ri in view.router_interfaces} == interfaces
    assert {p.id for p in view.ports} == {routed["sender"]["port_id"], far["id"], routed["monitor"]["port_id"],
                                          local["receiver"]["port_id"], twin["id"]}
    for policy in (routed, local):
        assert filters.conflicting_policies(view, policy["id"]) == filters.conflicting_policies(whole, policy["id"])
