"""The agent's HTTP client (fathom.agent.http) against a real HTTP/1.1 server on loopback: JSON both
ways over one kept-alive connection, a new connection when the server closed the idle one, a
request in progress cut short by `abort` (how a stopping agent ends its long-poll), and transport
failures as ConnectionError."""
from __future__ import annotations

import http.server
import json
import socketserver
import threading
import time

import pytest

from fathom.agent.http import JsonClient


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    connections: set = set()

    def _answer(self, status: int, body: dict | None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        type(self).connections.add(self.client_address)
        if self.path.startswith("/api/slow"):
            time.sleep(5)
        if self.path.startswith("/api/close"):   # answers, then closes the kept-alive connection
            self.close_connection = True
        self._answer(200, {"path": self.path, "auth": self.headers.get("Authorization")})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self._answer(201, {"got": body, "type": self.headers.get("Content-Type")})

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _Handler.connections = set()
    yield f"http://127.0.0.1:{srv.server_address[1]}/api"
    srv.shutdown()
    srv.server_close()


def test_json_both_ways_on_one_connection(server):
    c = JsonClient(server, headers={"Authorization": "Bearer t"})
    r = c.get("/x", params={"after": 3, "timeout": 55.0, "none": None})
    assert r.status_code == 200 and r.json() == {"path": "/api/x?after=3&timeout=55.0", "auth": "Bearer t"}
    r = c.post("/y", json={"k": [1, 2]})
    assert r.status_code == 201 and r.json() == {"got": {"k": [1, 2]}, "type": "application/json"}
    assert len(_Handler.connections) == 1      # kept alive
    c.close()


def test_a_connection_the_server_closed_is_replaced(server):
    c = JsonClient(server)
    assert c.get("/close").status_code == 200
    assert c.get("/after").json()["path"] == "/api/after"
    assert len(_Handler.connections) == 2


def test_abort_cuts_a_request_short_and_the_next_one_works(server):
    c = JsonClient(server)
    c.get("/warm")
    threading.Timer(0.3, c.abort).start()
    t0 = time.monotonic()
    with pytest.raises(ConnectionError):
        c.get("/slow", timeout=10)
    assert time.monotonic() - t0 < 3      # not the server's 5 s, and not sent again
    assert c.get("/next").status_code == 200


def test_transport_failures_are_connection_errors():
    with pytest.raises(ConnectionError, match="refused"):
        JsonClient("http://127.0.0.1:9", timeout=2).get("/x")
    with pytest.raises(ValueError):
        JsonClient("ftp://example.org")
