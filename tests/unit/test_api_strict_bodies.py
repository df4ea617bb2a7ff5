"""Request bodies are read strictly: JSON in UTF-8 with each key once per object, as it is sent (no
Content-Encoding but identity). What is refused changes nothing in the store."""
from __future__ import annotations

import gzip
import json
import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from fathom.api import create_app  # noqa: E402

from .auth import headers_for  # noqa: E402

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def admin(tmp_path_factory):
    app = create_app(f"sqlite:///{tmp_path_factory.mktemp('strict') / 's.db'}")
    yield TestClient(app, headers=headers_for(app))
    app.state.engine.dispose()


def refused(admin, status: int, body: bytes, headers: dict, loc: list) -> None:
    r = admin.post("/v1/networks", content=body, headers=headers)
    assert r.status_code == status, r.text
    d = r.json()["detail"][0]
    assert set(d) == {"loc", "msg", "type"} and d["loc"] == loc, d
    assert admin.get("/v1/networks").json() == []


@pytest.mark.parametrize("body", [
    b'{"name": "a", "name": "b"}',
    b'{"name": "a", "project_id": "p1", "project_id": "admin"}',
    b'{"name": "a", "x": {"k": 1, "k": 2}}',
    b'{"na\\u006de": "a", "name": "b"}',               # the same key once escaped
])
def test_duplicate_keys_are_a_422(admin, body):
    refused(admin, 422, body, JSON, ["body"])


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"])
def test_bodies_not_in_utf8_are_a_422(admin, encoding):
    # json.loads of these bytes would decode them (it detects UTF-16 and UTF-32, with or without BOM)
    body = json.dumps({"name": "wide"}).encode(encoding)
    assert json.loads(body) == {"name": "wide"}
    refused(admin, 422, body, JSON, ["body"])
    refused(admin, 422, b"\xef\xbb\xbf" + b'{"name": "bom"}', JSON, ["body"])     # a UTF-8 BOM is not JSON either


@pytest.mark.parametrize("encoding", ["gzip", "GZIP", "deflate", "br", "identity, gzip", "x-anything"])
def test_content_encoding_other_than_identity_is_a_415(admin, encoding):
    for body in (b'{"name": "plain"}', gzip.compress(b'{"name": "packed"}')):
        refused(admin, 415, body, {**JSON, "Content-Encoding": encoding}, ["header", "content-encoding"])


@pytest.mark.parametrize("ctype", ["application/json; charset=utf-16", "application/json;charset=latin-1",
                                   'application/merge-patch+json; charset="UTF-32"'])
def test_a_json_charset_other_than_utf8_is_a_415(admin, ctype):
    refused(admin, 415, b'{"name": "x"}', {"Content-Type": ctype}, ["header", "content-type"])


def test_strict_bodies_still_take_plain_json(admin):
    for headers in (JSON, {**JSON, "Content-Encoding": "identity"},
                    {"Content-Type": "application/json; charset=UTF-8"}):
        r = admin.post("/v1/networks", content=json.dumps({"name": "ünï", "x": None}).encode(), headers=headers)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "x"]   # read: the route saw it
    r = admin.post("/v1/networks", content='{"name": "ünï"}'.encode(), headers=JSON)
    assert r.status_code == 201 and r.json()["name"] == "ünï"
    assert admin.delete(f"/v1/networks/{r.json()['id']}").status_code == 204
