"""A PATCH racing a DELETE of the same object, through the real HTTP API (uvicorn on loopback, one
HTTP client per thread) on SQLite and on a real PostgreSQL: every kind that has both answers the
PATCH with its success (it came first) or 404 (the object is gone), the DELETE with 204 or 404 (or
409 where the API refuses to delete an object in use); never a 5xx.

On PostgreSQL (read committed) the PATCH reads the row, the DELETE commits, and the PATCH's UPDATE
then matches no row: that must be told as the 404 it is.
"""
from __future__ import annotations

import collections
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn

from fathom.api import create_app
from fathom.lab.controller import free_port

from .auth import headers_for

RACES = 12          # objects per kind, each PATCHed and DELETEd at once
WORKERS = 8


class Served:
    """create_app(db_url) under uvicorn on a loopback port, run in a thread."""

    def __init__(self, db_url: str):
        self.app = create_app(db_url)
        self.headers = headers_for(self.app)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/v1"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            threading.Event().wait(0.02)
        self._local = threading.local()

    def http(self) -> httpx.Client:
        """This thread's client (its own keep-alive connection)."""
        if not hasattr(self._local, "client"):
            self._local.client = httpx.Client(base_url=self.url, headers=self.headers, timeout=30)
        return self._local.client

    def post(self, path: str, body: dict) -> dict:
        r = self.http().post(path, json=body)
        assert r.status_code == 201, (path, r.text)
        return r.json()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.app.state.engine.dispose()


@pytest.fixture
def served(db_url):
    s = Served(db_url)
    yield s
    s.stop()


def _port(api: Served, name: str) -> int:
    """A port that may be a VNF's (no port security)."""
    return api.post("/ports", {"network_id": api.net, "name": name, "node": "c1", "port_security": False,
                               "interface_name": name})["id"]


def _pair(api: Served, name: str) -> int:
    return api.post("/sfc/port_pairs", {"name": name, "ingress": _port(api, f"{name}i"),
                                        "egress": _port(api, f"{name}e")})["id"]


def _group(api: Served, name: str) -> int:
    return api.post("/sfc/port_pair_groups", {"name": name, "port_pairs": [_pair(api, f"{name}p")]})["id"]


def _classifier(api: Served, name: str, i: int) -> int:
    """TCP to port 1000 + i from the first tap port: chains' classifiers may not overlap."""
    return api.post("/sfc/flow_classifiers", {"name": name, "logical_source_port": api.taps[0], "protocol": "tcp",
                                              "destination_port_range_min": 1000 + i,
                                              "destination_port_range_max": 1000 + i})["id"]


# collection: (make the i-th object, return its id; a PATCH body)
KINDS = {
    "networks": (lambda api, i: api.post("/networks", {"name": f"n{i}"})["id"], {"name": "x"}),
    "subnets": (lambda api, i: api.post("/subnets", {"network_id": api.post("/networks", {"name": f"s{i}"})["id"],
                                                     "cidr": f"10.1.{i}.0/24"})["id"], {"name": "x"}),
    "ports": (lambda api, i: _port(api, f"p{i}"), {"name": "x", "security_groups": []}),
    "routers": (lambda api, i: api.post("/routers", {"name": f"r{i}"})["id"], {"name": "x"}),
    "floatingips": (lambda api, i: api.post("/floatingips", {"floating_network_id": api.ext})["id"], {"name": "x"}),
    "security-groups": (lambda api, i: api.post("/security-groups", {"name": f"g{i}"})["id"], {"name": "x"}),
    "taps": (lambda api, i: api.post("/taps", {"sender": api.taps[0], "receiver": api.taps[1], "monitor": api.taps[2],
                                               "ip_proto": 6, "tp_dst": 1 + i})["id"], {"name": "x", "priority": 7}),
    "nodes": (lambda api, i: api.post("/nodes", {"name": f"x{i}", "tunnel_ip": f"198.18.1.{i + 1}"})["id"],
              {"role": "gateway"}),
    "pptmon/attachments": (lambda api, i: api.post("/pptmon/attachments", {
        "name": f"a{i}", "node": "c1", "chain": f"a{i}", "in_interface": f"in{i}", "out_interface": f"out{i}"})["id"],
        {"period_ns": 5}),
    "sfc/port_pairs": (lambda api, i: _pair(api, f"pp{i}"), {"name": "x"}),
    "sfc/port_pair_groups": (lambda api, i: _group(api, f"pg{i}"), {"name": "x"}),
    "sfc/flow_classifiers": (lambda api, i: _classifier(api, f"fc{i}", i), {"name": "x"}),
    "sfc/port_chains": (lambda api, i: api.post("/sfc/port_chains", {
        "name": f"c{i}", "port_pair_groups": [_group(api, f"cg{i}")],
        "flow_classifiers": [_classifier(api, f"cf{i}", i)]})["id"], {"name": "x"}),
}


def _seed(api: Served) -> None:
    """A node, a network and an external network with subnets, and the three ports of the taps."""
    api.post("/nodes", {"name": "c1", "tunnel_ip": "198.18.0.1"})
    api.net = api.post("/networks", {"name": "base"})["id"]
    api.post("/subnets", {"network_id": api.net, "cidr": "10.0.0.0/16"})
    api.ext = api.post("/networks", {"name": "ext", "type": "flat", "external": True})["id"]
    api.post("/subnets", {"network_id": api.ext, "cidr": "203.0.113.0/24"})
    api.taps = [_port(api, f"t{i}") for i in range(3)]


def _race(api: Served, pool: ThreadPoolExecutor, path: str, ids: list, body: dict) -> list[tuple[str, int, str]]:
    """PATCH and DELETE each object at once; (method, status, text) of every answer."""
    def call(method: str, oid: int):
        try:
            r = api.http().request(method, f"/{path}/{oid}", json=body if method == "PATCH" else None)
        except httpx.TransportError as e:     # the server closes the connection after an unhandled error
            return method, 0, repr(e)
        return method, r.status_code, r.text[:300]
    futures = [pool.submit(call, method, oid) for oid in ids for method in ("PATCH", "DELETE")]
    return [f.result() for f in futures]


def test_patch_racing_delete_is_never_a_5xx(served):
    _seed(served)
    allowed = {"PATCH": {200, 404}, "DELETE": {204, 404, 409}}
    bad, seen = [], collections.Counter()
    with ThreadPoolExecutor(WORKERS) as pool:
        for path, (make, body) in KINDS.items():
            ids = list(pool.map(lambda i: make(served, i), range(RACES)))
            answers = _race(served, pool, path, ids, body)
            bad += [(path, *a) for a in answers if a[1] not in allowed[a[0]]]
            seen.update((path, method, status) for method, status, _ in answers)
    assert bad == [], (collections.Counter((path, method, status) for path, method, status, _ in bad), bad[:3])
    # every kind's DELETEs went through, and the PATCHes met objects both before and after them
    assert all(seen[(path, "DELETE", 204)] > 0 for path in KINDS), seen
    assert sum(seen[(path, "PATCH", 404)] for path in KINDS) > 0, seen
    assert sum(seen[(path, "PATCH", 200)] for path in KINDS) > 0, seen
