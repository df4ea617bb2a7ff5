"""/v1/security-groups, /v1/security-group-rules and ports' groups over a real store (SQLite and
PostgreSQL, as tests/unit/test_api.py)."""
from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from fathom.store.db import make_engine, migrate
from fathom.store.snapshot import load_snapshot

from .test_api import MEMBER, OTHER, Client


@pytest.fixture
def api(db_url):  # noqa: F811
    client = Client(db_url)
    client.post("/nodes", {"name": "c1", "tunnel_ip": "198.18.0.1"})
    net = client.post("/networks", {"name": "blue", "project_id": "p1"})
    client.post("/subnets", {"network_id": net["id"], "cidr": "198.19.1.0/24"})
    other = client.post("/networks", {"name": "red", "project_id": "p2"})
    client.post("/subnets", {"network_id": other["id"], "cidr": "198.19.2.0/24"})
    client.net, client.other = net, other
    yield client
    client.app.state.engine.dispose()


def _default(api, who=MEMBER) -> dict:
    return next(g for g in api.get("/security-groups", headers=who) if g["name"] == "default")


def test_a_port_joins_its_projects_default_group_made_on_first_use(api):
    assert api.get("/security-groups") == []             # an admin's list makes nothing
    port = api.post("/ports", {"network_id": api.net["id"], "name": "vm1"}, headers=MEMBER)
    groups = api.get("/security-groups", headers=MEMBER)
    assert [g["name"] for g in groups] == ["default"]
    default = groups[0]
    assert port["security_groups"] == [default["id"]]
    rules = {(r["direction"], r["ethertype"], r["protocol"], r["remote_group_id"]) for r in default["rules"]}
    assert rules == {("egress", "IPv4", None, None), ("egress", "IPv6", None, None),
                     ("ingress", "IPv4", None, default["id"]), ("ingress", "IPv6", None, default["id"])}
    # one default per project, however it is reached
    api.post("/ports", {"network_id": api.net["id"], "name": "vm2"}, headers=MEMBER)
    assert len(api.get("/security-groups", headers=MEMBER)) == 1
    # another project listing its groups gets its own
    assert [g["project_id"] for g in api.get("/security-groups", headers=OTHER)] == ["p2"]


def test_groups_rules_and_ports(api):
    web = api.post("/security-groups", {"name": "web", "description": "front"}, headers=MEMBER)
    assert (web["rules"], web["project_id"], web["status"]) == ([], "p1", "pending")
    r80 = api.post("/security-group-rules", {"security_group_id": web["id"], "direction": "ingress",
                                             "protocol": "tcp", "port_range_min": 80}, headers=MEMBER)
    assert (r80["protocol"], r80["port_range_min"], r80["port_range_max"]) == ("tcp", 80, 80)
    ping = api.post("/security-group-rules", {"security_group_id": web["id"], "direction": "ingress",
                                              "protocol": "icmp", "port_range_min": 8,
                                              "remote_ip_prefix": "10.1.2.3/16"}, headers=MEMBER)
    assert ping["remote_ip_prefix"] == "10.1.0.0/16" and ping["port_range_max"] is None
    v6 = api.post("/security-group-rules", {"security_group_id": web["id"], "direction": "egress",
                                            "ethertype": "IPv6", "protocol": "icmp"}, headers=MEMBER)
    assert v6["protocol"] == "ipv6-icmp"
    num = api.post("/security-group-rules", {"security_group_id": web["id"], "direction": "egress",
                                             "protocol": "47"}, headers=MEMBER)
    assert num["protocol"] == "47"
    assert [r["id"] for r in api.get(f"/security-groups/{web['id']}", headers=MEMBER)["rules"]] == \
        [r80["id"], ping["id"], v6["id"], num["id"]]
    assert [r["id"] for r in api.get("/security-group-rules", headers=MEMBER, security_group_id=web["id"],
                                     limit=2, marker=r80["id"])] == [ping["id"], v6["id"]]
    port = api.post("/ports", {"network_id": api.net["id"], "security_groups": [web["id"]]}, headers=MEMBER)
    assert port["security_groups"] == [web["id"]]
    default = _default(api)
    both = api.patch(f"/ports/{port['id']}", {"security_groups": [web["id"], default["id"], web["id"]]},
                     headers=MEMBER)
    assert both["security_groups"] == sorted([web["id"], default["id"]])
    # the model the compilers read
    with Session(api.app.state.engine) as s:
        snap = load_snapshot(s)
    assert next(p for p in snap.ports if p.id == port["id"]).security_groups == tuple(sorted([web["id"], default["id"]]))
    rule = next(r for r in snap.security_group_rules if r.id == r80["id"])
    assert (rule.protocol, rule.port_min, rule.port_max, rule.direction) == (6, 80, 80, "ingress")
    # in use: not deleted; rules go one by one
    api.delete(f"/security-groups/{web['id']}", status=409, headers=MEMBER)
    api.delete(f"/security-group-rules/{r80['id']}", headers=MEMBER)
    api.get(f"/security-group-rules/{r80['id']}", status=404, headers=MEMBER)
    api.patch(f"/ports/{port['id']}", {"security_groups": [default["id"]]}, headers=MEMBER)
    assert api.patch(f"/security-groups/{web['id']}", {"name": "www"}, headers=MEMBER)["name"] == "www"
    assert api.get(f"/security-groups/{web['id']}/status", headers=MEMBER)["kind"] == "security_group"
    api.delete(f"/security-groups/{web['id']}", headers=MEMBER)
    assert api.get("/security-group-rules", headers=MEMBER, security_group_id=web["id"]) == []


def test_the_default_group_stays(api):
    default = _default(api)
    api.delete(f"/security-groups/{default['id']}", status=409, headers=MEMBER)
    api.patch(f"/security-groups/{default['id']}", {"name": "x"}, status=409, headers=MEMBER)
    api.post("/security-groups", {"name": "default"}, status=409, headers=MEMBER)
    assert api.patch(f"/security-groups/{default['id']}", {"description": "mine"},
                     headers=MEMBER)["description"] == "mine"


@pytest.mark.parametrize("rule,status,field", [
    ({"direction": "sideways"}, 422, "direction"),
    ({"direction": "ingress", "ethertype": "IPv5"}, 422, "ethertype"),
    ({"direction": "ingress", "protocol": "smtp"}, 422, "protocol"),
    ({"direction": "ingress", "protocol": 256}, 422, "protocol"),
    ({"direction": "ingress", "protocol": "icmpv6"}, 422, "protocol"),
    ({"direction": "ingress", "port_range_min": 80}, 422, "port_range_min"),
    ({"direction": "ingress", "protocol": "gre", "port_range_min": 80}, 422, "port_range_min"),
    ({"direction": "ingress", "protocol": "tcp", "port_range_min": 90, "port_range_max": 80}, 422, "port_range_min"),
    ({"direction": "ingress", "protocol": "tcp", "port_range_min": 0}, 422, "port_range_min"),
    ({"direction": "ingress", "protocol": "udp", "port_range_min": 1, "port_range_max": 70000}, 422, "port_range_max"),
    ({"direction": "ingress", "protocol": "icmp", "port_range_max": 0}, 422, "port_range_min"),
    ({"direction": "ingress", "protocol": "icmp", "port_range_min": 300}, 422, "port_range_min"),
    ({"direction": "ingress", "remote_ip_prefix": "fd00::/8"}, 422, "remote_ip_prefix"),
    ({"direction": "ingress", "remote_ip_prefix": "banana"}, 422, "remote_ip_prefix"),
    ({"direction": "ingress", "remote_ip_prefix": "10.0.0.0/8", "remote_group_id": "DEFAULT"}, 422, "remote_group_id"),
    ({"direction": "ingress", "remote_group_id": 999999}, 404, "remote_group_id"),
    ({"direction": "ingress", "remote_group_id": 0}, 404, "remote_group_id"),
    ({"direction": "ingress", "extra": 1}, 422, "extra"),
])
def test_rule_errors_name_their_field(api, rule, status, field):
    default = _default(api)
    body = {"security_group_id": default["id"], **{k: default["id"] if v == "DEFAULT" else v for k, v in rule.items()}}
    r = api.http.post("/v1/security-group-rules", json=body, headers=api.who(MEMBER))
    assert r.status_code == status, r.text
    assert r.json()["detail"][0]["loc"][-1] == field, r.text


def test_duplicate_rules_and_limits(api):
    default = _default(api)
    body = {"security_group_id": default["id"], "direction": "ingress", "protocol": "tcp", "port_range_min": 22}
    api.post("/security-group-rules", body, headers=MEMBER)
    api.post("/security-group-rules", body, status=409, headers=MEMBER)
    too_many = list(range(1, 40))
    r = api.http.post("/v1/ports", json={"network_id": api.net["id"], "security_groups": too_many},
                      headers=api.who(MEMBER))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "security_groups"


def test_projects_never_meet(api):
    mine = _default(api)
    theirs = _default(api, OTHER)
    # another project's group is not there for a tenant
    api.get(f"/security-groups/{theirs['id']}", status=404, headers=MEMBER)
    api.delete(f"/security-groups/{theirs['id']}", status=404, headers=MEMBER)
    assert all(g["project_id"] == "p1" for g in api.get("/security-groups", headers=MEMBER))
    assert all(r["project_id"] == "p1" for r in api.get("/security-group-rules", headers=MEMBER))
    rule = theirs["rules"][0]["id"]
    api.get(f"/security-group-rules/{rule}", status=404, headers=MEMBER)
    api.delete(f"/security-group-rules/{rule}", status=404, headers=MEMBER)
    # nor usable: as a remote group (an admin neither), as a port's group, as the group of a rule
    for who in (MEMBER, None):
        r = api.http.post("/v1/security-group-rules", json={"security_group_id": mine["id"], "direction": "ingress",
                                                            "remote_group_id": theirs["id"]}, headers=api.who(who))
        assert r.status_code == 404 and r.json()["detail"][0]["loc"][-1] == "remote_group_id", r.text
    r = api.http.post("/v1/ports", json={"network_id": api.net["id"], "security_groups": [theirs["id"]]},
                      headers=api.who(MEMBER))
    assert r.status_code == 404 and r.json()["detail"][0]["loc"][-2:] == ["security_groups", 0], r.text
    r = api.http.post("/v1/ports", json={"network_id": api.net["id"], "project_id": "p1",
                                         "security_groups": [theirs["id"]]})
    assert r.status_code == 404, r.text   # an admin neither: a port joins groups of its own project
    r = api.http.post("/v1/security-group-rules", json={"security_group_id": theirs["id"], "direction": "ingress"},
                      headers=api.who(MEMBER))
    assert r.status_code == 404 and r.json()["detail"][0]["loc"][-1] == "security_group_id", r.text


def test_port_security_off_means_no_groups(api):
    port = api.post("/ports", {"network_id": api.net["id"], "port_security": False}, headers=MEMBER)
    assert port["security_groups"] == []
    default = _default(api)
    r = api.http.post("/v1/ports", json={"network_id": api.net["id"], "port_security": False,
                                         "security_groups": [default["id"]]}, headers=api.who(MEMBER))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "security_groups"
    on = api.post("/ports", {"network_id": api.net["id"]}, headers=MEMBER)
    r = api.http.patch(f"/v1/ports/{on['id']}", json={"port_security": False}, headers=api.who(MEMBER))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "port_security"
    assert api.get(f"/ports/{on['id']}", headers=MEMBER)["port_security"] is True       # nothing half-applied
    off = api.patch(f"/ports/{on['id']}", {"port_security": False, "security_groups": []}, headers=MEMBER)
    assert (off["port_security"], off["security_groups"]) == (False, [])
    # the router's interfaces have none
    router = api.post("/routers", {"name": "r"}, headers=MEMBER)
    subnet = api.get(f"/networks/{api.net['id']}")["subnets"][0]
    api.post(f"/routers/{router['id']}/interfaces", {"subnet_id": subnet}, headers=MEMBER)
    assert all(p["security_groups"] == [] for p in api.get("/ports", headers=MEMBER, router_id=router["id"]))


def test_migration_puts_existing_ports_in_their_default_group(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/old.db")
    migrate(engine, "0005_tokens")
    with engine.begin() as c:
        c.execute(text("INSERT INTO networks (name, project_id, status, created_at, type, segmentation_id) "
                       "VALUES ('n', 'p1', 'active', CURRENT_TIMESTAMP, 'vxlan', 5)"))
        for i, (name, security) in enumerate((("a", 1), ("b", 1), ("c", 0))):
            c.execute(text("INSERT INTO ports (name, project_id, status, created_at, network_id, mac_address, "
                           "port_security) VALUES (:n, 'p1', 'active', CURRENT_TIMESTAMP, 1, :m, :s)"),
                      {"n": name, "m": f"02:00:00:00:00:0{i}", "s": security})
    migrate(engine)
    with engine.begin() as c:
        members = c.execute(text("SELECT p.name FROM port_security_groups m JOIN ports p ON p.id = m.port_id "
                                 "ORDER BY p.name")).scalars().all()
        rules = c.execute(text("SELECT count(*) FROM security_group_rules")).scalar_one()
        default = c.execute(text("SELECT project_id FROM default_security_groups")).scalars().all()
    assert (members, rules, default) == (["a", "b"], 4, ["p1"])
    engine.dispose()
