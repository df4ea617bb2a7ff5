"""The console's change notices (fathom.controller.console_feed) from real passes of a reconciler
over fake switches, and its routes (fathom.api.console): pages without a token, with a strict CSP; only the
listed front-end files; /v1/whoami and /v1/events with one."""
from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient

from fathom.api.console import BENCHMARKS, LoginAttempts, read_objects
from fathom.api.runtime import port_runtime_router
from fathom.auth.keystone import KeystoneValidator
from fathom.controller.port_counters import port_counters
from fathom.controller.console_feed import MAX_BEHIND
from fathom.controller.server import install_console

from .auth import headers_for
from .test_reconciler import LAB, Cloud


@pytest.fixture(scope="module")
def tenants(tmp_path_factory):
    c = Cloud(tmp_path_factory.mktemp("console"), LAB / "tenants.yaml")    # projects alpha (blue, green) and beta (red)
    feed = install_console(c.api, c.rec)
    c.rec.run_pass()
    yield c, feed
    c.close()


def events(data: bytes) -> list[tuple[str, dict]]:
    """The server-sent events in a stream's bytes: (name, data)."""
    out = []
    for block in data.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_a_change_is_told_to_its_project_and_admins_only_with_the_object(tenants):
    cloud, feed = tenants
    nets = {n["name"]: n for n in cloud.get("/networks")}

    async def run():
        alpha, beta, admin = feed.listen("alpha", False), feed.listen("beta", False), feed.listen("admin", True)
        alpha2 = feed.listen("alpha", False)

        def told():
            got = {name: l.take() for name, l in (("alpha", alpha), ("alpha2", alpha2), ("beta", beta), ("admin", admin))}
            assert not any(behind for behind, _ in got.values())
            # the same bytes for every listener of a project, encoded once
            assert got["alpha"][1] is got["alpha2"][1] or got["alpha"][1] == got["alpha2"][1] == b""
            return {name: [c for _, e in events(data) for c in e["changes"]] for name, (_, data) in got.items()}

        async def pass_after(method, path, **body):
            made = cloud.call(method, path, **body)
            await asyncio.to_thread(cloud.rec.run_pass)
            await asyncio.to_thread(feed.drain)
            await asyncio.sleep(0.05)       # the notices are handed to this loop from the feed's thread
            return made, told()

        # a port of alpha on compute1: alpha and the admin hear of it with the port as the API shows it, beta does not
        port, got = await pass_after("POST", "/ports", json={"network_id": nets["blue"]["id"], "name": "new",
                                                             "node": "compute1", "interface_name": "new0"})
        mine = [c for c in got["alpha"] if c["kind"] == "port"]
        assert mine == [{"kind": "port", "id": port["id"], "object": {**port, "status": mine[0]["object"]["status"],
                                                                      "status_reason": mine[0]["object"]["status_reason"]},
                         "was": None, "now": {"node": "compute1", "status": mine[0]["object"]["status"]}}]
        assert mine[0] in got["admin"] and got["beta"] == []
        # beta's network renamed (a change of the model alone, no status changes)
        net, got = await pass_after("PATCH", f"/networks/{nets['red']['id']}", json={"name": "<b>x</b>"})
        assert got["alpha"] == [] and got["beta"] == [{"kind": "network", "id": net["id"], "object": net}]
        assert got["admin"] == got["beta"]
        # the port deleted: its deletion, and where it was counted
        _, got = await pass_after("DELETE", f"/ports/{port['id']}")
        assert [c for c in got["alpha"] if c["kind"] == "port"] == [
            {"kind": "port", "id": port["id"], "deleted": True, "was": mine[0]["now"], "now": None}]
        # a pass with nothing new tells nobody
        await asyncio.to_thread(cloud.rec.run_pass)
        await asyncio.to_thread(feed.drain)
        await asyncio.sleep(0.05)
        assert told() == {"alpha": [], "alpha2": [], "beta": [], "admin": []}
        for listener in (alpha, alpha2, beta, admin):
            feed.leave(listener)
        assert feed.listening() == 0
    asyncio.run(run())


def test_a_console_that_falls_behind_is_told_to_refresh(tenants):
    _, feed = tenants

    async def run():
        slow = feed.listen("alpha", False)
        try:
            slow.add([b"x" * (MAX_BEHIND // 2)])
            assert slow.take() == (False, b"x" * (MAX_BEHIND // 2))
            slow.add([b"x" * (MAX_BEHIND // 2)] * 2)
            slow.add([b"x"])          # beyond: what waits is dropped, and the page reads everything again
            assert slow.take() == (True, b"")
        finally:
            feed.leave(slow)
    asyncio.run(run())


def test_listeners_are_bounded(tenants):
    _, feed = tenants
    feed.max_listeners = 2

    async def run():
        a, b = feed.listen("a", False), feed.listen("b", False)
        assert a and b and feed.listen("c", False) is None
        feed.leave(a)
        feed.leave(b)
    try:
        asyncio.run(run())
    finally:
        feed.max_listeners = 256


def test_pages_need_no_token_and_data_needs_one(tenants):
    cloud, _ = tenants
    anonymous = TestClient(cloud.api)
    r = anonymous.get("/console/topology")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert anonymous.get("/console/port/12").status_code == 200
    assert anonymous.get("/console/trace", params={"port": 3, "to": "198.19.1.13"}).status_code == 200
    assert anonymous.get("/console/flow-records").status_code == 200
    assert anonymous.get("/console/taps").status_code == 200
    assert anonymous.get("/console/benchmarks", params={"file": "trace/results.json"}).status_code == 200
    assert anonymous.get("/console/static/console.js").headers["content-type"].startswith("text/javascript")
    for bad in ("/console/nope", "/console/port/0", "/console/topology/3", "/console/trace/3",
                "/console/static/..%2Fweb.py", "/console/vendor/package.json", "/console/static/login.html"):
        assert anonymous.get(bad).status_code == 404, bad
    assert anonymous.get("/v1/whoami").status_code == 401
    assert anonymous.get("/v1/events").status_code == 401
    member = TestClient(cloud.api, headers=headers_for(cloud.api, "beta", ("member",)))
    assert member.get("/v1/whoami").json() == {"project": "beta", "admin": False, "roles": ["member"]}
    assert cloud.get("/whoami")["admin"] is True


def test_the_front_end_packages_are_served_from_what_setup_installed(tenants):
    cloud, _ = tenants
    anonymous = TestClient(cloud.api)
    for name in ("cytoscape.esm.min.mjs", "uPlot.esm.js", "uPlot.min.css"):
        r = anonymous.get(f"/console/vendor/{name}")
        assert r.status_code == 200 and len(r.content) > 1000, (name, r.status_code)


def test_the_benchmarks_results_are_read_only_files_with_a_token(tenants):
    cloud, _ = tenants
    listed = cloud.get("/benchmarks")
    assert {"path": "trace/results.json", "bytes": (BENCHMARKS / "trace/results.json").stat().st_size} in listed
    assert cloud.get("/benchmarks/trace/results.json")["benchmark"] == "trace"
    admin = TestClient(cloud.api, headers=headers_for(cloud.api))
    for bad in ("../../pyproject.toml", "..%2F..%2Fpyproject.toml", "trace/../../../README.md", "trace", "nope.json",
                "/etc/passwd.json", "trace/results.json/x"):
        assert admin.get(f"/v1/benchmarks/{bad}").status_code == 404, bad
    assert admin.post("/v1/benchmarks/trace/results.json").status_code == 405
    assert TestClient(cloud.api).get("/v1/benchmarks").status_code == 401


def test_the_topology_summary_counts_the_callers_ports_per_node(tenants):
    cloud, _ = tenants
    cloud.rec.run_pass()

    def expected(ports):
        nodes, unbound = {}, {}
        for p in ports:
            if p["router_id"] is None:
                counts = nodes.setdefault(p["node"], {}) if p["node"] else unbound
                counts[p["status"]] = counts.get(p["status"], 0) + 1
        return nodes, unbound
    admin = cloud.get("/topology")
    nodes, unbound = expected(cloud.get("/ports"))
    assert {n["name"]: n["ports"] for n in admin["nodes"] if n["ports"]} == nodes and admin["unbound_ports"] == unbound
    compute1 = next(n for n in admin["nodes"] if n["name"] == "compute1")
    # its health as the reconciler left it: connected, its flows installed as desired
    assert compute1["switch"] == "ok" and compute1["in_sync"] is True and compute1["state"] == "complete"
    assert compute1["flows_desired"] > 0 and compute1["flows_actual"] == compute1["flows_desired"]
    assert compute1["agent"] == "never reported"
    member = TestClient(cloud.api, headers=headers_for(cloud.api, "beta", ("member",)))
    beta = member.get("/v1/topology").json()
    nodes, unbound = expected(p for p in cloud.get("/ports") if p["project_id"] == "beta")
    # beta's ports only, the nodes by name only (no health: the nodes are the admin's)
    def by_status(objects):
        counts = {}
        for o in objects:
            counts[o["status"]] = counts.get(o["status"], 0) + 1
        return counts
    assert beta == {"seq": admin["seq"], "nodes": [{"name": n, "ports": c} for n, c in sorted(nodes.items())],
                    "unbound_ports": unbound, "networks": by_status(member.get("/v1/networks").json()),
                    "routers": by_status(member.get("/v1/routers").json())}
    # networks and routers counted as the API lists them (a page lists them only when few)
    assert admin["networks"] == by_status(cloud.get("/networks")) and admin["routers"] == by_status(cloud.get("/routers"))
    assert sum(admin["networks"].values()) > sum(beta["networks"].values()) > 0
    assert TestClient(cloud.api).get("/v1/topology").status_code == 401


def test_a_notice_carries_objects_as_the_api_answers_them(tenants):
    cloud, _ = tenants
    paths = {"network": "/networks", "subnet": "/subnets", "port": "/ports", "router": "/routers",
             "security_group": "/security-groups"}
    listed = {kind: cloud.get(path) for kind, path in paths.items()}
    read = read_objects(cloud.rec.Session, [(kind, o["id"]) for kind, objects in listed.items() for o in objects]
                        + [("port", 10**6), ("no such kind", 1)])
    assert read == {(kind, o["id"]): o for kind, objects in listed.items() for o in objects}


def test_keystone_login_is_offered_only_with_keystone_and_bounds_its_input(tenants):
    """Without Keystone: only token login. With a Keystone configured (here one that does not answer,
    port 9): offered; credentials out of bounds refused before Keystone is asked, and never echoed;
    Keystone unreachable is a 503 saying so; attempts from one address are limited (429), without a
    call to Keystone. The real Keystone's answers: tests/lab/test_console.py."""
    cloud, _ = tenants
    anonymous = TestClient(cloud.api)
    assert anonymous.get("/v1/login").json() == {"methods": ["token"]}
    creds = {"user": "alice", "password": "s3cret-pw", "project": "p1"}
    assert anonymous.post("/v1/login/keystone", json=creds).status_code == 404
    auth = cloud.api.state.authenticator
    auth.keystone = KeystoneValidator("http://127.0.0.1:9", "service-token", timeout=2)
    try:
        assert anonymous.get("/v1/login").json() == {"methods": ["token", "keystone"]}
        long_password = "p" * 4097
        for bad in ({**creds, "password": long_password}, {**creds, "user": ""}, {**creds, "project": "x" * 65},
                    {**creds, "extra": 1}, {"user": "alice", "password": "pw"}):
            r = anonymous.post("/v1/login/keystone", json=bad)
            assert r.status_code == 422, (bad.keys(), r.text)
            assert long_password not in r.text and "s3cret-pw" not in r.text
        for _ in range(LoginAttempts().per_window):
            r = anonymous.post("/v1/login/keystone", json=creds)
            assert r.status_code == 503 and "Keystone did not answer" in r.text, r.text
        r = anonymous.post("/v1/login/keystone", json=creds)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1 and "s3cret-pw" not in r.text
    finally:
        auth.keystone = None


def test_login_attempts_are_bounded_per_address_and_in_all():
    attempts = LoginAttempts(per_window=2, window=60, addresses=2)
    assert attempts.wait_for("a") == 0 and attempts.wait_for("a") == 0
    assert 59 < attempts.wait_for("a") <= 60
    assert attempts.wait_for("b") == 0
    assert attempts.wait_for("c") == 60          # no room for a third address while a and b are recent


def test_port_counters_are_the_ports_projects_and_say_why_when_there_are_none(tenants):
    """GET /v1/ports/{id}/counters: the port's project (another's: 404, as for the port itself); a
    port on no node has no counters and says so. Counters read from a real br-int:
    tests/lab/test_console.py."""
    cloud, _ = tenants
    cloud.api.include_router(port_runtime_router(cloud.rec.Session, lambda port_id: port_counters(cloud.rec, port_id)))
    blue = next(n for n in cloud.get("/networks") if n["name"] == "blue")
    port = cloud.call("POST", "/ports", json={"network_id": blue["id"], "name": "unbound", "project_id": "alpha"})
    try:
        cloud.rec.run_pass()
        alpha = TestClient(cloud.api, headers=headers_for(cloud.api, "alpha", ("member",)))
        beta = TestClient(cloud.api, headers=headers_for(cloud.api, "beta", ("member",)))
        r = alpha.get(f"/v1/ports/{port['id']}/counters")
        assert r.status_code == 200 and r.json()["counters"] is None and r.json()["read_at"] is None, r.text
        assert "not bound to a node" in r.json()["reason"]
        assert beta.get(f"/v1/ports/{port['id']}/counters").status_code == 404
        assert alpha.get("/v1/ports/999999/counters").status_code == 404
        assert TestClient(cloud.api).get(f"/v1/ports/{port['id']}/counters").status_code == 401
    finally:
        cloud.call("DELETE", f"/ports/{port['id']}")
        cloud.rec.run_pass()
