"""A PATCH racing a DELETE of the same object, through the real HTTP API (uvicorn on loopback, one
HTTP client per thread) on SQLite and on a real PostgreSQL: every kind that has both answers the
PATCH with its success (it came first) or 404 (the object is gone), the DELETE with 204 or 404 (or
409 where the API refuses to delete an object in use); never a 5xx.

On PostgreSQL (read committed) the PATCH reads the row, the DELETE commits, and the PATCH's UPDATE
then matches no row: that must be told as the 404 it is.
"""
from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn

from fathom.api import create_app

from .auth import headers_for

RACES = 12          # objects per kind, each PATCHed and DELETEd at once
WORKERS = 8


class Served:
    """create_app(db_url) under uvicorn on a loopback port, run in a thread."""

    def __init__(self, db_url: str):
        self.app = create_app(db_url)
        self.headers = headers_for(self.app)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
        port = int(self.url.split(":")[2].split("/")[0])
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


def _ports(api: Served, net: int, prefix: str, n: int) -> list[dict]:
    """Ports that may be a VNF's (no port security)."""
    return [api.post("/ports", {"network_id": net, "name": f"{prefix}{i}", "node": "c1", "port_security": False,
                                "interface_name": f"{prefix}{i}"}) for i in range(n)]


def _kinds(api: Served) -> dict[str, tuple[list[int], dict]]:
    """Per collection: RACES new objects' ids and a PATCH body."""
    api.post("/nodes", {"name": "c1", "tunnel_ip": "198.18.0.1"})
    net = api.post("/networks", {"name": "base"})["id"]
    api.post("/subnets", {"network_id": net, "cidr": "10.0.0.0/16"})
    ext = api.post("/networks", {"name": "ext", "type": "flat", "external": True})["id"]
    api.post("/subnets", {"network_id": ext, "cidr": "203.0.113.0/24"})
    n = range(RACES)
    ports = _ports(api, net, "pa", 3 * RACES + 3)       # taps' monitors, then three ports per chain
    sfc_ports = [(ports[3 + 3 * i], ports[4 + 3 * i], ports[5 + 3 * i]) for i in n]

    def pair(name: str, i: int) -> int:
        a, b, _ = sfc_ports[i]
        return api.post("/sfc/port_pairs", {"name": f"{name}{i}", "ingress": a["id"], "egress": b["id"]})["id"]

    def chain(i: int) -> int:
        group = api.post("/sfc/port_pair_groups", {"name": f"cg{i}", "port_pairs": [pair("cp", i)]})["id"]
        fc = api.post("/sfc/flow_classifiers", {"name": f"cf{i}", "logical_source_port": sfc_ports[i][2]["id"]})
        return api.post("/sfc/port_chains", {"name": f"c{i}", "port_pair_groups": [group],
                                             "flow_classifiers": [fc["id"]]})["id"]
    kinds = {
        "networks": ([api.post("/networks", {"name": f"n{i}"})["id"] for i in n], {"name": "x"}),
        "subnets": ([api.post("/subnets", {"network_id": api.post("/networks", {"name": f"s{i}"})["id"],
                                           "cidr": f"10.1.{i}.0/24"})["id"] for i in n], {"name": "x"}),
        "ports": ([p["id"] for p in _ports(api, net, "pr", RACES)], {"name": "x", "security_groups": []}),
        "routers": ([api.post("/routers", {"name": f"r{i}"})["id"] for i in n], {"name": "x"}),
        "floatingips": ([api.post("/floatingips", {"floating_network_id": ext})["id"] for i in n],
                        {"name": "x"}),
        "security-groups": ([api.post("/security-groups", {"name": f"g{i}"})["id"] for i in n], {"name": "x"}),
        "taps": ([api.post("/taps", {"sender": ports[0]["id"], "receiver": ports[1]["id"], "monitor": ports[2]["id"],
                                     "ip_proto": 6, "tp_dst": 1 + i})["id"] for i in n], {"name": "x", "priority": 7}),
        "nodes": ([api.post("/nodes", {"name": f"x{i}", "tunnel_ip": f"198.18.1.{i + 1}"})["id"] for i in n],
                  {"role": "gateway"}),
        "pptmon/attachments": ([api.post("/pptmon/attachments", {"name": f"a{i}", "node": "c1", "chain": f"a{i}",
                                                                 "in_interface": f"in{i}", "out_interface": f"out{i}"})["id"]
                                for i in n], {"period_ns": 5}),
    }
    # the service chain kinds, each on objects nothing else uses
    kinds["sfc/port_pairs"] = ([pair("p", i) for i in range(RACES // 2)], {"name": "x"})
    kinds["sfc/port_chains"] = ([chain(i) for i in range(RACES // 2, RACES)], {"name": "x"})
    kinds["sfc/flow_classifiers"] = ([api.post("/sfc/flow_classifiers", {"name": f"f{i}",
                                                                         "logical_source_port": ports[0]["id"]})["id"]
                                      for i in n], {"name": "x"})
    spare = [(a, b) for a, b, _ in sfc_ports[:RACES // 2]]      # ports of port pairs that are deleted first
    kinds["sfc/port_pair_groups"] = (spare, {"name": "x"})
    return kinds


def _race(api: Served, path: str, ids: list, body: dict) -> list[tuple[str, int, str]]:
    """PATCH and DELETE each object at once; (method, status, text) of every answer."""
    def call(method: str, oid: int):
        r = api.http().request(method, f"/{path}/{oid}", json=body if method == "PATCH" else None)
        return method, r.status_code, r.text[:300]
    with ThreadPoolExecutor(WORKERS) as pool:
        futures = [pool.submit(call, method, oid) for oid in ids for method in ("PATCH", "DELETE")]
        return [f.result() for f in futures]


def test_patch_racing_delete_is_never_a_5xx(served):
    kinds = _kinds(served)
    # port pair groups: made once the port pairs' race has freed their ports
    order = [k for k in kinds if k != "sfc/port_pair_groups"] + ["sfc/port_pair_groups"]
    bad, deleted = [], {}
    for path in order:
        ids, body = kinds[path]
        if path == "sfc/port_pair_groups":
            ids = [served.post(path, {"name": f"pg{i}", "port_pairs": [
                served.post("/sfc/port_pairs", {"name": f"gp{i}", "ingress": a["id"], "egress": b["id"]})["id"]]})["id"]
                   for i, (a, b) in enumerate(ids)]
        answers = _race(served, path, ids, body)
        allowed = {"PATCH": {200, 404}, "DELETE": {204, 404, 409}}
        bad += [(path, *a) for a in answers if a[1] not in allowed[a[0]]]
        deleted[path] = sum(1 for a in answers if a[0] == "DELETE" and a[1] == 204)
        # what a PATCH answered 200 is what it changed; every object is gone once its DELETE ran
        for oid in ids:
            r = served.http().get(f"/{path}/{oid}")
            assert r.status_code in (200, 404), (path, oid, r.text)
    assert bad == [], bad
    # the races deleted things: each kind saw its DELETEs succeed
    assert all(n > 0 for n in deleted.values()), deleted
