"""networking-fathom under several Neutron API workers: every worker runs a journal thread, and one
object's entries reach fathom in Neutron's order whichever worker sends them (networking_fathom.db,
claims). Two gunicorn workers, concurrent updates of one port: fathom ends with Neutron's last write.

Neutron reaches fathom through a relay that holds one request back (the first PATCH that names the
port `slow`, for HOLD seconds): a worker's journal thread is slow to send an older update while the
other worker's thread (woken by its own commit, or its `retry_interval` tick) reads the newer one.
Without claims the newer update is sent first and the held older one lands last. The full sync runs
only at start here (`sync_interval` 0): it cannot hide a stale replay.
"""
from __future__ import annotations

import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from fathom.client import Client
from fathom.lab.neutron import NeutronServer, available

from .util import running_lab

pytestmark = pytest.mark.lab

LAB = "zn1"
TOPOLOGY = """
nodes:
  - {name: compute1, role: compute}
underlay: {cidr: 198.18.0.0/24, mtu: 1600}
"""
PROJECT = "zn-workers"
HOLD = 2.0


def relay(target: str, held: threading.Event) -> ThreadingHTTPServer:
    """An HTTP relay on loopback to `target` that holds the first PATCH naming `slow` for HOLD s."""
    class Handler(BaseHTTPRequestHandler):
        def _relay(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.command == "PATCH" and b'"slow"' in body and not held.is_set():
                held.set()
                time.sleep(HOLD)
            headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type",
                                                                               "x-project")}
            r = httpx.request(self.command, target + self.path, content=body, headers=headers, timeout=30)
            self.send_response(r.status_code)
            self.send_header("Content-Type", r.headers.get("content-type", "application/json"))
            self.send_header("Content-Length", str(len(r.content)))
            self.end_headers()
            self.wfile.write(r.content)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _relay

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_an_older_update_held_back_never_lands_after_a_newer_one(tmp_path):
    why = available()
    if why:
        pytest.fail(why)
    with running_lab(LAB, TOPOLOGY, standalone=False) as lab:
        admin = Client.for_lab(lab.state())
        token = admin.post("/tokens", json={"project_id": "services", "roles": ["service"], "name": "neutron"})["token"]
        held = threading.Event()
        slow = relay(lab.state()["controller"]["url"], held)
        server = NeutronServer(tmp_path / "neutron", f"http://127.0.0.1:{slow.server_port}", token, sync_interval=0,
                               workers=2).start()
        try:
            _updates_in_order(server, admin, held)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{server.log_tail(30)}") from e
        finally:
            server.stop()
            slow.shutdown()
            admin.close()


def _updates_in_order(server: NeutronServer, admin: Client, held: threading.Event) -> None:
    neutron = server.url + "/v2.0"
    net = httpx.post(f"{neutron}/networks", json={"network": {"name": "w", "project_id": PROJECT}}).json()["network"]
    port = httpx.post(f"{neutron}/ports", json={"port": {"name": "p", "network_id": net["id"],
                                                         "project_id": PROJECT}}).json()["port"]
    _drained(server)
    for name in ("slow", "fast"):
        r = httpx.put(f"{neutron}/ports/{port['id']}", json={"port": {"name": name}}, timeout=30)
        assert r.status_code == 200, r.text
        if name == "slow":
            assert held.wait(10), "no journal thread sent the update"
    assert httpx.get(f"{neutron}/ports/{port['id']}").json()["port"]["name"] == "fast"
    time.sleep(HOLD)              # the held request has landed by now
    _drained(server)
    held_by = admin.list("/ports", params={"external_id": port["id"]})[0]["name"]
    assert held_by == "fast", f"Neutron's last write is 'fast', fathom holds {held_by!r}"
    booted = (server.dir / "gunicorn.log").read_text().count("Booting worker")
    assert booted == 2, f"{booted} gunicorn workers (each with its journal thread), not 2"


def _drained(server: NeutronServer) -> None:
    deadline = time.monotonic() + 60
    while _unsent(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _unsent(server), f"journal not drained: {_unsent(server)}"


def _unsent(server: NeutronServer) -> int:
    with sqlite3.connect(server.dir / "neutron.db", timeout=30) as db:
        return db.execute("SELECT count(*) FROM fathom_journal WHERE state IN ('pending', 'processing')").fetchone()[0]

