"""The REST API over a real store: every test runs on SQLite and on a real PostgreSQL server.

PostgreSQL is Debian's PostgreSQL 15 (installed by scripts/setup), started once per session in a
temp dir; each test gets a fresh database.
"""
from __future__ import annotations

import json
import re
import warnings

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session

from .flowsim import compile_tenant
from fathom.store.snapshot import load_snapshot
from fathom.store.status import set_node_state, set_status


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from fathom.api import create_app  # noqa: E402
from fathom.api.schemas import PortOut  # noqa: E402

from .auth import Identities, headers_for  # noqa: E402




class Client:
    """TestClient plus short helpers; `changes` counts on_change calls."""

    def __init__(self, db_url: str):
        self.changes = 0
        self.app = create_app(db_url, on_change=self._changed)
        self.admin = headers_for(self.app)
        self.http = TestClient(self.app, headers=self.admin)
        self.who = Identities(self.app)

    def _changed(self):
        self.changes += 1

    def post(self, path, body, status=201, headers=None):
        r = self.http.post("/v1" + path, json=body, headers=self.who(headers))
        assert r.status_code == status, r.text
        return r.json()

    def get(self, path, status=200, headers=None, **params):
        r = self.http.get("/v1" + path, params=params, headers=self.who(headers))
        assert r.status_code == status, r.text
        return r.json()

    def delete(self, path, status=204, headers=None):
        r = self.http.delete("/v1" + path, headers=self.who(headers))
        assert r.status_code == status, r.text
        return None if status == 204 else r.json()

    def patch(self, path, body, status=200, headers=None):
        r = self.http.patch("/v1" + path, json=body, headers=self.who(headers))
        assert r.status_code == status, r.text
        return r.json()

    def error(self, method, path, body, status, headers=None) -> tuple[list, str]:
        """(loc without 'body', msg) of the first error of a request that must fail with `status`."""
        r = self.http.request(method, "/v1" + path, json=body, headers=self.who(headers))
        assert r.status_code == status, r.text
        d = r.json()["detail"][0]
        return [p for p in d["loc"] if p != "body"], d["msg"]

    # A network with one subnet, the usual start.
    def network(self, name="blue", cidr="10.0.0.0/24", **extra):
        net = self.post("/networks", {"name": name, **extra})
        sub = self.post("/subnets", {"network_id": net["id"], "cidr": cidr, "name": f"{name}4"})
        return net, sub


@pytest.fixture
def api(db_url):
    client = Client(db_url)
    yield client
    client.app.state.engine.dispose()


# (project, roles) of a token: the Client issues one per identity
MEMBER = ("p1", "member")
OTHER = ("p2", "member")


# ---------------------------------------------------------------------------------------------- basics


def test_openapi_lists_every_resource(api):
    spec = api.http.get("/openapi.json").json()
    paths = spec["paths"]
    for p in ("/v1/nodes", "/v1/networks", "/v1/subnets", "/v1/ports", "/v1/routers",
              "/v1/routers/{router_id}/interfaces", "/v1/routers/{router_id}/interfaces/{interface_id}",
              "/v1/ports/{port_id}/status", "/v1/nodes/{node_id}/status"):
        assert p in paths
    # the errors every route documents have ErrorOut's shape, and every reference resolves
    assert paths["/v1/nodes"]["get"]["responses"]["404"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorOut"}
    assert spec["components"]["schemas"]["ErrorOut"]["properties"]["detail"]["items"] == {
        "$ref": "#/components/schemas/ErrorItem"}
    refs = set(re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', json.dumps(spec)))
    assert refs and refs <= set(spec["components"]["schemas"]), refs - set(spec["components"]["schemas"])


def test_crud_round_trip_and_on_change(api):
    node = api.post("/nodes", {"name": "c1", "tunnel_ip": "198.18.0.1"})
    assert (node["state"], node["status"]) == ("init", "pending")
    net, sub = api.network()
    assert net["type"] == "vxlan" and sub["gateway_ip"] == "10.0.0.1"
    port = api.post("/ports", {"network_id": net["id"], "name": "vm1", "node": "c1",
                               "interface_name": "tap1"})
    assert port["fixed_ips"] == [{"subnet_id": sub["id"], "ip_address": "10.0.0.2"}]
    assert port["mac_address"].startswith("02:fd:") and port["node"] == "c1"
    assert api.get(f"/ports/{port['id']}") == port
    assert [p["id"] for p in api.get("/ports", node="c1")] == [port["id"]]
    assert api.get("/networks", name="blue")[0]["subnets"] == [sub["id"]]
    assert api.patch(f"/ports/{port['id']}", {"interface_name": "tap9"})["interface_name"] == "tap9"
    assert api.patch(f"/networks/{net['id']}", {"name": "azure"})["name"] == "azure"
    api.delete(f"/ports/{port['id']}")
    api.get(f"/ports/{port['id']}", status=404)
    assert api.changes == 7   # node, network, subnet, port, 2 patches, delete; reads do not count


def test_unknown_ids_are_404(api):
    for path in ("/nodes/9", "/networks/9", "/subnets/9", "/ports/9", "/routers/9",
                 "/routers/9/interfaces", "/networks/9/status"):
        api.get(path, status=404)
    api.delete("/networks/9", status=404)
    assert api.error("POST", "/subnets", {"network_id": 9, "cidr": "10.0.0.0/24"}, 404)[0] == ["network_id"]
    net, _ = api.network()
    assert api.error("POST", "/ports", {"network_id": net["id"], "node": "nope"}, 404)[0] == ["node"]
    r = api.post("/routers", {"name": "r"})
    assert api.error("POST", f"/routers/{r['id']}/interfaces", {"subnet_id": 9}, 404)[0] == ["subnet_id"]
    assert api.error("DELETE", f"/routers/{r['id']}/interfaces/9", None, 404)[0] == ["interface_id"]
    assert api.error("DELETE", f"/routers/{r['id']}/interfaces?subnet_id=9", None, 404)[0] == ["subnet_id"]


# ---------------------------------------------------------------------------------------------- validation (422)


def test_field_level_422(api):
    net = api.post("/networks", {"name": "n"})
    cases = [
        ("/subnets", {"network_id": net["id"], "cidr": "10.0.0.1/24"}, ["cidr"], "host bits"),
        ("/subnets", {"network_id": net["id"], "cidr": "banana"}, ["cidr"], ""),
        ("/subnets", {"network_id": net["id"], "cidr": "10.0.0.0/31"}, ["cidr"], "prefix"),
        ("/subnets", {"network_id": net["id"], "cidr": "10.0.0.0/24", "gateway_ip": "10.0.1.1"},
         ["gateway_ip"], "outside"),
        ("/networks", {"type": "vlan", "segmentation_id": 4095}, ["segmentation_id"], "1..4094"),
        ("/networks", {"type": "flat", "segmentation_id": 5}, ["segmentation_id"], "flat"),
        ("/networks", {"type": "gre"}, ["type"], ""),
        ("/networks", {"name": "x", "colour": "red"}, ["colour"], ""),
        ("/ports", {"network_id": net["id"], "mac_address": "01:00:00:00:00:01"}, ["mac_address"], "multicast"),
        ("/ports", {"network_id": net["id"], "mac_address": "zz"}, ["mac_address"], "MAC"),
        ("/ports", {"network_id": net["id"], "interface_name": "a-very-long-interface"},
         ["interface_name"], ""),
        ("/nodes", {"name": "c1", "tunnel_ip": "300.1.1.1"}, ["tunnel_ip"], ""),
    ]
    for path, body, loc, words in cases:
        got_loc, msg = api.error("POST", path, body, 422)
        assert got_loc == loc, (body, got_loc, msg)
        assert words in msg, (body, msg)
    assert api.changes == 1


def test_ip_outside_the_subnet_is_422(api):
    net, sub = api.network()
    loc, msg = api.error("POST", "/ports", {"network_id": net["id"],
                                            "fixed_ips": [{"subnet_id": sub["id"], "ip_address": "10.0.1.5"}]}, 422)
    assert loc == ["fixed_ips", 0, "ip_address"] and "outside" in msg
    loc, _ = api.error("POST", "/ports", {"network_id": net["id"], "fixed_ips": [{"ip_address": "10.9.0.5"}]}, 422)
    assert loc == ["fixed_ips", 0, "ip_address"]
    loc, _ = api.error("POST", "/ports", {"network_id": net["id"], "fixed_ips": [{"ip_address": "10.0.0.255"}]}, 422)
    assert loc == ["fixed_ips", 0, "ip_address"]
    other, other_sub = api.network("red", "10.1.0.0/24")
    loc, _ = api.error("POST", "/ports", {"network_id": net["id"], "fixed_ips": [{"subnet_id": other_sub["id"]}]}, 422)
    assert loc == ["fixed_ips", 0, "subnet_id"]



def test_a_port_takes_at_most_sixteen_addresses(api):
    net, sub = api.network("wide", "10.0.0.0/16")
    changes = api.changes
    loc, msg = api.error("POST", "/ports", {"network_id": net["id"], "fixed_ips": [{"subnet_id": sub["id"]}] * 17}, 422)
    assert loc == ["fixed_ips"] and "16" in msg
    assert api.get("/ports") == [] and api.changes == changes
    port = api.post("/ports", {"network_id": net["id"], "fixed_ips": [{"subnet_id": sub["id"]}] * 16})
    assert len({a["ip_address"] for a in port["fixed_ips"]}) == 16


# ---------------------------------------------------------------------------------------------- conflicts (409)


def test_duplicate_ip_and_mac_in_a_network_but_not_across_networks(api):
    blue, _ = api.network("blue")
    red, _ = api.network("red")   # the same 10.0.0.0/24: overlapping address space is fine
    ip = [{"ip_address": "10.0.0.7"}]
    mac = "02:00:00:00:00:07"
    api.post("/ports", {"network_id": blue["id"], "fixed_ips": ip, "mac_address": mac})
    assert api.error("POST", "/ports", {"network_id": blue["id"], "fixed_ips": ip}, 409)[0] == \
        ["fixed_ips", 0, "ip_address"]
    assert api.error("POST", "/ports", {"network_id": blue["id"], "mac_address": mac}, 409)[0] == ["mac_address"]
    api.post("/ports", {"network_id": red["id"], "fixed_ips": ip, "mac_address": mac})
    # The gateway address is the router's, not a port's.
    assert api.error("POST", "/ports", {"network_id": blue["id"], "fixed_ips": [{"ip_address": "10.0.0.1"}]},
                     409)[0] == ["fixed_ips", 0, "ip_address"]


def test_segmentation_ids_allocated_and_conflicting(api):
    a = api.post("/networks", {"name": "a"})
    b = api.post("/networks", {"name": "b"})
    v = api.post("/networks", {"name": "v", "type": "vlan"})
    assert (a["segmentation_id"], b["segmentation_id"], v["segmentation_id"]) == (5000, 5001, 100)
    assert api.error("POST", "/networks", {"type": "vxlan", "segmentation_id": 5001}, 409)[0] == ["segmentation_id"]
    # VXLAN and VLAN ids are separate spaces.
    api.post("/networks", {"type": "vlan", "segmentation_id": 3000})
    api.post("/networks", {"type": "vxlan", "segmentation_id": 3000})
    api.post("/networks", {"type": "flat"})
    assert api.error("POST", "/networks", {"type": "flat"}, 409)[0] == ["type"]
    # A freed id is allocated again.
    api.delete(f"/networks/{a['id']}")
    assert api.post("/networks", {"name": "c"})["segmentation_id"] == 5000


def test_overlapping_subnets_in_one_network_conflict(api):
    net, _ = api.network()
    assert api.error("POST", "/subnets", {"network_id": net["id"], "cidr": "10.0.0.128/25"}, 409)[0] == ["cidr"]
    api.post("/subnets", {"network_id": net["id"], "cidr": "10.0.1.0/24"})


def test_deleting_things_in_use_conflicts(api):
    api.post("/nodes", {"name": "c1"})
    net, sub = api.network()
    port = api.post("/ports", {"network_id": net["id"], "node": "c1"})
    router = api.post("/routers", {"name": "r"})
    api.post(f"/routers/{router['id']}/interfaces", {"subnet_id": sub["id"]})

    assert "still has" in api.error("DELETE", f"/networks/{net['id']}", None, 409)[1]
    assert "router" in api.error("DELETE", f"/subnets/{sub['id']}", None, 409)[1]
    assert "interfaces" in api.error("DELETE", f"/routers/{router['id']}", None, 409)[1]
    assert "bound" in api.error("DELETE", "/nodes/1", None, 409)[1]
    interface = api.get(f"/routers/{router['id']}/interfaces")[0]
    assert "router" in api.error("DELETE", f"/ports/{interface['id']}", None, 409)[1]

    # an interface is removed by its own id (its port's): a workload port's id is no interface's
    assert api.error("DELETE", f"/routers/{router['id']}/interfaces/{port['id']}", None, 404)[0] == ["interface_id"]
    api.delete(f"/routers/{router['id']}/interfaces/{interface['id']}")
    assert "port" in api.error("DELETE", f"/subnets/{sub['id']}", None, 409)[1]
    api.delete(f"/ports/{port['id']}")
    api.delete(f"/routers/{router['id']}")
    api.delete(f"/networks/{net['id']}")     # takes its subnets along
    api.get(f"/subnets/{sub['id']}", status=404)
    api.delete("/nodes/1")


def test_interface_name_unique_per_node_and_tunnel_ip_per_node(api):
    api.post("/nodes", {"name": "c1", "tunnel_ip": "198.18.0.1"})
    api.post("/nodes", {"name": "c2"})
    assert api.error("POST", "/nodes", {"name": "c1"}, 409)[0] == ["name"]
    assert api.error("POST", "/nodes", {"name": "c3", "tunnel_ip": "198.18.0.1"}, 409)[0] == ["tunnel_ip"]
    net, _ = api.network()
    api.post("/ports", {"network_id": net["id"], "node": "c1", "interface_name": "tap1"})
    assert api.error("POST", "/ports", {"network_id": net["id"], "node": "c1", "interface_name": "tap1"},
                     409)[0] == ["interface_name"]
    api.post("/ports", {"network_id": net["id"], "node": "c2", "interface_name": "tap1"})


def test_router_interfaces(api):
    blue, b4 = api.network("blue", "10.0.0.0/24")
    green, g4 = api.network("green", "10.1.0.0/24")
    red, r4 = api.network("red", "10.0.0.0/24")
    r = api.post("/routers", {"name": "r"})
    interface = api.post(f"/routers/{r['id']}/interfaces", {"subnet_id": b4["id"]})
    assert (interface["ip_address"], interface["network_id"]) == ("10.0.0.1", blue["id"])
    api.post(f"/routers/{r['id']}/interfaces", {"subnet_id": g4["id"], "ip_address": "10.1.0.254"})
    assert api.error("POST", f"/routers/{r['id']}/interfaces", {"subnet_id": b4["id"]}, 409)[0] == ["subnet_id"]
    # red's 10.0.0.0/24 overlaps blue's on the same router: the router could not tell them apart.
    assert api.error("POST", f"/routers/{r['id']}/interfaces", {"subnet_id": r4["id"]}, 409)[0] == ["subnet_id"]
    nogw = api.post("/subnets", {"network_id": green["id"], "cidr": "10.2.0.0/24", "gateway_ip": None})
    assert nogw["gateway_ip"] is None
    assert api.error("POST", f"/routers/{r['id']}/interfaces", {"subnet_id": nogw["id"]}, 422)[0] == ["ip_address"]
    # An address taken by a port cannot be the router's.
    api.post("/ports", {"network_id": green["id"], "fixed_ips": [{"ip_address": "10.2.0.9"}]})
    assert api.error("POST", f"/routers/{r['id']}/interfaces",
                     {"subnet_id": nogw["id"], "ip_address": "10.2.0.9"}, 409)[0] == ["ip_address"]
    shown = api.get(f"/routers/{r['id']}")
    assert sorted(i["ip_address"] for i in shown["interfaces"]) == ["10.0.0.1", "10.1.0.254"]


# ---------------------------------------------------------------------------------------------- atomicity


def test_a_failed_request_leaves_the_store_unchanged(api):
    net, sub = api.network()
    before = api.get("/ports")
    changes = api.changes
    # The first address is fine, the second is outside: nothing of the port may remain.
    body = {"network_id": net["id"], "name": "half",
            "fixed_ips": [{"ip_address": "10.0.0.5"}, {"ip_address": "10.7.0.5"}]}
    api.error("POST", "/ports", body, 422)
    # Duplicate inside one request: 409, and again nothing remains.
    body["fixed_ips"] = [{"ip_address": "10.0.0.5"}, {"ip_address": "10.0.0.5"}]
    api.error("POST", "/ports", body, 409)
    assert api.get("/ports") == before
    assert api.changes == changes
    port = api.post("/ports", {"network_id": net["id"], "fixed_ips": [{"ip_address": "10.0.0.5"}]})
    assert port["fixed_ips"][0]["ip_address"] == "10.0.0.5"


# ---------------------------------------------------------------------------------------------- identity


def test_projects_and_roles(api):
    api.post("/nodes", {"name": "c1"})
    mine = api.post("/networks", {"name": "mine"}, headers=MEMBER)
    assert mine["project_id"] == "p1"
    theirs = api.post("/networks", {"name": "theirs"}, headers=OTHER)
    assert [n["name"] for n in api.get("/networks", headers=MEMBER)] == ["mine"]
    assert {n["name"] for n in api.get("/networks")} == {"mine", "theirs"}   # admin sees all
    api.get(f"/networks/{theirs['id']}", status=404, headers=MEMBER)
    assert api.error("POST", "/subnets", {"network_id": theirs["id"], "cidr": "10.0.0.0/24"}, 404,
                     headers=MEMBER)[0] == ["network_id"]
    assert api.error("POST", "/networks", {"segmentation_id": 7}, 403, headers=MEMBER)[0] == ["segmentation_id"]
    assert api.error("POST", "/networks", {"project_id": "p2"}, 403, headers=MEMBER)[0] == ["project_id"]
    api.error("POST", "/nodes", {"name": "c9"}, 403, headers=MEMBER)
    api.get("/nodes", status=403, headers=MEMBER)
    # An admin creating in a project's network: the port belongs to that project by default.
    sub = api.post("/subnets", {"network_id": mine["id"], "cidr": "10.0.0.0/24"})
    assert sub["project_id"] == "p1"
    port = api.post("/ports", {"network_id": mine["id"]})
    assert port["project_id"] == "p1"
    assert [p["id"] for p in api.get("/ports", headers=MEMBER)] == [port["id"]]
    assert api.get("/ports", headers=OTHER) == []


# ---------------------------------------------------------------------------------------------- status and snapshot


def test_status_endpoints_and_write_back(api):
    node = api.post("/nodes", {"name": "c1"})
    net, sub = api.network()
    port = api.post("/ports", {"network_id": net["id"]})
    assert api.get(f"/ports/{port['id']}/status") == {
        "kind": "port", "id": port["id"], "status": "pending", "status_reason": None, "state": None}
    engine = api.app.state.engine
    changes = api.changes
    with Session(engine) as s, s.begin():
        assert set_status(s, "port", port["id"], "error", "flow-mod failed: table full")
        assert set_status(s, "network", net["id"], "active")
        assert not set_status(s, "subnet", 999, "active")
        assert set_node_state(s, node["id"], "complete")
    assert api.get(f"/ports/{port['id']}/status")["status_reason"] == "flow-mod failed: table full"
    assert api.get(f"/networks/{net['id']}")["status"] == "active"
    assert api.get(f"/nodes/{node['id']}/status")["state"] == "complete"
    assert api.get(f"/nodes/{node['id']}")["status"] == "active"
    assert api.changes == changes   # status writes do not wake the reconciler
    with pytest.raises(ValueError):
        with Session(engine) as s, s.begin():
            set_status(s, "port", port["id"], "fine")


def test_snapshot_of_api_writes_compiles(api):
    api.post("/nodes", {"name": "c1", "tunnel_ip": "198.18.0.1"})
    api.post("/nodes", {"name": "c2", "tunnel_ip": "198.18.0.2"})
    blue, b4 = api.network("blue", "10.0.0.0/24")
    green, g4 = api.network("green", "10.1.0.0/24", type="vlan")
    p1 = api.post("/ports", {"network_id": blue["id"], "node": "c1", "interface_name": "tap1"})
    p2 = api.post("/ports", {"network_id": green["id"], "node": "c2", "interface_name": "tap2"})
    r = api.post("/routers", {"name": "r"})
    for s in (b4, g4):
        api.post(f"/routers/{r['id']}/interfaces", {"subnet_id": s["id"]})
    with Session(api.app.state.engine) as s:
        snap = load_snapshot(s)
    assert [p.id for p in snap.ports] == [p1["id"], p2["id"]]     # router interfaces are not ports
    assert {ri.ip_address for ri in snap.router_interfaces} == {"10.0.0.1", "10.1.0.1"}
    assert snap.ports[0].node == "c1" and snap.ports[0].fixed_ips[0].ip_address == "10.0.0.2"
    states = compile_tenant(snap.with_ofports({"c1": {"vxlan0": 1, "patch-phy": 2, "tap1": 3},
                                               "c2": {"vxlan0": 1, "patch-phy": 2, "tap2": 3}}))
    assert any(f.match_dict.get("ipv4_dst") == ("10.1.0.0", "255.255.255.0") for f in states["c1"].flows)


def test_migrations_match_the_models(api):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from fathom.store.tables import metadata
    with api.app.state.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []


def test_allocation_takes_the_lowest_free_address_again_after_a_delete(api):
    """Allocation searches from a per-subnet hint: a freed address below it is found again, an
    address in a request's own list is not given twice, and a full subnet is a 409 naming the field."""
    net, _ = api.network(cidr="10.0.0.0/28")   # hosts .1 (gateway) .. .14
    ips = lambda p: [a["ip_address"] for a in p["fixed_ips"]]  # noqa: E731
    ports = [api.post("/ports", {"network_id": net["id"]}) for _ in range(3)]
    assert [ips(p) for p in ports] == [["10.0.0.2"], ["10.0.0.3"], ["10.0.0.4"]]
    api.delete(f"/ports/{ports[1]['id']}")
    assert ips(api.post("/ports", {"network_id": net["id"]})) == ["10.0.0.3"]
    two = api.post("/ports", {"network_id": net["id"], "fixed_ips": [{"ip_address": "10.0.0.6"}, {"subnet_id": ports[0]["fixed_ips"][0]["subnet_id"]}, {"subnet_id": ports[0]["fixed_ips"][0]["subnet_id"]}]})
    assert ips(two) == ["10.0.0.6", "10.0.0.5", "10.0.0.7"]
    loc, _ = api.error("POST", "/ports", {"network_id": net["id"], "fixed_ips": [{"ip_address": "10.0.0.8"}, {"ip_address": "10.0.0.8"}]}, 409)
    assert loc == ["fixed_ips", 1, "ip_address"]
    for _ in range(7):   # .8 .. .14
        api.post("/ports", {"network_id": net["id"]})
    loc, msg = api.error("POST", "/ports", {"network_id": net["id"]}, 409)
    assert loc == ["fixed_ips", 0] and "no free address" in msg


def test_a_port_creation_records_its_response_with_its_request_id_as_sent(api):
    """A port's creation with an Idempotency-Key records the response it sends, byte for byte, with
    the key (on PostgreSQL the statement writing the port's rows writes it, its id and claimed
    address filled in there), whether its address was found in the hint's window or by the whole
    search after it; a repeat gets those bytes. A name holding what the address looks like in the
    response changes nothing."""
    net, _ = api.network(cidr="10.0.0.0/29")   # hosts .1 (gateway) .. .6
    sent = {}

    def create(key, name):
        r = api.http.post("/v1/ports", json={"network_id": net["id"], "name": name}, headers={"Idempotency-Key": key})
        assert r.status_code == 201 and "Idempotent-Replayed" not in r.headers, r.text
        sent[key] = r
        return r.json()

    tricky = 'x","ip_address":"0.0.0.0"}],0'
    ports = [create(f"k{i}", tricky if i == 1 else f"p{i}") for i in range(5)]
    assert [p["fixed_ips"][0]["ip_address"] for p in ports] == [f"10.0.0.{i}" for i in range(2, 7)]
    assert ports[1]["name"] == tricky
    api.delete(f"/ports/{ports[1]['id']}")
    again = create("k5", "after")   # the window past the hint (.6) is full: the whole search finds .3
    assert again["fixed_ips"][0]["ip_address"] == "10.0.0.3"
    for key, first in sent.items():
        shown = json.loads(first.content)
        assert first.content == PortOut.model_validate(shown).model_dump_json().encode(), key   # as rendered
        if key != "k1":
            assert api.get(f"/ports/{shown['id']}") == shown, key
        r = api.http.post("/v1/ports", json={"network_id": net["id"], "name": json.loads(first.content)["name"]},
                          headers={"Idempotency-Key": key})
        assert r.status_code == 201 and r.headers["Idempotent-Replayed"] == "true", key
        assert r.content == first.content and r.headers["content-type"] == "application/json", key
        assert json.loads(r.content)["id"] == json.loads(first.content)["id"]


def test_a_port_creation_on_postgresql_commits_its_one_write_without_a_transaction(postgres, monkeypatch):
    """On PostgreSQL a port given no addresses or groups is written with no BEGIN or COMMIT: its
    checks' read and the statement writing its rows and its key run each on their own (the driver's
    connection idle after each). A creation that takes more statements (its project's default group
    to make first, an address found by the whole search) runs in one transaction, and a creation
    refused in either way writes nothing."""
    api = Client(postgres.new_database(migrated=True))
    net, _ = api.network(cidr="10.0.0.0/29")   # hosts .1 (gateway) .. .6
    states = _statements_watched(monkeypatch)

    def create(key, **extra):
        return api.http.post("/v1/ports", json={"network_id": net["id"], **extra}, headers={"Idempotency-Key": key})
    assert create("k0").status_code == 201    # the project's default group is made: in a transaction
    assert states[-2:] == [("SELECT", "INTRANS"), ("WITH", "INTRANS")], states
    states.clear()
    first = create("k1")
    assert first.status_code == 201 and states == [("SELECT", "IDLE"), ("WITH", "IDLE")], states
    assert create("k1").content == first.content                      # its key was taken with it
    states.clear()
    loc, _ = api.error("POST", "/ports", {"network_id": net["id"], "node": "nowhere", "interface_name": "tap1"}, 404)
    assert loc == ["node"] and states == [("SELECT", "IDLE")], states    # the checks refuse it: nothing written
    assert len(api.get("/ports")) == 2
    api.delete(f"/ports/{first.json()['id']}")
    for i in range(4):                                                # .4 .. .6, then .3 by the whole search
        create(f"k{2 + i}")
    assert sorted(p["fixed_ips"][0]["ip_address"] for p in api.get("/ports")) == [f"10.0.0.{i}" for i in range(2, 7)]
    assert create("k9").status_code == 409 and len(api.get("/ports")) == 5
    api.app.state.engine.dispose()


def test_a_port_creation_at_once_with_the_change_feed_writes_its_notice_in_its_rows_statement(postgres, monkeypatch):
    """With the change feed on (API workers, a cluster), a port given no addresses or groups is still
    written with no BEGIN or COMMIT: the statement writing its rows and its key notifies the feed too,
    naming the port's row (and where the port is) and its transaction, which its answer names (X-Fathom-Commit) and another
    process's listener counts. A creation the checks refuse notifies nothing."""
    import threading
    from fathom.cluster import feed
    from fathom.lab.ovs import wait_for
    url = postgres.new_database(migrated=True)
    api = Client(url)
    net, _ = api.network(cidr="10.0.0.0/24")
    api.post("/ports", {"network_id": net["id"]})    # the project's default group made: in a transaction
    feed.notify_commits(api.app.state.engine, "api-worker-1")
    heard, arrived = [], threading.Event()
    listener = feed.Listener(url.replace("postgresql+psycopg", "postgresql"), "controller",
                             lambda written: (heard.append(written), arrived.set())).start()
    states = _statements_watched(monkeypatch)
    try:
        wait_for(lambda: len(heard) == 1, 10, "the listener to connect (and read once)")
        first = api.http.post("/v1/ports", json={"network_id": net["id"]}, headers={"Idempotency-Key": "k1"})
        assert first.status_code == 201 and states == [("SELECT", "IDLE"), ("WITH", "IDLE")], states
        wait_for(lambda: len(heard) == 2, 5, "the creation's notice")
        # the port's rows, and where it is (unbound: no node before or after) and its network
        assert heard[1] == {("port", first.json()["id"]), ("port_at", (first.json()["id"], None, None, net["id"]))}
        xid = int(first.headers["X-Fathom-Commit"])
        assert listener.claim().covers(xid)
        replay = api.http.post("/v1/ports", json={"network_id": net["id"]}, headers={"Idempotency-Key": "k1"})
        assert replay.content == first.content
        states.clear()
        loc, _ = api.error("POST", "/ports", {"network_id": net["id"], "node": "nowhere", "interface_name": "tap1"}, 404)
        assert loc == ["node"] and states == [("SELECT", "IDLE")], states
        second = api.http.post("/v1/ports", json={"network_id": net["id"]})    # no key: the rows' statement alone
        assert second.status_code == 201 and int(second.headers["X-Fathom-Commit"]) > xid
        wait_for(lambda: len(heard) == 3, 5, "the second creation's notice")
        assert heard[2] == {("port", second.json()["id"]),    # the refused one told nothing before it
                            ("port_at", (second.json()["id"], None, None, net["id"]))}
    finally:
        listener.stop()
        api.app.state.engine.dispose()


def test_concurrent_writers_and_readers(api):
    """Parallel port creation (same subnet: racing for the same free address), status writes and
    snapshot loads: no request fails, every port gets its own address."""
    import threading

    net, _ = api.network(cidr="10.0.0.0/16")
    engine = api.app.state.engine
    failures: list[str] = []

    def create_ports():
        client = TestClient(api.app, headers=api.admin)
        for _ in range(8):
            r = client.post("/v1/ports", json={"network_id": net["id"]})
            if r.status_code != 201:
                failures.append(r.text)

    def write_status():
        for i in range(20):
            with Session(engine) as s, s.begin():
                set_status(s, "network", net["id"], "active" if i % 2 else "pending")

    def load():
        for _ in range(20):
            with Session(engine) as s:
                load_snapshot(s)

    threads = [threading.Thread(target=f) for f in (create_ports,) * 4 + (write_status, load)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    ips = [p["fixed_ips"][0]["ip_address"] for p in api.get("/ports")]
    assert len(ips) == 32 and len(set(ips)) == 32
    # with no lock between them, the writers still took the lowest free addresses (the gateway's is .1)
    assert sorted(ips, key=lambda a: int(a.split(".")[-1])) == [f"10.0.0.{i}" for i in range(2, 34)]


def test_an_address_committed_while_another_allocation_reads_is_not_taken_twice(postgres):
    """Two creations in one network: B has begun and run its checks while A's port (.2) is not
    committed yet, then A commits just before B's address is chosen. B must not pick .2 (A no longer
    holds it, and B's earlier reads did not see A's row): it takes .3, with no unique-constraint
    failure. PostgreSQL only: SQLite serialises writers, B could not begin while A's transaction is
    open."""
    from sqlalchemy import event
    from fathom.store import ops
    api = Client(postgres.new_database(migrated=True))
    net, _ = api.network()
    engine = api.app.state.engine
    admin = ops.Caller()
    a, b = Session(engine), Session(engine)
    a.begin()
    assert str(ops.create_port(a, admin, network_id=net["id"]).fixed_ips[0].ip_address) == "10.0.0.2"

    def commit_a_before_bs_choice(_conn, _cursor, statement, *_):
        if "pg_try_advisory_xact_lock" in statement and a.in_transaction() and b.in_transaction():
            a.commit()

    event.listen(engine, "before_cursor_execute", commit_a_before_bs_choice)
    try:
        with b.begin():
            port = ops.create_port(b, admin, network_id=net["id"])
            assert port.fixed_ips[0].ip_address == "10.0.0.3"
    finally:
        event.remove(engine, "before_cursor_execute", commit_a_before_bs_choice)
        a.close()
        b.close()
    assert sorted(p["fixed_ips"][0]["ip_address"] for p in api.get("/ports")) == ["10.0.0.2", "10.0.0.3"]
    engine.dispose()


def test_a_pooled_connection_the_server_dropped_is_replaced_before_use(postgres, monkeypatch):
    """The pool checks a connection idle for longer than PING_IDLE_SECONDS before lending it: one
    whose server process is gone (a restart, an idle timeout) is replaced, the request never sees it."""
    import time
    from sqlalchemy import text
    from fathom.store import db
    monkeypatch.setattr(db, "PING_IDLE_SECONDS", 0.2)
    engine = db.open_store(postgres.new_database(migrated=True))
    try:
        with engine.connect() as c:
            first = c.execute(text("SELECT pg_backend_pid()")).scalar()
        with engine.connect() as c:   # used just now: lent as it is
            assert c.execute(text("SELECT pg_backend_pid()")).scalar() == first
        dead = engine.connect()
        with engine.connect() as killer:   # a second connection ends the pooled one's server process
            pid = dead.execute(text("SELECT pg_backend_pid()")).scalar()
            dead.close()
            killer.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        time.sleep(0.3)
        with engine.connect() as a, engine.connect() as b:   # both pooled connections lent: both work
            assert {a.execute(text("SELECT pg_backend_pid()")).scalar(),
                    b.execute(text("SELECT pg_backend_pid()")).scalar()}.isdisjoint({pid})
    finally:
        engine.dispose()


def test_the_connections_of_a_busy_api_are_kept_not_opened_per_request(postgres):
    """Eight writers, the reconciler and the change feed at once fit in the connections the pool
    keeps: given back, they stay open (a connection opened per request costs PostgreSQL a backend's
    start each time, more CPU than the request's SQL)."""
    from sqlalchemy import text
    from fathom.store import db
    engine = db.open_store(postgres.new_database(migrated=True))
    try:
        lent = [engine.connect() for _ in range(10)]
        pids = {c.execute(text("SELECT pg_backend_pid()")).scalar() for c in lent}
        for c in lent:
            c.close()
        lent = [engine.connect() for _ in range(10)]
        assert {c.execute(text("SELECT pg_backend_pid()")).scalar() for c in lent} == pids
        for c in lent:
            c.close()
        # one request at a time: the connection given back last is lent again, the others stay idle
        # (not each lent in turn, each then idle long enough to be checked before use)
        seen = set()
        for _ in range(5):
            with engine.connect() as c:
                seen.add(c.execute(text("SELECT pg_backend_pid()")).scalar())
        assert len(seen) == 1
    finally:
        engine.dispose()


def test_concurrent_network_creation_allocates_distinct_segments(api):
    import threading

    failures: list[str] = []

    def create():
        client = TestClient(api.app, headers=api.admin)
        for _ in range(5):
            r = client.post("/v1/networks", json={"type": "vlan"})
            if r.status_code != 201:
                failures.append(r.text)

    threads = [threading.Thread(target=create) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert sorted(n["segmentation_id"] for n in api.get("/networks")) == list(range(100, 120))


def test_updates_rebind_ports_and_change_nodes(api):
    api.post("/nodes", {"name": "c1"})
    api.post("/nodes", {"name": "c2", "tunnel_ip": "198.18.0.2"})
    net, _ = api.network()
    port = api.post("/ports", {"network_id": net["id"]})
    assert port["node"] is None
    moved = api.patch(f"/ports/{port['id']}", {"node": "c2", "interface_name": "tap7"})
    assert (moved["node"], moved["interface_name"], moved["status"]) == ("c2", "tap7", "pending")
    assert api.error("PATCH", f"/ports/{port['id']}", {"node": "c9"}, 404)[0] == ["node"]
    assert api.error("PATCH", f"/ports/{port['id']}", {"mac_address": "02:00:00:00:00:01"}, 422)[0] == \
        ["mac_address"]                                  # addresses are fixed once created
    assert api.patch("/nodes/1", {"role": "gateway", "tunnel_ip": "198.18.0.1"})["role"] == "gateway"
    assert api.error("PATCH", "/nodes/1", {"tunnel_ip": "198.18.0.2"}, 409)[0] == ["tunnel_ip"]
    assert api.error("PATCH", "/nodes/1", {"role": None}, 422)[0] == ["role"]
    unbound = api.patch(f"/ports/{port['id']}", {"node": None})
    assert unbound["node"] is None


# ---------------------------------------------------------------------------------------------- external ids


SERVICE_P1 = {"X-Project": "p1"}


def test_external_ids_are_set_by_the_service_identity_and_found_again(api):
    """The Neutron driver keys fathom's objects by Neutron's UUIDs: it sets them (acting for the
    object's project), finds objects by them, and they are unique; a member may not set one."""
    service = {**api.who(("services", "service")), **SERVICE_P1}
    api.post("/nodes", {"name": "c1"})
    net = api.post("/networks", {"name": "n", "type": "vxlan", "segmentation_id": 1234,
                                 "external_id": "net-uuid"}, headers=service)
    assert (net["project_id"], net["segmentation_id"], net["external_id"]) == ("p1", 1234, "net-uuid")
    sub = api.post("/subnets", {"network_id": net["id"], "cidr": "10.0.0.0/24", "external_id": "sub-uuid"},
                   headers=service)
    port = api.post("/ports", {"network_id": net["id"], "mac_address": "fa:16:3e:00:00:01",
                               "fixed_ips": [{"subnet_id": sub["id"], "ip_address": "10.0.0.5"}],
                               "node": "c1", "interface_name": "tap0123456789a", "external_id": "port-uuid"},
                    headers=service)
    router = api.post("/routers", {"name": "r", "external_id": "router-uuid"}, headers=service)
    iface = api.post(f"/routers/{router['id']}/interfaces",
                     {"subnet_id": sub["id"], "external_id": "iface-uuid", "mac_address": "fa:16:3e:00:00:99"},
                     headers=service)
    assert (iface["external_id"], iface["mac_address"], iface["ip_address"]) == ("iface-uuid", "fa:16:3e:00:00:99",
                                                                                  "10.0.0.1")
    for collection, uuid, obj in (("networks", "net-uuid", net), ("subnets", "sub-uuid", sub),
                                  ("ports", "port-uuid", port), ("routers", "router-uuid", router)):
        assert [o["id"] for o in api.get(f"/{collection}", headers=service, external_id=uuid)] == [obj["id"]]
        assert api.get(f"/{collection}", headers=MEMBER, external_id=uuid)[0]["external_id"] == uuid
        assert api.get(f"/{collection}", headers=OTHER, external_id=uuid) == []     # another project's: absent
    assert api.get("/ports", headers=service, external_id="iface-uuid")[0]["router_id"] == router["id"]
    # unique per table; a member may neither set one nor choose a segment
    assert api.error("POST", "/networks", {"external_id": "net-uuid"}, 409, headers=service)[0] == ["external_id"]
    assert api.error("POST", "/networks", {"external_id": "mine"}, 403, headers=MEMBER)[0] == ["external_id"]
    assert api.error("POST", "/networks", {"segmentation_id": 99}, 403, headers=MEMBER)[0] == ["segmentation_id"]
    assert api.error("POST", "/routers", {"external_id": "bad id!"}, 422, headers=service)[0] == ["external_id"]
    # the same UUID may name objects of different kinds (each table is its own space)
    assert api.post("/routers", {"external_id": "net-uuid"}, headers=service)["external_id"] == "net-uuid"


def test_external_ids_of_security_groups_floating_ips_and_chains(api):
    """The same for the objects of security groups, external connectivity and service chains: the
    service identity sets the ids, adopts the project's default group (which fathom made) by giving
    it Neutron's id, creates the external network and gives the floating IP the address Neutron
    allocated; lists find each by its id; a member may do none of it."""
    service = {**api.who(("services", "service")), **SERVICE_P1}
    group = api.post("/security-groups", {"name": "web", "external_id": "sg-uuid"}, headers=service)
    rule = api.post("/security-group-rules", {"security_group_id": group["id"], "direction": "ingress",
                                              "protocol": "tcp", "port_range_min": 22, "port_range_max": 22,
                                              "external_id": "rule-uuid"}, headers=service)
    default = api.get("/security-groups", headers=service, name="default")[0]
    assert default["external_id"] is None
    adopted = api.patch(f"/security-groups/{default['id']}", {"external_id": "default-uuid"}, headers=service)
    assert (adopted["name"], adopted["external_id"]) == ("default", "default-uuid")
    assert api.error("PATCH", f"/security-groups/{group['id']}", {"external_id": "x"}, 403,
                     headers=MEMBER)[0] == ["external_id"]
    assert api.error("POST", "/security-groups", {"name": "w2", "external_id": "sg-uuid"}, 409,
                     headers=service)[0] == ["external_id"]
    ext = api.post("/networks", {"name": "ext", "type": "vlan", "segmentation_id": 300, "external": True,
                                 "upstream_mac": "02:fe:00:00:00:01", "external_id": "ext-uuid"}, headers=service)
    api.post("/subnets", {"network_id": ext["id"], "cidr": "203.0.113.0/24"}, headers=service)
    fip = api.post("/floatingips", {"floating_network_id": ext["id"], "floating_ip_address": "203.0.113.9",
                                    "external_id": "fip-uuid"}, headers=service)
    assert (fip["floating_ip_address"], fip["external_id"]) == ("203.0.113.9", "fip-uuid")
    assert api.error("POST", "/floatingips", {"floating_network_id": ext["id"], "floating_ip_address": "203.0.113.8"},
                     403, headers=MEMBER)[0] == ["floating_ip_address"]
    net = api.post("/networks", {"name": "n"}, headers=service)
    sub = api.post("/subnets", {"network_id": net["id"], "cidr": "10.0.0.0/24"}, headers=service)
    vnf = [api.post("/ports", {"network_id": net["id"], "port_security": False, "security_groups": []},
                    headers=service) for _ in range(2)]
    src = api.post("/ports", {"network_id": net["id"]}, headers=service)
    pair = api.post("/sfc/port_pairs", {"ingress": vnf[0]["id"], "egress": vnf[1]["id"], "external_id": "pp-uuid"},
                    headers=service)
    ppg = api.post("/sfc/port_pair_groups", {"port_pairs": [pair["id"]], "external_id": "ppg-uuid"}, headers=service)
    fc = api.post("/sfc/flow_classifiers", {"logical_source_port": src["id"], "protocol": "icmp",
                                            "external_id": "fc-uuid"}, headers=service)
    chain = api.post("/sfc/port_chains", {"port_pair_groups": [ppg["id"]], "flow_classifiers": [fc["id"]],
                                          "external_id": "pc-uuid"}, headers=service)
    for collection, uuid, obj in (("security-groups", "sg-uuid", group), ("security-groups", "default-uuid", default),
                                  ("security-group-rules", "rule-uuid", rule), ("floatingips", "fip-uuid", fip),
                                  ("sfc/port_pairs", "pp-uuid", pair), ("sfc/port_pair_groups", "ppg-uuid", ppg),
                                  ("sfc/flow_classifiers", "fc-uuid", fc), ("sfc/port_chains", "pc-uuid", chain)):
        assert [o["id"] for o in api.get(f"/{collection}", headers=service, external_id=uuid)] == [obj["id"]]
        assert api.get(f"/{collection}", headers=OTHER, external_id=uuid) == []
    assert sub["id"] and api.error("POST", "/sfc/port_chains", {"port_pair_groups": [], "external_id": "y"}, 403,
                                   headers=MEMBER)[0] == ["external_id"]


def test_a_store_that_cannot_take_a_write_answers_503_and_applies_nothing(tmp_path, monkeypatch):
    """SQLite's write lock held by another process's writer beyond the wait: the request is
    refused with 503 and Retry-After (not a 500), nothing of it is in the store, and the same
    request once the lock is free succeeds."""
    import sqlite3
    import threading
    import time

    from fathom.client import Client as FathomClient
    from fathom.store import db
    monkeypatch.setattr(db, "SQLITE_BUSY_MS", 200)
    path = tmp_path / "fathom.db"
    api = Client(f"sqlite:///{path}")
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    try:
        r = api.http.post("/v1/networks", json={"name": "locked", "type": "vxlan"})
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == "1"
        assert r.json()["detail"][0]["type"] == "busy"
        assert [n["name"] for n in api.get("/networks")] == []
        # fathom's client makes a refused request again after Retry-After: the lock is free by then
        client = FathomClient("http://testserver", token="set below")
        client.http = client._clients[0] = TestClient(api.app, base_url="http://testserver/v1", headers=api.admin)
        threading.Timer(0.5, holder.execute, ("ROLLBACK",)).start()
        t = time.monotonic()
        assert client.post("/networks", json={"name": "locked", "type": "vxlan"})["name"] == "locked"
        assert time.monotonic() - t >= 1.0
    finally:
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()
    assert [n["name"] for n in api.get("/networks")] == ["locked"]
    api.app.state.engine.dispose()


def _statements(api, path: str) -> tuple[int, list]:
    """The SQL statements one GET of `path` runs (SQLite's BEGIN, which the store issues itself, left
    out), and its answer. Asked once before: the caller's token is then verified lately (its read,
    once Authenticator.CACHE_SECONDS have passed, is not the list's)."""
    api.get(path)
    run: list[str] = []

    def count(_conn, _cursor, statement, *_):
        if statement != "BEGIN":
            run.append(statement)
    engine = api.app.state.engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        answer = api.get(path)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    return len(run), answer


def lists_in_fixed_statements(api, paths, grow) -> dict[str, list]:
    """`grow(i)` adds an object to each list of `paths` (i = 0, 1, ...). After the first and after
    five more, each list runs as many statements (its objects' relationships are read for all of
    them at once, not per object) and holds five more objects. Each path's longer answer."""
    grow(0)
    small = {path: _statements(api, path) for path in paths}
    for i in range(1, 6):
        grow(i)
    bigger = {}
    for path, (statements, answer) in small.items():
        more, bigger[path] = _statements(api, path)
        assert len(bigger[path]) == len(answer) + 5, path
        assert more == statements, (path, statements, more)
    return bigger


def test_a_list_reads_in_as_many_statements_however_many_objects_it_holds(api):
    """Listing ports, networks or security groups reads what each object's answer holds
    (addresses, node, groups; subnets; rules) in one statement per relationship, not one per object."""
    net = api.post("/networks", {"name": "n"})
    api.post("/subnets", {"network_id": net["id"], "cidr": "198.18.40.0/24"})
    group = api.post("/security-groups", {"name": "g"})
    api.post("/security-group-rules", {"security_group_id": group["id"], "direction": "ingress"})

    def grow(_i):
        n = api.post("/networks", {"name": "more"})
        api.post("/subnets", {"network_id": n["id"], "cidr": "198.18.41.0/24"})
        api.post("/ports", {"network_id": net["id"], "security_groups": [group["id"]]})
        g = api.post("/security-groups", {"name": "more"})
        api.post("/security-group-rules", {"security_group_id": g["id"], "direction": "egress"})

    lists_in_fixed_statements(api, ("/ports", "/networks", "/security-groups"), grow)
    # one port (a show, a long-poll's answer) in one statement
    one = api.get("/ports")[0]
    assert _statements(api, f"/ports/{one['id']}") == (1, one)
    # and the answers still hold what each object's relationships say
    ports = api.get("/ports")
    assert all(p["fixed_ips"] and p["security_groups"] == [group["id"]] for p in ports)
    assert all(len(n["subnets"]) == 1 for n in api.get("/networks"))
    assert all(len(g["rules"]) >= 1 for g in api.get("/security-groups"))


def test_a_list_of_routers_reads_in_as_many_statements_however_many_routers_it_holds(api):
    """Listing routers reads their modes, gateway nodes and interfaces (with their addresses) in a
    fixed number of statements, not in some per router."""
    api.post("/nodes", {"name": "gw", "role": "gateway"})

    def grow(i: int):
        _, sub = api.network(f"n{i}", f"198.18.{50 + i}.0/24")
        r = api.post("/routers", {"name": f"r{i}", "mode": "network-node"})
        api.post(f"/routers/{r['id']}/interfaces", {"subnet_id": sub["id"]})

    bigger = lists_in_fixed_statements(api, ("/routers",), grow)["/routers"]
    # and the answers still hold what each router's relationships say, as each router's own answer does
    assert all((r["mode"], r["gateway_node"], len(r["interfaces"])) == ("network-node", "gw", 1) for r in bigger)
    assert bigger == [api.get(f"/routers/{r['id']}") for r in bigger]


def test_a_write_that_loses_the_race_for_an_address_runs_again_until_it_wins(api):
    """Under many writers on one network a creation can lose the race for a free address several
    times in a row (the address was free in what its statement saw; another writer's commit came
    first): each such run is run again, more times than any other conflict, and the client never
    gets a 409 for an address it did not name. Real unique violations, on SQLite and PostgreSQL."""
    from sqlalchemy import insert

    from fathom.api.deps import ADDRESS_RACE_ATTEMPTS
    from fathom.store import models as m
    from fathom.store.errors import Conflict
    net, sub = api.network()
    taken = api.post("/ports", {"network_id": net["id"]})["fixed_ips"][0]["ip_address"]
    store = api.app.state.store

    def losing(times):
        runs = []

        def write(session):
            runs.append(1)
            if len(runs) <= times:   # as a writer whose address another writer committed first
                session.execute(insert(m.IpAllocation).values(port_id=1, subnet_id=sub["id"], network_id=net["id"],
                                                              ip_address=taken))
            return len(runs)
        return write, runs

    write, runs = losing(5)
    assert store.write(write) == 6          # more than the 3 runs of any other conflict
    write, runs = losing(ADDRESS_RACE_ATTEMPTS)
    with pytest.raises(Conflict, match="fixed_ips is in use"):
        store.write(write)                  # bounded all the same
    assert len(runs) == ADDRESS_RACE_ATTEMPTS


def _statements_watched(monkeypatch) -> list:
    """The statements run on the driver's cursor (ops.run_prepared) from now on, each as its first
    word and the connection's state after it (idle, or in a transaction)."""
    from fathom.store import ops
    states = []
    real = ops.run_prepared

    def watched(conn, statement, *args, **kwargs):
        try:
            return real(conn, statement, *args, **kwargs)
        finally:
            states.append((statement.split()[0], conn.connection.driver_connection.info.transaction_status.name))
    monkeypatch.setattr(ops, "run_prepared", watched)
    return states
