"""fathom.api.direct: `POST /v1/ports` answered without FastAPI's routing gives the answers FastAPI's
route gives. Two apps on two stores built alike: one as create_app makes it, one without
DirectRoutes (FastAPI alone); the same requests to both, their answers compared (status, headers,
body; a port's MAC and creation time apart), and whether DirectRoutes took each one."""
from __future__ import annotations

import shutil

import pytest

from fastapi.testclient import TestClient  # noqa: E402

from fathom.api import create_app  # noqa: E402
from fathom.api.direct import DirectRoutes  # noqa: E402

from .auth import headers_for  # noqa: E402


@pytest.fixture(params=["sqlite", "postgresql"])
def two_stores(request, tmp_path):
    if request.param == "sqlite":
        urls = []
        for name in ("a.db", "b.db"):
            shutil.copyfile(request.getfixturevalue("sqlite_template"), tmp_path / name)
            urls.append(f"sqlite:///{tmp_path / name}")
        return urls
    server = request.getfixturevalue("postgres")
    return [server.new_database(migrated=True), server.new_database(migrated=True)]


class Pair:
    """The app as made (direct) and the app without DirectRoutes (fastapi), set up alike."""

    def __init__(self, urls, monkeypatch):
        self.direct_app, self.fastapi_app = create_app(urls[0]), create_app(urls[1])
        self.fastapi_app.user_middleware = [m for m in self.fastapi_app.user_middleware if m.cls is not DirectRoutes]
        assert len(self.fastapi_app.user_middleware) == len(self.direct_app.user_middleware) - 1
        self.taken: list[bool] = []
        create_arguments = DirectRoutes._create_arguments

        async def spy(middleware, scope, body):
            arguments = await create_arguments(middleware, scope, body)
            self.taken.append(arguments is not None)
            return arguments
        monkeypatch.setattr(DirectRoutes, "_create_arguments", spy)
        self.direct, self.fastapi = TestClient(self.direct_app), TestClient(self.fastapi_app)
        self.tokens = {}
        for who in (("admin", "admin"), ("p1", "member"), ("p2", "member"), ("svc", "service"), ("n", "agent")):
            a = headers_for(self.direct_app, *who, node="n1" if who[1] == "agent" else None)
            b = headers_for(self.fastapi_app, *who, node="n1" if who[1] == "agent" else None)
            self.tokens[who[1] if who[0] != "p2" else "other"] = (a, b)
        # the same objects in both, in the same order: the same ids
        for kind, body in (("nodes", {"name": "n1", "management_ip": "192.0.2.1", "tunnel_ip": "192.0.2.1"}),
                           ("networks", {"name": "net", "type": "vxlan"}),
                           ("subnets", {"network_id": 1, "cidr": "10.0.0.0/24"})):
            self.both("POST", f"/v1/{kind}", json=body, check=False)
        self.network_of_p1 = self.both("POST", "/v1/networks", json={"name": "p1net"}, who="member",
                                       check=False)[0].json()["id"]
        self.both("POST", "/v1/subnets", json={"network_id": self.network_of_p1, "cidr": "10.1.0.0/24"},
                  who="member", check=False)
        for who in self.tokens:   # every token verified lately (a token's first call is FastAPI's: it verifies it)
            self.both("GET", "/v1/networks", who=who, check=False)
        self.taken.clear()

    def both(self, method, path, who="admin", headers=None, check=True, **kwargs):
        """The answers of both apps to one request (`headers` replace the token's where given)."""
        answers = []
        for client, token in zip((self.direct, self.fastapi), self.tokens[who]):
            sent = {**token, **(headers or {})}
            sent = {k: v for k, v in sent.items() if v is not None}
            answers.append(client.request(method, path, headers=sent, **kwargs))
        if check:
            same(*answers)
        return answers

    def close(self):
        for app in (self.direct_app, self.fastapi_app):
            app.state.engine.dispose()


def same(a, b) -> None:
    assert a.status_code == b.status_code, (a.text, b.text)
    varying = {"date", "content-length"}
    assert {k: v for k, v in a.headers.items() if k not in varying} == {k: v for k, v in b.headers.items() if k not in varying}
    if a.headers.get("content-type") == "application/json":
        assert _comparable(a.json()) == _comparable(b.json())
    else:
        assert a.content == b.content


def _comparable(value):
    """A port's MAC (random) and creation time (the clock's) are each app's own; every key is kept."""
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    if isinstance(value, dict):
        return {k: "?" if k in ("mac_address", "created_at") else v for k, v in value.items()}
    return value


@pytest.fixture
def pair(two_stores, monkeypatch):
    p = Pair(two_stores, monkeypatch)
    yield p
    p.close()


PORT = {"network_id": 1, "name": "p", "node": "n1", "interface_name": "tap0"}


def test_an_ordinary_creation_is_taken_and_answered_alike(pair):
    a, _ = pair.both("POST", "/v1/ports", json=PORT)
    assert a.status_code == 201 and a.json()["fixed_ips"][0]["ip_address"].startswith("10.0.0.")
    assert pair.taken == [True]
    # given addresses and groups (written in a transaction), another project's service call, a member's
    pair.both("POST", "/v1/ports", json={"network_id": 1, "fixed_ips": [{"subnet_id": 1, "ip_address": "10.0.0.50"}],
                                         "security_groups": []})
    pair.both("POST", "/v1/ports", json={"network_id": 1, "project_id": "admin"}, who="service",
              headers={"X-Project": "admin"})
    pair.both("POST", "/v1/ports", json={"network_id": pair.network_of_p1}, who="member",
              headers={"X-Project": "ignored-for-a-member"})
    assert pair.taken == [True, True, True, True]
    # the ports are the same in both stores
    same(pair.direct.get("/v1/ports", headers=pair.tokens["admin"][0]),
         pair.fastapi.get("/v1/ports", headers=pair.tokens["admin"][1]))


def test_errors_the_write_raises_are_answered_alike(pair):
    pair.both("POST", "/v1/ports", json=PORT)
    cases = [
        ({**PORT, "name": "again"}, "admin", None, 409),                  # the node's interface is taken
        ({"network_id": 999}, "admin", None, 404),                          # no such network
        ({"network_id": 1}, "other", None, 404),                            # another project's network
        ({"network_id": 1, "node": "nowhere"}, "admin", None, 404),         # no such node
        ({"network_id": pair.network_of_p1, "node": "n1"}, "member", None, 403),             # binding is the service's
        ({"network_id": pair.network_of_p1, "security_groups": [12345]}, "member", None, 404),
    ]
    for body, who, headers, status in cases:
        a, _ = pair.both("POST", "/v1/ports", json=body, who=who, headers=headers)
        assert a.status_code == status, (body, a.text)
    assert pair.taken == [True] * (1 + len(cases))


def test_requests_it_does_not_take_are_fastapis(pair):
    long = "x" * 65
    cases = [
        # (body as sent, extra headers, who)
        (b'{"network_id": "abc"}', {}, "admin"),                     # wrong types
        (b'{"network_id": 1, "name": 5, "port_security": "maybe"}', {}, "admin"),
        (b'{"network_id": 1, "fixed_ips": "x"}', {}, "admin"),
        (b'{"network_id": 1, "foo": 1}', {}, "admin"),               # an unknown field
        (b'{"name": "no network"}', {}, "admin"),                    # a missing one
        (b'{"network_id": 1, "mac_address": "zz"}', {}, "admin"),
        (b'{"network_id": 1, "node": "bad name!"}', {}, "admin"),
        (b'{"network_id": 1, "fixed_ips": [' + b'{"subnet_id": 1},' * 40 + b'{"subnet_id": 1}]}', {}, "admin"),
        (b"null", {}, "admin"), (b"[]", {}, "admin"), (b'"x"', {}, "admin"), (b"", {}, "admin"),
        (b"{", {}, "admin"),                                         # not JSON (BoundedInput's 422)
        (b'{"network_id": 1, "network_id": 2}', {}, "admin"),        # a key twice
        (b'{"network_id": NaN}', {}, "admin"),
        (b'{"network_id": 1}', {"Authorization": None}, "admin"),   # no token
        (b'{"network_id": 1}', {"Authorization": "Bearer"}, "admin"),
        (b'{"network_id": 1}', {"Authorization": "Basic abc"}, "admin"),
        (b'{"network_id": 1}', {"Authorization": "Bearer fathom_unknown"}, "admin"),
        (b'{"network_id": 1}', {"Authorization": "Bearer not-ours-and-no-keystone"}, "admin"),
        (b'{"network_id": 1}', {}, "agent"),                         # a role the route refuses
        (b'{"network_id": 1}', {"X-Project": long}, "service"),     # X-Project too long
        (b'{"network_id": 1}', {"X-Project": ""}, "service"),       # or empty
        (b'{"network_id": 1}', {"X_Project": "svc"}, "service"),
        (b'{"network_id": 1, "foo": 1}', {"X-Project": long}, "service"),   # both errors in one answer
        (b'{"network_id": 1}', {"Content-Type": "text/plain"}, "admin"),
        (b'{"network_id": 1}', {"Content-Type": "application/json; charset=utf-16"}, "admin"),
        (b'{"network_id": 1}', {"Content-Encoding": "gzip"}, "admin"),
        (b'{"network_id": 1, "name": "' + b"x" * (1 << 20) + b'"}', {}, "admin"),   # larger than max_body
    ]
    for body, headers, who in cases:
        sent = {"Content-Type": "application/json", **headers}
        a, _ = pair.both("POST", "/v1/ports", content=body, who=who, headers=sent)
        assert 400 <= a.status_code < 500, (body[:80], headers, a.text)
    # bodies FastAPI reads as JSON too (no Content-Type, a +json one), a path with a slash more: FastAPI's
    pair.both("POST", "/v1/ports", content=b'{"network_id": 1}', headers={"Content-Type": None})
    pair.both("POST", "/v1/ports", content=b'{"network_id": 1}', headers={"Content-Type": "application/merge-patch+json"})
    redirect, _ = pair.both("POST", "/v1/ports/", json={"network_id": 1}, follow_redirects=False)
    assert redirect.status_code == 307
    # (those BoundedInput refuses, malformed JSON among them, never reach DirectRoutes)
    assert len(pair.taken) >= len(cases) - 6 + 2 and not any(pair.taken), pair.taken


def test_request_ids_are_kept(pair):
    key = {"Idempotency-Key": "create-1"}
    first, _ = pair.both("POST", "/v1/ports", json=PORT, headers=key)
    again, _ = pair.both("POST", "/v1/ports", json=PORT, headers=key)
    assert again.headers["idempotent-replayed"] == "true" and again.json() == first.json()
    other, _ = pair.both("POST", "/v1/ports", json={**PORT, "name": "different"}, headers=key)
    assert other.status_code == 422
    assert pair.taken == [True, True, True]
    assert len(pair.direct.get("/v1/ports", headers=pair.tokens["admin"][0]).json()) == 1
