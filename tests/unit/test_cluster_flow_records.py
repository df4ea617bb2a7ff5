"""Flow records through any replica of a cluster: two apps on one PostgreSQL store, served over
loopback HTTP, each a replica in the cluster's table (fathom.cluster.mastership, as the controller
runs it). Node c1's agent delivers to replica A, then (moved) to B; c2's to B. A query at either
answers with both replicas' records, top talkers and drops summed across them; a member sees only
their project's, however asked; a replica that does not answer is named (and by `fathom
flow-records` in a warning line), never a 5xx. The replica asked checks the caller and asks the
others with a token of its own (role `replica`, naming no node, removed after), never the caller's;
such a token reads a replica's own records and nothing else."""
from __future__ import annotations

import socket
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from click.testing import CliRunner

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fathom.auth import tokens
from fathom.cluster.leases import Timing
from fathom.cli.main import cli
from fathom.cluster.mastership import Mastership
from fathom.model import flow_batch as fb
from fathom.model import flow_records as fr
from fathom.store.auth_models import ApiToken

from .auth import headers_for
from .test_api_races import Served


def _replica(served: Served, name: str, timing: Timing) -> Mastership:
    """`served` as a replica of the cluster, its records query answering for the others (as the
    controller wires it)."""
    mastership = Mastership(served.app.state.engine, lambda: (), replica_id=name, timing=timing,
                            address=served.url.removesuffix("/v1")).start()
    served.app.state.flow_records.peers = lambda: mastership.replicas
    served.app.state.flow_records.peer_timeout = 0.5
    return mastership


class _Forged(BaseHTTPRequestHandler):
    """A replica's API answering what no replica would (its server's `body`); it keeps the
    credentials it was asked with (`asked_with`) and whether each was valid then (`valid`)."""

    def do_GET(self):
        secret = self.headers.get("Authorization", "").removeprefix("Bearer ")
        self.server.asked_with.append(secret)
        with Session(self.server.engine) as s:
            self.server.valid.append(tokens.verify(s, secret))
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, *_):
        pass


class _Server(ThreadingHTTPServer):
    server_bind = socketserver.TCPServer.server_bind     # no name lookup of the address
    block_on_close = False


def _forged(body: bytes, engine) -> _Server:
    server = _Server(("127.0.0.1", 0), _Forged)
    server.body, server.engine, server.asked_with, server.valid = body, engine, [], []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _ingest(served: Served, node: str, records: list[tuple]):
    """`records` ((point, src, dst, dport, packets, bytes)) delivered by `node`'s agent to `served`."""
    body = fb.encode([{"point": p, "src": s, "dst": d, "proto": 6, "sport": 40000, "dport": dport, "packets": n,
                       "bytes": b, "first": 1.0, "last": 2.0} for p, s, d, dport, n, b in records], time.time(), 5)
    r = httpx.post(f"{served.url}/flow-records/ingest", content=body, timeout=10, headers={
        **headers_for(served.app, "admin", ("agent",), node=node), "Content-Type": fb.CONTENT_TYPE})
    assert r.status_code == 200 and r.json()["refused"] == 0, r.text


def _get(served: Served, headers: dict, **params) -> dict:
    r = httpx.get(f"{served.url}/flow-records", params=params, headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_any_replica_answers_with_every_replicas_records(postgres, monkeypatch):
    url = postgres.new_database(migrated=True)
    a, b = Served(url), Served(url)
    timing = Timing(renew=0.1, lease=1.0)
    hung = socket.socket()            # a replica whose API takes connections and never answers
    hung.bind(("127.0.0.1", 0))
    hung.listen()
    forged = [_forged(b" " * (3 << 20), a.app.state.engine),
              _forged(b'{"records": [{"project": "p1", "time": "now"}]}', a.app.state.engine)]
    replicas = []
    try:
        replicas += [_replica(a, "a", timing), _replica(b, "b", timing)]
        for i, name in enumerate(("c1", "c2")):
            a.post("/nodes", {"name": name, "tunnel_ip": f"198.18.0.{i + 1}"})
        ports = {}
        for project, vms in (("p1", (("vm1", "c1"), ("vm2", "c2"))), ("p2", (("vm3", "c1"),))):
            net = a.post("/networks", {"name": project, "project_id": project})
            a.post("/subnets", {"network_id": net["id"], "cidr": f"198.19.{project[1]}.0/24"})
            for vm, node in vms:
                port = a.post("/ports", {"network_id": net["id"], "name": vm, "node": node, "interface_name": vm})
                ports[vm] = (port["id"], port["fixed_ips"][0]["ip_address"])
        (vm1, ip1), (vm2, ip2), (vm3, ip3) = ports["vm1"], ports["vm2"], ports["vm3"]
        send1 = (fr.point_id(fr.PORT_INGRESS, vm1), ip1, ip2, 5201)
        drop1 = (fr.point_id(fr.DROP_EGRESS, vm1), ip1, ip2, 22)
        _ingest(a, "c1", [send1 + (10, 15000), drop1 + (1, 60), (fr.point_id(fr.PORT_INGRESS, vm3), ip3, ip1, 80,
                                                                   5, 500)])
        _ingest(b, "c1", [send1 + (20, 30000), drop1 + (2, 120)])          # c1's agent moved to B
        _ingest(b, "c2", [(fr.point_id(fr.PORT_INGRESS, vm2), ip2, ip1, 5201, 4, 4000)])
        deadline = time.monotonic() + 10
        while not all(len(m.replicas) == 1 for m in replicas) and time.monotonic() < deadline:
            time.sleep(0.05)
        member = headers_for(a.app, "p1", ("member",))
        other = headers_for(a.app, "p2", ("member",))
        for served in (a, b):
            got = _get(served, a.headers)
            assert got["partial"] == [] and len(got["records"]) == 6
            assert [r["time"] for r in got["records"]] == sorted((r["time"] for r in got["records"]), reverse=True)
            assert len(_get(served, a.headers, limit=2)["records"]) == 2
            top = [(t["port"], t["dst"], t["bytes"], t["packets"])
                   for t in _get(served, a.headers, view="top")["records"]]
            assert top == [("vm1", ip2, 45000, 30), ("vm2", ip1, 4000, 4), ("vm3", ip1, 500, 5)]
            drops = _get(served, member, view="drops")["records"]
            assert [(d["port"], d["rule"], d["packets"]) for d in drops] == [("vm1", fr.DEFAULT_DROP, 3)]
            mine = _get(served, member)["records"]
            assert len(mine) == 5 and {r["project"] for r in mine} == {"p1"}
            assert {r["port"] for r in _get(served, other)["records"]} == {"vm3"}
            # a replica's own records only: what the others ask it, and nothing more for a member
            assert {r["node"] for r in _get(served, member, scope="local")["records"]} == (
                {"c1"} if served is a else {"c1", "c2"})
            for scope in ("local", "cluster"):
                assert httpx.get(f"{served.url}/flow-records", params={"scope": scope, "project": "p2"},
                                 headers=member).status_code == 403
        assert [t["bytes"] for t in _get(a, member, view="top", port=vm1)["records"]] == [45000]
        # a replica's token: its own records only, of the project asked (all: every project), and no
        # other route; one naming a node is a trace desk's
        peer = {"Authorization": "Bearer " + tokens.issue_now(b.app.state.engine, project="admin", roles=("replica",))}
        assert {r["project"] for r in _get(b, peer, scope="local")["records"]} == {"p1"}
        assert len(_get(b, peer, scope="local", project="p2")["records"]) == 0
        assert {r["project"] for r in _get(a, peer, scope="local")["records"]} == {"p1", "p2"}
        assert httpx.get(f"{b.url}/flow-records", headers=peer).status_code == 403     # scope=cluster
        for path in ("/ports", "/flow-records/config", "/cluster"):
            assert httpx.get(f"{b.url}{path}", headers=peer).status_code == 403, path
        hop = tokens.issue_now(b.app.state.engine, project="admin", roles=("replica",), node="c1")
        assert httpx.get(f"{b.url}/flow-records", params={"scope": "local"},
                         headers={"Authorization": f"Bearer {hop}"}).status_code == 403
        assert httpx.post(f"{b.url}/agents/c1/traces", json={"bridge": "br-int", "flow": "in_port=1", "timeout": 1},
                          headers=peer).status_code == 403

        # replicas whose API hangs, is down, answers too much or what is not records: named with why,
        # the rest answered
        for name, port in (("c", hung.getsockname()[1]), ("d", forged[0].server_address[1]),
                           ("e", forged[1].server_address[1])):
            replicas.append(Mastership(a.app.state.engine, lambda: (), replica_id=name, timing=timing,
                                       address=f"http://127.0.0.1:{port}").start())
        b.stop()
        while len(replicas[0].replicas) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        got = _get(a, member)
        assert [r["node"] for r in got["records"]] == ["c1", "c1"]
        assert sorted(got["partial"]) == ["b: could not be reached at " + b.url.removesuffix("/v1") + " (ConnectError)",
                                          "c: did not answer within 0.5 s", "d: answered more than 2097152 bytes",
                                          "e: answered what fathom does not read (TypeError)"]
        assert _get(a, member, view="top")["records"][0]["bytes"] == 15000
        # the others were asked with A's own token, valid while asked, of the role replica alone and
        # naming no node; the caller's never left A, and A's is gone after
        asked = forged[1].asked_with
        assert asked and member["Authorization"].removeprefix("Bearer ") not in asked
        assert all(v is not None and v.roles == {"replica"} and v.node is None for v in forged[1].valid)
        with Session(a.app.state.engine) as s:
            assert s.scalar(select(func.count()).select_from(ApiToken).where(ApiToken.name == "flow records")) == 0
        # the CLI prints what it has and a warning line per replica missing
        monkeypatch.setenv("FATHOM_TOKEN", member["Authorization"].split()[1])
        result = CliRunner().invoke(cli, ["flow-records", "--controller", a.url.removesuffix("/v1")])
        assert result.exit_code == 0 and "warning: partial answer: replica b: could not be reached" in result.stderr
        assert "vm1" in result.stdout and result.stderr.count("warning:") == 4
    finally:
        for m in replicas:
            m.stop()
        hung.close()
        for server in forged:
            server.shutdown()
            server.server_close()
        a.stop()
        b.stop()
