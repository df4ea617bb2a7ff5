"""Every error of the API has one shape, {"detail": [{"loc", "msg", "type"}]}, whatever raised it."""
from __future__ import annotations

import warnings

import pytest
from fastapi import APIRouter, HTTPException

from fathom.api import create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


@pytest.fixture
def client(tmp_path):
    app = create_app(f"sqlite:///{tmp_path / 'errors.db'}")
    extra = APIRouter()

    @extra.get("/v1/raises/{kind}")
    def raises(kind: str):   # how the switch-reading endpoints of the controller report errors
        if kind == "text":
            raise HTTPException(404, detail="no such thing")
        raise HTTPException(404, detail=[{"loc": ["path", "kind"], "msg": "no such kind"}])

    app.include_router(extra)
    with TestClient(app) as c:
        yield c
    app.state.engine.dispose()


def _shape(r) -> list[dict]:
    body = r.json()
    assert set(body) == {"detail"} and isinstance(body["detail"], list) and body["detail"], body
    for item in body["detail"]:
        assert set(item) == {"loc", "msg", "type"}, item
        assert isinstance(item["loc"], list) and isinstance(item["msg"], str) and isinstance(item["type"], str)
    return body["detail"]


def test_every_error_has_the_same_shape(client):
    cases = [
        (client.get("/v1/networks/99"), 404, {"loc": [], "msg": "network 99 does not exist", "type": "not_found"}),
        (client.get("/v1/nowhere"), 404, {"loc": [], "msg": "Not Found", "type": "not_found"}),
        (client.put("/v1/networks"), 405, {"loc": [], "msg": "Method Not Allowed", "type": "method_not_allowed"}),
        (client.get("/v1/networks/abc"), 422, None),
        (client.post("/v1/networks", json={"type": "token-ring"}), 422, None),
        (client.post("/v1/networks", json={"name": "x", "colour": "red"}), 422, None),
        (client.post("/v1/subnets", json={"network_id": 1, "cidr": "10.0.0.0/24"}), 404, None),
        (client.get("/v1/nodes", headers={"X-Roles": "member"}), 403, None),
        (client.get("/v1/raises/text"), 404, {"loc": [], "msg": "no such thing", "type": "not_found"}),
        (client.get("/v1/raises/list"), 404, {"loc": ["path", "kind"], "msg": "no such kind", "type": "not_found"}),
    ]
    for response, status, first in cases:
        assert response.status_code == status, (response.request.url, response.text)
        items = _shape(response)
        if first is not None:
            assert items[0] == first


def test_validation_errors_name_the_field_and_do_not_echo_the_input(client):
    r = client.post("/v1/networks", json={"segmentation_id": "zz-not-a-number"})
    assert _shape(r)[0]["loc"] == ["body", "segmentation_id"] and "zz-not-a-number" not in r.text
    r = client.get("/v1/networks/abc")
    assert _shape(r)[0]["loc"] == ["path", "network_id"]
