"""/v1/sfc/* (networking-sfc's resources) over a real store (SQLite and PostgreSQL, as test_api.py)."""
from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from fathom.model.chains import hop_marker
from fathom.store.snapshot import load_snapshot

from .test_api import OTHER, Client, lists_in_fixed_statements


def _port(client, net, sub, name, node, i, project="p1", security=False):
    return client.post("/ports", {"network_id": net["id"], "name": name, "node": node, "interface_name": name,
                                  "project_id": project, "mac_address": f"02:fa:00:00:{net['id']:02x}:{i:02x}",
                                  "fixed_ips": [{"subnet_id": sub["id"], "ip_address": f"{sub['cidr'][:-4]}{i}"}],
                                  "port_security": security})


@pytest.fixture
def api(db_url):
    client = Client(db_url)
    client.post("/nodes", {"name": "c1", "tunnel_ip": "198.18.0.1"})
    client.post("/nodes", {"name": "c2", "tunnel_ip": "198.18.0.2"})
    net = client.post("/networks", {"name": "blue", "project_id": "p1"})
    sub = client.post("/subnets", {"network_id": net["id"], "cidr": "198.19.1.0/24", "project_id": "p1"})
    client.ports = {}
    for i, (name, node, sec) in enumerate((("client", "c1", True), ("server", "c2", True), ("fw1i", "c1", False),
                                           ("fw1o", "c1", False), ("fw2i", "c2", False), ("fw2o", "c2", False),
                                           ("dpii", "c2", False), ("dpio", "c2", False), ("secure", "c1", True),
                                           ("spare", "c1", False), ("spare2", "c1", False)),
                                          start=10):
        client.ports[name] = _port(client, net, sub, name, node, i, security=sec)["id"]
    other = client.post("/networks", {"name": "green", "project_id": "p1"})
    osub = client.post("/subnets", {"network_id": other["id"], "cidr": "198.19.2.0/24", "project_id": "p1"})
    client.ports["green"] = _port(client, other, osub, "green", "c1", 30)["id"]
    client.ports["greenvnf"] = _port(client, other, osub, "greenvnf", "c1", 31)["id"]
    red = client.post("/networks", {"name": "red", "project_id": "p2"})
    rsub = client.post("/subnets", {"network_id": red["id"], "cidr": "198.19.3.0/24", "project_id": "p2"})
    client.ports["evil"] = _port(client, red, rsub, "evil", "c2", 40, project="p2", security=True)["id"]
    client.ports["evil2"] = _port(client, red, rsub, "evil2", "c2", 41, project="p2")["id"]
    yield client
    client.app.state.engine.dispose()


def _chain(api, symmetric=False):
    p1 = api.post("/sfc/port_pairs", {"name": "fw1", "ingress": "fw1i", "egress": "fw1o", "project_id": "p1"})
    p2 = api.post("/sfc/port_pairs", {"name": "fw2", "ingress": "fw2i", "egress": "fw2o", "project_id": "p1"})
    p3 = api.post("/sfc/port_pairs", {"name": "dpi", "ingress": "dpii", "egress": "dpio", "project_id": "p1"})
    g1 = api.post("/sfc/port_pair_groups", {"name": "fw", "port_pairs": [p1["id"], "fw2"], "project_id": "p1"})
    g2 = api.post("/sfc/port_pair_groups", {"name": "dpi", "port_pairs": [p3["id"]], "project_id": "p1"})
    fc = api.post("/sfc/flow_classifiers", {"name": "web", "protocol": "tcp", "destination_port_range_min": 80,
                                            "destination_port_range_max": 80, "logical_source_port": "client",
                                            "logical_destination_port": "server", "project_id": "p1"})
    chain = api.post("/sfc/port_chains", {"name": "c", "port_pair_groups": ["fw", g2["id"]],
                                          "flow_classifiers": [fc["id"]], "project_id": "p1",
                                          "chain_parameters": {"symmetric": symmetric}})
    return p1, p2, p3, g1, g2, fc, chain


def test_create_show_list_update_delete(api):
    p1, p2, p3, g1, g2, fc, chain = _chain(api, symmetric=True)
    assert (p1["ingress"], p1["egress"]) == (api.ports["fw1i"], api.ports["fw1o"])
    assert g1["port_pairs"] == [p1["id"], p2["id"]] and api.get(f"/sfc/port_pairs/{p1['id']}")["port_pair_group"] == g1["id"]
    assert fc["protocol"] == 6 and fc["destination_port_range_min"] == 80 and fc["port_chain"] is None
    assert chain["port_pair_groups"] == [g1["id"], g2["id"]] and chain["flow_classifiers"] == [fc["id"]]
    assert chain["chain_parameters"] == {"symmetric": True, "correlation": None}
    assert chain["hop_markers"] == [hop_marker(chain["id"], d, k) for d in (0, 1) for k in (0, 1)]
    assert (chain["status"], chain["status_reason"]) == ("pending", "waiting for the switches to hold it")
    assert api.get(f"/sfc/flow_classifiers/{fc['id']}")["port_chain"] == chain["id"]
    assert [c["id"] for c in api.get("/sfc/port_chains")] == [chain["id"]]
    assert [c["id"] for c in api.get("/sfc/port_pairs", limit=2)] == [p1["id"], p2["id"]]
    assert [c["id"] for c in api.get("/sfc/port_pairs", marker=p2["id"])] == [p3["id"]]
    # update in place: reorder the groups, drop the classifier
    u = api.patch(f"/sfc/port_chains/{chain['id']}", {"port_pair_groups": [g2["id"], g1["id"]], "flow_classifiers": []})
    assert u["port_pair_groups"] == [g2["id"], g1["id"]] and u["flow_classifiers"] == []
    # the model follows
    with Session(api.app.state.engine) as s:
        snap = load_snapshot(s)
    assert snap.port_chains[0].port_pair_group_ids == (g2["id"], g1["id"]) and snap.port_chains[0].symmetric
    assert snap.port_pair_groups[0].port_pair_ids == (p1["id"], p2["id"])
    u = api.patch(f"/sfc/port_pair_groups/{g1['id']}", {"port_pairs": [p2["id"]]})
    assert u["port_pairs"] == [p2["id"]] and api.get(f"/sfc/port_pairs/{p1['id']}")["port_pair_group"] is None
    # members in use cannot go
    assert api.error("DELETE", f"/sfc/port_pair_groups/{g1['id']}", None, 409)[1].startswith("port pair group")
    assert api.error("DELETE", f"/sfc/port_pairs/{p2['id']}", None, 409)[1].startswith("port pair")
    assert "port pair" in api.error("DELETE", f"/ports/{api.ports['fw2i']}", None, 409)[1]
    assert "flow classifier" in api.error("DELETE", f"/ports/{api.ports['client']}", None, 409)[1]
    api.delete(f"/sfc/port_chains/{chain['id']}")
    assert api.get(f"/sfc/port_pair_groups/{g1['id']}")["port_chain"] is None
    for path in (f"/sfc/port_pair_groups/{g1['id']}", f"/sfc/port_pair_groups/{g2['id']}",
                 f"/sfc/port_pairs/{p1['id']}", f"/sfc/flow_classifiers/{fc['id']}"):
        api.delete(path)
    api.delete(f"/ports/{api.ports['fw1i']}")


def test_field_errors(api):
    e = api.error
    assert e("POST", "/sfc/port_pairs", {"ingress": "fw1i", "egress": "fw1i", "project_id": "p1"}, 422)[0] == ["egress"]
    assert e("POST", "/sfc/port_pairs", {"ingress": "fw1i", "egress": "greenvnf", "project_id": "p1"}, 422)[0] == ["egress"]
    loc, msg = e("POST", "/sfc/port_pairs", {"ingress": "fw1i", "egress": "secure", "project_id": "p1"}, 422)
    assert loc == ["egress"] and "port security" in msg
    # another project's port, even for an admin
    assert e("POST", "/sfc/port_pairs", {"ingress": "fw1i", "egress": "evil", "project_id": "p1"}, 422)[0] == ["egress"]
    api.post("/sfc/port_pairs", {"name": "fw1", "ingress": "fw1i", "egress": "fw1o", "project_id": "p1"})
    assert e("POST", "/sfc/port_pairs", {"ingress": "fw1o", "egress": "fw2o", "project_id": "p1"}, 409)[0] == ["ingress"]
    assert e("POST", "/sfc/flow_classifiers", {"logical_source_port": "fw1i", "project_id": "p1"}, 422)[0] == \
        ["logical_source_port"]
    assert e("POST", "/sfc/flow_classifiers", {"project_id": "p1"}, 422)[0] == ["logical_source_port"]
    assert e("POST", "/sfc/flow_classifiers", {"logical_source_port": "client", "logical_destination_port": "green",
                                               "project_id": "p1"}, 422)[0] == ["logical_destination_port"]
    assert e("POST", "/sfc/flow_classifiers", {"logical_source_port": "client", "destination_port_range_min": 80,
                                               "project_id": "p1"}, 422)[0] == ["destination_port_range_min"]
    assert e("POST", "/sfc/flow_classifiers", {"logical_source_port": "client", "protocol": "udp",
                                               "source_port_range_min": 90, "source_port_range_max": 80,
                                               "project_id": "p1"}, 422)[0] == ["source_port_range_max"]
    assert e("POST", "/sfc/flow_classifiers", {"logical_source_port": "client", "source_ip_prefix": "10.0.0.1/8",
                                               "project_id": "p1"}, 422)[0] == ["source_ip_prefix"]
    assert e("POST", "/sfc/flow_classifiers", {"logical_source_port": "client", "protocol": "gre",
                                               "project_id": "p1"}, 422)[0] == ["protocol"]
    assert e("POST", "/sfc/port_pair_groups", {"port_pairs": [], "project_id": "p1"}, 422)[0] == ["port_pairs"]
    assert e("POST", "/sfc/port_pair_groups", {"port_pairs": ["fw1", "nope"], "project_id": "p1"}, 404)[0] == \
        ["port_pairs", 1]


def test_chain_rules(api):
    p1, p2, p3, g1, g2, fc, chain = _chain(api)
    e = api.error
    # a group or classifier in one chain only; a port in one pair only
    assert e("POST", "/sfc/port_chains", {"port_pair_groups": [g1["id"]], "project_id": "p1"}, 409)[0] == \
        ["port_pair_groups", 0]
    assert e("POST", "/sfc/port_pairs", {"ingress": "fw1i", "egress": "dpio", "project_id": "p1"}, 409)[0] == ["ingress"]
    # an overlapping classifier (same source port, TCP 80 inside 0..1000) in another chain: 409 on the field
    fc2 = api.post("/sfc/flow_classifiers", {"logical_source_port": "client", "protocol": 6,
                                             "destination_port_range_min": 0, "destination_port_range_max": 1000,
                                             "project_id": "p1"})
    fc3 = api.post("/sfc/flow_classifiers", {"logical_source_port": "client", "protocol": "udp", "project_id": "p1"})
    api.patch(f"/sfc/port_chains/{chain['id']}", {"port_pair_groups": [g1["id"]]})
    loc, msg = e("POST", "/sfc/port_chains", {"port_pair_groups": [g2["id"]], "flow_classifiers": [fc3["id"], fc2["id"]],
                                              "project_id": "p1"}, 409)
    assert loc == ["flow_classifiers", 1] and "overlaps" in msg
    # not half-applied: g2 is still free
    assert api.get(f"/sfc/port_pair_groups/{g2['id']}")["port_chain"] is None
    ok = api.post("/sfc/port_chains", {"port_pair_groups": [g2["id"]], "flow_classifiers": [fc3["id"]], "project_id": "p1"})
    api.delete(f"/sfc/port_chains/{ok['id']}")
    # a port a classifier names never becomes a VNF port (nor the other way round)
    api.post("/sfc/flow_classifiers", {"logical_source_port": "client", "logical_destination_port": "spare",
                                       "project_id": "p1"})
    assert e("POST", "/sfc/port_pairs", {"ingress": "spare2", "egress": "spare", "project_id": "p1"}, 409)[0] == ["egress"]
    # symmetric chains need destination ports
    loc, msg = e("POST", "/sfc/port_chains", {"port_pair_groups": [g2["id"]], "flow_classifiers": [fc3["id"]],
                                              "chain_parameters": {"symmetric": True}, "project_id": "p1"}, 422)
    assert loc == ["flow_classifiers", 0] and "logical_destination_port" in msg


def test_projects_see_only_their_own(api):
    _chain(api)
    for path in ("/sfc/port_pairs", "/sfc/port_pair_groups", "/sfc/flow_classifiers", "/sfc/port_chains"):
        assert api.get(path, headers=OTHER) == []
    chain_id = api.get("/sfc/port_chains")[0]["id"]
    api.get(f"/sfc/port_chains/{chain_id}", status=404, headers=OTHER)
    api.error("DELETE", f"/sfc/port_chains/{chain_id}", None, 404, headers=OTHER)
    # a member of p2 cannot name p1's ports (404 on the field, as for a missing port)
    assert api.error("POST", "/sfc/port_pairs", {"ingress": "fw1i", "egress": "fw1o"}, 404, headers=OTHER)[0] == ["ingress"]
    assert api.error("POST", "/sfc/port_pairs", {"ingress": "evil", "egress": "evil2"}, 422,
                     headers=OTHER)[1].endswith("turn it off (PATCH /v1/ports/%d port_security=false)" % api.ports["evil"])


def test_lists_of_groups_and_chains_read_in_as_many_statements_however_many_they_hold(api):
    """Listing port pair groups reads their pairs, listing chains their groups and classifiers, in a
    fixed number of statements, not in some per group or chain."""
    net = api.get("/networks", name="blue")[0]
    sub = api.get("/subnets", network_id=net["id"])[0]

    def grow(i: int):
        ingress = _port(api, net, sub, f"in{i}", "c1", 100 + 2 * i)["id"]
        egress = _port(api, net, sub, f"out{i}", "c1", 101 + 2 * i)["id"]
        pair = api.post("/sfc/port_pairs", {"ingress": ingress, "egress": egress, "project_id": "p1"})
        group = api.post("/sfc/port_pair_groups", {"port_pairs": [pair["id"]], "project_id": "p1"})
        fc = api.post("/sfc/flow_classifiers", {"protocol": "tcp", "logical_source_port": "client",
                                                "destination_port_range_min": 1000 + i,
                                                "destination_port_range_max": 1000 + i, "project_id": "p1"})
        api.post("/sfc/port_chains", {"port_pair_groups": [group["id"]], "flow_classifiers": [fc["id"]],
                                      "project_id": "p1"})

    lists_in_fixed_statements(api, ("/sfc/port_pair_groups", "/sfc/port_chains"), grow)
    # and the answers still hold each one's members, as each one's own answer does
    groups, chains = api.get("/sfc/port_pair_groups"), api.get("/sfc/port_chains")
    assert all(len(g["port_pairs"]) == 1 and g["port_chain"] for g in groups)
    assert all(len(c["port_pair_groups"]) == 1 and len(c["flow_classifiers"]) == 1 for c in chains)
    assert groups == [api.get(f"/sfc/port_pair_groups/{g['id']}") for g in groups]
    assert chains == [api.get(f"/sfc/port_chains/{c['id']}") for c in chains]
