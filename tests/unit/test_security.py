"""The API's trust boundary over a real store (SQLite and PostgreSQL): who may call it (tokens,
roles, Keystone), what a caller may learn of other projects, and how much input it reads."""
from __future__ import annotations

import json
import os
import stat
import threading
import warnings
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy.orm import Session

from fathom.auth import tokens as tk
from fathom.auth.keystone import KeystoneValidator
from fathom.lab.controller import free_port
from fathom.store.auth_models import ApiToken

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from fathom.api import create_app  # noqa: E402

from .auth import headers_for  # noqa: E402


@pytest.fixture
def app(db_url):
    a = create_app(db_url)
    yield a
    a.state.engine.dispose()


@pytest.fixture
def admin(app):
    return TestClient(app, headers=headers_for(app))


def client(app, project="p1", roles="member", node=None, **extra) -> TestClient:
    return TestClient(app, headers={**headers_for(app, project, roles, node), **extra})


def detail(r):
    return r.json()["detail"][0]


# ---------------------------------------------------------------------------------------------- authentication


def test_every_call_needs_a_valid_token(app, admin):
    anon = TestClient(app)
    for method, path in (("GET", "/v1/networks"), ("POST", "/v1/networks"), ("GET", "/v1/nodes"),
                         ("GET", "/v1/taps"), ("GET", "/v1/pptmon/chains"), ("GET", "/v1/tokens"),
                         ("DELETE", "/v1/ports/1")):
        r = anon.request(method, path, json={} if method == "POST" else None)
        assert r.status_code == 401, (method, path, r.text)
        assert r.headers["www-authenticate"] == "Bearer" and detail(r)["type"] == "unauthenticated"
    # the old identity headers alone grant nothing
    r = anon.get("/v1/networks", headers={"X-Roles": "admin", "X-Project": "admin"})
    assert r.status_code == 401
    for bad in ("Bearer fth_" + "x" * 43, "Bearer nonsense", "Basic YWRtaW46YWRtaW4=", "Bearer " + "a" * 5000):
        assert anon.get("/v1/networks", headers={"Authorization": bad}).status_code == 401, bad
    # a member's X-Roles header does not make it an admin
    member = client(app, **{"X-Roles": "admin", "X-Project": "p2"})
    assert member.get("/v1/nodes").status_code == 403
    assert member.post("/v1/networks", json={}).json()["project_id"] == "p1"


def test_tokens_are_stored_hashed_expire_and_revoke(app, admin):
    made = admin.post("/v1/tokens", json={"project_id": "p1", "roles": ["member"], "name": "ci"}).json()
    secret = made.pop("token")
    assert secret.startswith("fth_") and len(secret) >= 40
    with Session(app.state.engine) as s:
        rows = s.query(ApiToken).all()
    assert all(secret not in (r.digest, r.name) for r in rows)
    assert any(r.digest == tk.digest(secret) for r in rows)
    assert "token" not in admin.get("/v1/tokens").json()[0]
    http = TestClient(app, headers={"Authorization": f"Bearer {secret}"})
    assert http.get("/v1/networks").status_code == 200
    assert admin.delete(f"/v1/tokens/{made['id']}").status_code == 204
    assert http.get("/v1/networks").status_code == 401
    assert admin.delete("/v1/tokens/99999").status_code == 404
    assert admin.delete(f"/v1/tokens/{2**40}").status_code == 404
    # expired
    with Session(app.state.engine) as s, s.begin():
        row, old = tk.issue(s, project="p1", roles=["member"])
        row.expires_at = datetime.now(timezone.utc) - timedelta(seconds=1)
    assert TestClient(app, headers={"Authorization": f"Bearer {old}"}).get("/v1/networks").status_code == 401
    # what a token may be
    past = (datetime.now(timezone.utc) - timedelta(days=1)).isoformat()
    for body, field in (({"project_id": "p", "roles": ["agent"]}, "node"),
                        ({"project_id": "p", "roles": ["agent", "admin"], "node": "c1"}, "node"),
                        ({"project_id": "p", "roles": ["member"], "node": "c1"}, "node"),
                        ({"project_id": "p", "roles": ["root"]}, "roles"),
                        ({"project_id": "p", "roles": []}, "roles"),
                        ({"project_id": "p", "roles": ["member"], "expires_at": past}, "expires_at")):
        r = admin.post("/v1/tokens", json=body)
        assert r.status_code == 422 and field in detail(r)["loc"], (body, r.text)
    assert client(app).post("/v1/tokens", json={"project_id": "p1", "roles": ["admin"]}).status_code == 403


def test_admin_credential_file_is_root_only_and_renewed(app, tmp_path):
    path = tk.ensure_admin_token(app.state.engine, tmp_path / "state")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    secret = path.read_text().strip()
    http = TestClient(app, headers={"Authorization": f"Bearer {secret}"})
    assert http.get("/v1/nodes").status_code == 200                     # an admin
    assert tk.ensure_admin_token(app.state.engine, tmp_path / "state").read_text().strip() == secret
    token_id = [t for t in http.get("/v1/tokens").json() if t["name"].startswith("admin")][0]["id"]
    http.delete(f"/v1/tokens/{token_id}")
    renewed = tk.ensure_admin_token(app.state.engine, tmp_path / "state").read_text().strip()
    assert renewed != secret and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_roles_service_member_agent(app, admin):
    admin.post("/v1/nodes", json={"name": "c1"}).raise_for_status()
    net = admin.post("/v1/networks", json={"project_id": "p1"}).json()
    admin.post("/v1/subnets", json={"network_id": net["id"], "cidr": "10.0.0.0/24"}).raise_for_status()
    member = client(app)
    # binding is the cloud's: a member may create a port, not bind it
    for field, value in (("node", "c1"), ("interface_name", "tap1")):
        r = member.post("/v1/ports", json={"network_id": net["id"], field: value})
        assert r.status_code == 403 and detail(r)["loc"] == ["body", field], r.text
    port = member.post("/v1/ports", json={"network_id": net["id"]}).json()
    for body in ({"node": "c1"}, {"interface_name": "tap1"}, {"node": None}):
        r = member.patch(f"/v1/ports/{port['id']}", json=body)
        assert r.status_code == 403 and detail(r)["loc"] == ["body", next(iter(body))], r.text
    # the service identity acts for the project it names, and may bind
    service = client(app, "services", roles="service", **{"X-Project": "p1"})
    bound = service.patch(f"/v1/ports/{port['id']}", json={"node": "c1", "interface_name": "tap1"}).json()
    assert (bound["node"], bound["interface_name"], bound["project_id"]) == ("c1", "tap1", "p1")
    assert service.get("/v1/nodes").status_code == 403                  # not an admin
    other = client(app, "services", roles="service", **{"X-Project": "p2"})
    assert other.get(f"/v1/ports/{port['id']}").status_code == 404      # acting for p2: p1's port is absent
    # an agent token serves PPTMon ingestion only
    agent = client(app, "admin", "agent", node="c1")
    for method, path in (("GET", "/v1/networks"), ("GET", "/v1/pptmon/records"), ("GET", "/v1/tokens")):
        assert agent.request(method, path).status_code == 403, path


@pytest.mark.parametrize("name", ["vxlan0", "vxlan_sys_4789", "patch-phy", "patch-int", "br-int", "br-phy",
                                  "qrp7", "genev_sys_6081", "gre0", "ovs-system", "VXLAN0"])
def test_fabric_interfaces_are_never_tenant_ports(app, admin, name):
    admin.post("/v1/nodes", json={"name": "c1"}).raise_for_status()
    net = admin.post("/v1/networks", json={}).json()
    # refused whoever asks (an admin too), naming the field, on create and on update
    r = admin.post("/v1/ports", json={"network_id": net["id"], "node": "c1", "interface_name": name})
    assert r.status_code == 422 and detail(r)["loc"] == ["body", "interface_name"], r.text
    port = admin.post("/v1/ports", json={"network_id": net["id"], "node": "c1", "interface_name": "tap1"}).json()
    r = admin.patch(f"/v1/ports/{port['id']}", json={"interface_name": name})
    assert r.status_code == 422 and detail(r)["loc"] == ["body", "interface_name"], r.text
    assert admin.get(f"/v1/ports/{port['id']}").json()["interface_name"] == "tap1"


# ---------------------------------------------------------------------------------------------- no existence leaks


def test_another_projects_objects_are_absent(app, admin):
    admin.post("/v1/nodes", json={"name": "c1"}).raise_for_status()
    theirs = admin.post("/v1/networks", json={"project_id": "p2"}).json()
    sub = admin.post("/v1/subnets", json={"network_id": theirs["id"], "cidr": "10.0.0.0/24"}).json()
    port = admin.post("/v1/ports", json={"network_id": theirs["id"], "node": "c1", "interface_name": "t1"}).json()
    router = admin.post("/v1/routers", json={"project_id": "p2"}).json()
    tap = admin.post("/v1/taps", json={"sender": port["id"], "receiver": {"mac": "02:00:00:00:00:09",
                                       "ip": "10.0.0.9"}, "monitor": port["id"], "project_id": "p2"})
    member = client(app)
    missing = 2**31 - 2
    for kind, oid in (("networks", theirs["id"]), ("subnets", sub["id"]), ("ports", port["id"]),
                      ("routers", router["id"]), ("taps", tap.json().get("id", missing))):
        for suffix in ("", "/status") if kind != "taps" else ("",):
            r1, r2 = member.get(f"/v1/{kind}/{oid}{suffix}"), member.get(f"/v1/{kind}/{missing}{suffix}")
            assert r1.status_code == r2.status_code == 404
            assert detail(r1)["msg"].replace(str(oid), "N") == detail(r2)["msg"].replace(str(missing), "N")
        r1, r2 = member.delete(f"/v1/{kind}/{oid}"), member.delete(f"/v1/{kind}/{missing}")
        assert r1.status_code == r2.status_code == 404
    r1 = member.post("/v1/subnets", json={"network_id": theirs["id"], "cidr": "10.1.0.0/24"})
    r2 = member.post("/v1/subnets", json={"network_id": missing, "cidr": "10.1.0.0/24"})
    assert r1.status_code == r2.status_code == 404
    assert detail(r1)["msg"].replace(str(theirs["id"]), "N") == detail(r2)["msg"].replace(str(missing), "N")
    # listing by a node name says nothing about which nodes exist
    assert member.get("/v1/ports", params={"node": "c1"}).json() == []
    assert member.get("/v1/ports", params={"node": "nosuch"}).json() == []
    # a member cannot name a gateway node (which would tell the nodes)
    mine = member.post("/v1/routers", json={}).json()
    r = member.patch(f"/v1/routers/{mine['id']}", json={"mode": "network-node", "gateway_node": "c1"})
    assert r.status_code == 403 and detail(r)["loc"] == ["body", "gateway_node"]
    # a service binding onto an interface in use learns neither the port nor its project
    service = client(app, "svc", roles="service", **{"X-Project": "p1"})
    net = service.post("/v1/networks", json={}).json()
    r = service.post("/v1/ports", json={"network_id": net["id"], "node": "c1", "interface_name": "t1"})
    assert r.status_code == 409 and detail(r)["msg"] == "interface 't1' on node 'c1' is bound to another port"


def test_runtime_endpoints_are_admin_only(app, admin):
    from fathom.controller.reconciler import Reconciler
    from fathom.controller.server import install_runtime
    from fathom.store.db import session_factory
    reconciler = Reconciler(session_factory(app.state.engine), switches=None, bootstrapper=None)
    install_runtime(app, reconciler)
    member, service = client(app), client(app, "svc", roles="service")
    for method, path in (("GET", "/v1/nodes/c1/flows"), ("POST", "/v1/sync"), ("GET", "/v1/health"),
                         ("GET", "/metrics")):
        assert TestClient(app).request(method, path).status_code == 401, path
        assert member.request(method, path).status_code == 403, path
        assert service.request(method, path).status_code == 403, path
    r = admin.get("/v1/nodes/nosuch/flows")
    assert r.status_code == 404 and detail(r)["type"] == "not_found"
    assert admin.get("/metrics").status_code == 200


# ---------------------------------------------------------------------------------------------- bounded input


@pytest.mark.parametrize("body", [
    b'{"name": NaN}', b'{"name": "x", "segmentation_id": Infinity}', b'{"segmentation_id": -Infinity}',
    b'{"name": "\\ud800"}', b'{"name": "a\\u0000b"}', b'{"name": "ok", "\\udfff": 1}',
    b'{"name": ', b'\xff\xfe', b'[' * 5000 + b']' * 5000,
])
def test_hostile_json_is_a_422(admin, body):
    r = admin.post("/v1/networks", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert set(detail(r)) == {"loc", "msg", "type"}
    assert admin.get("/v1/networks").json() == []


def test_nul_in_path_and_query_is_a_422(admin):
    assert admin.get("/v1/networks", params={"name": "a\x00b"}).status_code == 422
    assert admin.get("/v1/nodes/a%00b/status").status_code == 422


def test_errors_do_not_echo_large_input(admin):
    big = "x" * 200_000
    for body in ({"name": big}, {"name": "n", big: 1}, {"type": big}):
        r = admin.post("/v1/networks", json=body)
        assert r.status_code == 422 and len(r.content) < 2000, len(r.content)
        assert "input" not in detail(r)
    net = admin.post("/v1/networks", json={}).json()
    r = admin.post("/v1/ports", json={"network_id": net["id"], "mac_address": big})
    assert r.status_code == 422 and len(r.content) < 2000


def test_body_size_limit(db_url):
    app = create_app(db_url, max_body=4096)
    try:
        http = TestClient(app, headers=headers_for(app))
        r = http.post("/v1/networks", json={"name": "x" * 5000})
        assert r.status_code == 413 and detail(r)["loc"] == ["body"]
        assert http.post("/v1/networks", json={"name": "x" * 200}).status_code == 201
    finally:
        app.state.engine.dispose()


@pytest.mark.parametrize("path", ["/v1/networks/{}", "/v1/subnets/{}", "/v1/ports/{}", "/v1/routers/{}",
                                  "/v1/nodes/{}", "/v1/taps/{}", "/v1/fabric/switches/{}",
                                  "/v1/networks/{}/status", "/v1/routers/{}/interfaces"])
def test_ids_beyond_the_columns_are_404(admin, path):
    for oid in (2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**80, 0, -1):
        r = admin.get(path.format(oid))
        assert r.status_code == 404, (oid, r.text)
    r = admin.post("/v1/subnets", json={"network_id": 2**31, "cidr": "10.0.0.0/24"})
    assert r.status_code == 404 and detail(r)["loc"] == ["body", "network_id"]
    assert admin.get("/v1/subnets", params={"network_id": 2**63}).json() == []
    assert admin.get("/v1/networks", params={"marker": 2**70}).json() == []


def test_pagination_on_lists(admin):
    ids = [admin.post("/v1/networks", json={"name": f"n{i}"}).json()["id"] for i in range(7)]
    page1 = admin.get("/v1/networks", params={"limit": 3}).json()
    page2 = admin.get("/v1/networks", params={"limit": 3, "marker": page1[-1]["id"]}).json()
    page3 = admin.get("/v1/networks", params={"limit": 3, "marker": page2[-1]["id"]}).json()
    assert [n["id"] for n in page1 + page2 + page3] == ids
    for path in ("/v1/networks", "/v1/subnets", "/v1/ports", "/v1/routers", "/v1/nodes", "/v1/taps",
                 "/v1/fabric/switches", "/v1/tokens"):
        assert admin.get(path, params={"limit": 1001}).status_code == 422, path
        assert admin.get(path, params={"limit": 0}).status_code == 422, path
        assert admin.get(path, params={"limit": 1000}).status_code == 200, path


@pytest.mark.parametrize("value", ["%C2%B2", "²", "9999-01-01", "99999999999999999999999", "1e400",
                                   "99999999999999999d", "-5", "not a time", "\u0663\u0664"])
def test_pptmon_time_filters_are_422(admin, value):
    for path, extra in (("/v1/pptmon/records", {}), ("/v1/pptmon/stats", {"chain": "c"})):
        for name in ("since", "until"):
            r = admin.get(path, params={name: value, **extra})
            assert r.status_code == 422 and detail(r)["loc"] == ["query", name], (path, name, r.text)


def test_pptmon_rate_and_chain_cardinality(db_url, monkeypatch):
    from .pptmon_records import record
    monkeypatch.setenv("FATHOM_PPTMON_RATE", "1")       # slow refill: the test does not race the clock
    monkeypatch.setenv("FATHOM_PPTMON_BURST", "150")
    monkeypatch.setenv("FATHOM_PPTMON_MAX_CHAINS", "3")
    app = create_app(db_url)
    try:
        n1, n2 = client(app, "admin", "agent", node="n1"), client(app, "admin", "agent", node="n2")

        def post(http, node, recs):
            return http.post("/v1/pptmon/records", json={"node": node, "records": recs})
        assert post(n1, "n1", [record(i, chain="ca") for i in range(100)]).status_code == 200
        r = post(n1, "n1", [record(100 + i, chain="ca") for i in range(100)])   # 200 > burst 150
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        # chain names are per node: n1's "ca" and n2's "ca" are two chains that never mix
        assert post(n2, "n2", [record(1000, chain="ca")]).status_code == 200
        assert post(n2, "n2", [record(1001, chain="cb")]).status_code == 200
        assert post(n2, "n2", [record(1002, chain="cc")]).status_code == 200
        r = post(n2, "n2", [record(1003, chain="cd")])                      # n2's 4th chain
        assert r.status_code == 422 and "at most 3 chains per node" in detail(r)["msg"]
        assert post(n2, "n2", [record(1004, chain="cb")]).status_code == 200  # its own still go in
        # n2 filled its own budget only: n1 still registers new chains
        assert post(n1, "n1", [record(2000 + i, chain=c) for i, c in enumerate(("cb", "cc"))]).status_code == 200
        admin = TestClient(app, headers=headers_for(app))
        listed = admin.get("/v1/pptmon/chains").json()
        assert [(c["chain"], c["node"], c["nodes"], c["records"]) for c in listed] == [
            ("ca", "n1", ["n1"], 100), ("ca", "n2", ["n2"], 1), ("cb", "n1", ["n1"], 1), ("cb", "n2", ["n2"], 2),
            ("cc", "n1", ["n1"], 1), ("cc", "n2", ["n2"], 1)]
        ca = {n: admin.get("/v1/pptmon/stats", params={"chain": "ca", "window": "1d", **({"node": n} if n else {})}
                           ).json()["records"] for n in ("n1", "n2", None)}
        assert ca == {"n1": 100, "n2": 1, None: 101}
        assert {r["node"] for r in admin.get("/v1/pptmon/records", params={"chain": "ca", "node": "n2"}).json()} == {"n2"}
    finally:
        app.state.engine.dispose()


# ---------------------------------------------------------------------------------------------- Keystone


class _FakeKeystone(BaseHTTPRequestHandler):
    """Keystone's GET /v3/auth/tokens as the identity API v3 answers it."""
    tokens: dict = {}
    calls = 0

    def do_GET(self):  # noqa: N802
        type(self).calls += 1
        if self.path != "/v3/auth/tokens" or self.headers.get("X-Auth-Token") != "service-secret":
            self.send_response(401)
            self.end_headers()
            return
        tok = self.tokens.get(self.headers.get("X-Subject-Token"))
        if tok is None:
            self.send_response(404)
            self.end_headers()
            return
        body = json.dumps({"token": tok}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


@pytest.fixture
def keystone():
    later = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    _FakeKeystone.tokens = {
        "ks-member": {"project": {"id": "tenant-a"}, "roles": [{"name": "member"}, {"name": "reader"}],
                      "expires_at": later},
        "ks-admin": {"project": {"id": "admin"}, "roles": [{"name": "admin"}], "expires_at": later},
        "ks-expired": {"project": {"id": "tenant-a"}, "roles": [{"name": "member"}],
                       "expires_at": "2001-01-01T00:00:00Z"},
        "ks-unscoped": {"roles": [], "expires_at": later},
    }
    _FakeKeystone.calls = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeKeystone)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_keystone_tokens_when_configured(db_url, keystone, tmp_path):
    (tmp_path / "svc").write_text("service-secret\n")
    validator = KeystoneValidator.from_env({"FATHOM_KEYSTONE_URL": keystone,
                                            "FATHOM_KEYSTONE_TOKEN_FILE": str(tmp_path / "svc")})
    app = create_app(db_url, keystone=validator)
    try:
        def as_(token):
            return TestClient(app, headers={"Authorization": f"Bearer {token}"})
        made = as_("ks-member").post("/v1/networks", json={}).json()
        assert made["project_id"] == "tenant-a"
        assert as_("ks-member").get("/v1/nodes").status_code == 403
        assert as_("ks-admin").get("/v1/nodes").status_code == 200
        for bad in ("ks-expired", "ks-unscoped", "ks-unknown"):
            assert as_(bad).get("/v1/networks").status_code == 401, bad
        calls = _FakeKeystone.calls
        as_("ks-member").get("/v1/networks")
        assert _FakeKeystone.calls == calls                  # cached
        # fathom's own tokens still work, and are never sent to Keystone
        assert TestClient(app, headers=headers_for(app)).get("/v1/nodes").status_code == 200
        assert as_("fth_" + "y" * 43).get("/v1/nodes").status_code == 401 and _FakeKeystone.calls == calls
    finally:
        app.state.engine.dispose()
    wrong = KeystoneValidator(keystone, "not-the-service-token", cache_seconds=0)
    assert wrong.validate("ks-member") is None
    assert KeystoneValidator("http://127.0.0.1:9", "x").validate("ks-member") is None    # unreachable: refused
    assert KeystoneValidator.from_env({}) is None
    with pytest.raises(ValueError):
        KeystoneValidator.from_env({"FATHOM_KEYSTONE_URL": keystone})


def test_os_environment_has_no_keystone(monkeypatch):
    """Without configuration the controller consults no Keystone."""
    monkeypatch.delenv("FATHOM_KEYSTONE_URL", raising=False)
    assert KeystoneValidator.from_env(os.environ) is None


# ---------------------------------------------------------------------------------------------- a real server


class _Served:
    """create_app under uvicorn on loopback with the controller's protocol and limits."""

    def __init__(self, tmp_path, header_timeout: float):
        import uvicorn

        from fathom.api.connections import ConnectionLimits, Gate, Guard
        self.app = create_app(f"sqlite:///{tmp_path / 's.db'}", max_body=64 * 1024)
        self.token = headers_for(self.app)["Authorization"]
        guard = Guard(ConnectionLimits(head_timeout=header_timeout, max_head=16 * 1024))
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(Gate(self.app, guard), host="127.0.0.1", port=self.port,
                                                    http=guard.protocol, log_level="warning", lifespan="off",
                                                    proxy_headers=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            threading.Event().wait(0.02)

    def connect(self):
        import socket
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)
        self.app.state.engine.dispose()


@pytest.fixture
def served(tmp_path):
    s = _Served(tmp_path, header_timeout=1.0)
    yield s
    s.stop()


def _read_all(sock) -> bytes:
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        out += chunk
    return out


def test_a_large_body_is_refused_while_it_is_read(served):
    """100 MB announced, then sent: the answer (413) comes after the first 64 KiB, and the server
    does not wait for (or keep) the rest."""
    import time
    with served.connect() as sock:
        sock.sendall(f"POST /v1/networks HTTP/1.1\r\nHost: x\r\nAuthorization: {served.token}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n".encode())
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    # the same without a length (chunked): refused once 64 KiB have arrived
    with served.connect() as sock:
        sock.sendall(f"POST /v1/networks HTTP/1.1\r\nHost: x\r\nAuthorization: {served.token}\r\n"
                     "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        t0 = time.monotonic()
        sent, answer = 0, b""
        sock.settimeout(0.2)
        while sent < 10_000_000 and not answer:
            try:
                sock.sendall(b"4000\r\n" + b"x" * 0x4000 + b"\r\n")
                sent += 0x4000
                answer = sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        answer += _read_all(sock) if answer else b""
    assert sent < 2_000_000 and time.monotonic() - t0 < 20
    assert answer.startswith(b"HTTP/1.1 413") or answer == b"", answer[:200]


def test_slow_clients_are_cut_off(served):
    import time
    # a request head that never completes
    with served.connect() as sock:
        sock.sendall(b"GET /v1/networks HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        assert _read_all(sock) == b"" and time.monotonic() - t0 < 5
    # a connection that sends nothing at all
    with served.connect() as sock:
        t0 = time.monotonic()
        assert _read_all(sock) == b"" and time.monotonic() - t0 < 5
    # a head dribbled in byte by byte: still closed after the timeout
    with served.connect() as sock:
        t0 = time.monotonic()
        closed = False
        for b in b"GET /v1/networks HTTP/1.1\r\nX-Slow: " + b"a" * 100:
            try:
                sock.sendall(bytes([b]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.05)
        assert closed or _read_all(sock) == b""
        assert time.monotonic() - t0 < 6
    # an oversized head is refused (fathom.api.connections.GuardedProtocol)
    with served.connect() as sock:
        sock.sendall(b"GET /v1/networks HTTP/1.1\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n")
        assert not _read_all(sock).startswith(b"HTTP/1.1 200")
    # a body that stops half way: answered 408 by the body reader (its deadline is 10 s)
    with served.connect() as sock:
        sock.sendall(f"POST /v1/networks HTTP/1.1\r\nHost: x\r\nAuthorization: {served.token}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"name\"".encode())
        sock.settimeout(20)
        t0 = time.monotonic()
        answer = _read_all(sock)
        assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 15, answer[:100]
    # and a well-behaved client is served, kept alive across requests
    with served.connect() as sock:
        for _ in range(2):
            sock.sendall(f"GET /v1/networks HTTP/1.1\r\nHost: x\r\nAuthorization: {served.token}\r\n\r\n".encode())
            answer = b""
            while not answer.endswith(b"[]"):
                answer += sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200")
