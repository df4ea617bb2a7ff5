"""The API's connection guard (fathom.api.connections) on a real uvicorn server on loopback:
clients from distinct 127.0.0.x addresses are distinct sources."""
from __future__ import annotations

import resource
import socket
import subprocess
import sys
import threading
import time

import pytest
import uvicorn

from fathom.api import create_app
from fathom.api.connections import ConnectionLimits, Gate, Guard, source_of
from fathom.lab.controller import free_port

from .auth import headers_for


class Server:
    def __init__(self, tmp_path, limits: ConnectionLimits):
        self.app = create_app(f"sqlite:///{tmp_path / 'c.db'}")
        self.token = headers_for(self.app)["Authorization"]
        self.guard = Guard(limits)
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(Gate(self.app, self.guard), host="127.0.0.1", port=self.port,
                                                    http=self.guard.protocol, log_level="error", lifespan="off",
                                                    timeout_keep_alive=30, proxy_headers=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)

    def connect(self, source: str) -> socket.socket:
        sock = socket.socket()
        sock.settimeout(5)
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", self.port))
        return sock

    def get(self, sock: socket.socket, token: str | None = None, path: str = "/v1/networks", extra: str = "") -> bytes:
        auth = f"Authorization: {token}\r\n" if token else ""
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}{extra}\r\n".encode())
        return answer(sock)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)
        self.app.state.engine.dispose()


def answer(sock: socket.socket) -> bytes:
    """One response (head and Content-Length body), or what came before the connection closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def closed(sock: socket.socket, within: float = 2.0) -> bool:
    """The server closed `sock` (it sent nothing first) within `within` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.fixture
def serve(tmp_path, monkeypatch):
    servers = []

    def start(body_timeout: float = 10.0, **kw):
        monkeypatch.setenv("FATHOM_API_BODY_TIMEOUT", str(body_timeout))
        servers.append(Server(tmp_path, ConnectionLimits(**kw)))
        return servers[-1]
    yield start
    for s in servers:
        s.stop()


def test_one_source_is_served_its_share_and_its_excess_is_held(serve):
    """Half-open connections from one source: beyond its limit new ones are held, unread and not
    closed (closing makes a reconnecting host churn); the oldest held is served when one of the
    source's served connections closes; a held one is closed at the hold deadline. Another source
    is served at once, and nothing answers 503."""
    srv = serve(per_source=4, max_connections=100, hold_timeout=3.0)
    attacker = [srv.connect("127.0.0.2") for _ in range(10)]
    for sock in attacker:
        sock.sendall(b"GET /v1/networks HTTP/1.1\r\nHost: x\r\n")        # a head never finished
    deadline = time.monotonic() + 5
    while srv.guard.counts["held"] < 6 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.guard.stats()["open"] == 4 and srv.guard.stats()["held_now"] == 6
    assert not any(closed(s, 0.1) for s in attacker)
    with srv.connect("127.0.0.3") as sock:
        for _ in range(3):                                               # kept alive, never shed
            assert srv.get(sock, srv.token).startswith(b"HTTP/1.1 200")
    attacker[0].close()                                                  # a served one goes: the oldest held is served
    held = attacker[4]
    held.sendall(f"Authorization: {srv.token}\r\n\r\n".encode())     # its head finished
    assert answer(held).startswith(b"HTTP/1.1 200")
    assert srv.guard.stats()["open"] == 4 and srv.guard.stats()["held_now"] == 5
    assert all(closed(s, 4.0) for s in attacker[5:])                    # held past the deadline: closed
    assert srv.guard.counts["hold_timeouts"] == 5 and srv.guard.stats()["held_now"] == 0
    for s in attacker:
        s.close()


def test_held_connections_are_bounded(serve):
    """Beyond `max_held` held connections, a new excess one is closed at once."""
    srv = serve(per_source=2, max_connections=100, max_held=3)
    conns = [srv.connect("127.0.0.2") for _ in range(7)]
    assert all(closed(s) for s in conns[5:]) and not any(closed(s, 0.1) for s in conns[:5])
    assert srv.guard.stats()["held_now"] == 3 and srv.guard.counts["refused"] == 2
    for s in conns:
        s.close()


def test_at_the_total_limit_unauthenticated_waiting_connections_go_first(serve):
    srv = serve(per_source=100, max_connections=6)
    agent = srv.connect("127.0.0.3")
    assert srv.get(agent, srv.token).startswith(b"HTTP/1.1 200")        # idle now, and authenticated
    others = [srv.connect(f"127.0.0.{10 + i}") for i in range(12)]      # 12 sources, half-open
    deadline = time.monotonic() + 5
    while srv.guard.counts["shed"] < 7 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.guard.stats()["open"] == 6 and srv.guard.counts["shed"] == 7
    assert all(closed(s) for s in others[:7]) and not any(closed(s, 0.1) for s in others[7:])
    assert srv.get(agent, srv.token).startswith(b"HTTP/1.1 200")        # the authenticated idle one stayed
    # only authenticated idle connections left to shed: the oldest of them goes for a newcomer
    for s in others[7:]:
        assert srv.get(s, srv.token).startswith(b"HTTP/1.1 200")
    newcomer = srv.connect("127.0.0.30")
    assert closed(agent) and srv.get(newcomer, srv.token).startswith(b"HTTP/1.1 200")
    for s in [agent, newcomer, *others]:
        s.close()


def test_serving_connections_are_never_shed_and_bodies_have_a_deadline(serve):
    """Two authenticated bodies trickled a byte every 0.3 s fill the server: a third connection is
    refused at once, not the bodies; each body gets 408 at its deadline (2 s), not per chunk."""
    srv = serve(per_source=100, max_connections=2, body_timeout=2.0)
    slow = [srv.connect(f"127.0.0.{4 + i}") for i in range(2)]
    t0 = time.monotonic()
    for sock in slow:
        sock.sendall(f"POST /v1/networks HTTP/1.1\r\nHost: x\r\nAuthorization: {srv.token}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode())
    time.sleep(0.3)
    late = srv.connect("127.0.0.9")
    assert closed(late, 1.0) and srv.guard.counts["refused"] == 1
    answers = [b"", b""]
    while not all(answers) and time.monotonic() - t0 < 5:
        for i, sock in enumerate(slow):
            if not answers[i]:
                try:
                    sock.sendall(b" ")
                    sock.settimeout(0.15)
                    answers[i] = sock.recv(65536)
                except TimeoutError:
                    pass
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers
    assert 1.8 < time.monotonic() - t0 < 6
    for s in [late, *slow]:
        s.close()


def test_requests_without_a_valid_token(serve):
    """Answered 401 before their body is read (the connection closed), at most `burst` at once per
    source (then 429 with Retry-After); a source's known token is served regardless."""
    srv = serve(source_rate=1, source_burst=3)
    with srv.connect("127.0.0.5") as sock:
        assert srv.get(sock, srv.token).startswith(b"HTTP/1.1 200")     # the token is verified (and known) now
    for token in (None, "Bearer fth_forged", None):
        with srv.connect("127.0.0.5") as sock:
            sock.sendall(f"POST /v1/networks HTTP/1.1\r\nHost: x\r\n{'Authorization: ' + token + chr(13) + chr(10) if token else ''}"
                         "Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{".encode())
            reply = answer(sock)
            assert reply.startswith(b"HTTP/1.1 401") and b"connection: close" in reply.lower() and closed(sock)
    with srv.connect("127.0.0.5") as sock:
        reply = srv.get(sock)
        assert reply.startswith(b"HTTP/1.1 429") and b"retry-after: 1" in reply.lower(), reply
    with srv.connect("127.0.0.5") as sock:
        assert srv.get(sock, srv.token).startswith(b"HTTP/1.1 200")
    with srv.connect("127.0.0.6") as sock:                                # another source has its own bucket
        assert srv.get(sock, path="/openapi.json").startswith(b"HTTP/1.1 200")
    assert srv.guard.counts["unauthenticated"] == 3 and srv.guard.counts["rate_limited"] == 1


def test_forwarded_for_only_from_a_trusted_proxy(serve):
    srv = serve(source_rate=0.01, source_burst=1, trusted_proxies=frozenset({"127.0.0.7"}))
    for source, forwarded, status in (("127.0.0.7", "198.18.0.1", b"401"), ("127.0.0.7", "198.18.0.2", b"401"),
                                      ("127.0.0.7", "198.18.0.1", b"429"), ("127.0.0.8", "198.18.0.3", b"401"),
                                      ("127.0.0.8", "198.18.0.4", b"429")):
        with srv.connect(source) as sock:
            reply = srv.get(sock, extra=f"X-Forwarded-For: {forwarded}\r\n")
            assert reply.startswith(b"HTTP/1.1 " + status), (source, forwarded, reply[:100])


@pytest.mark.parametrize("head, status", [
    (b"GET /v1/networks HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n", b"431"),
    (b"GET /v1/networks HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"b" * 1000) for i in range(70))
     + b"\r\n", b"431"),
    (b"GET /v1/networks HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 60_000 + b"\r\n", b"200"),
    # a header value that never ends: refused once the head passes the limit, not kept in memory
    (b"GET /v1/networks HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 200_000, b"431"),
])
def test_heads_over_64_kib_are_refused_even_sent_whole(serve, head, status):
    srv = serve()
    with srv.connect("127.0.0.1") as sock:
        if status == b"200":
            head += f"Authorization: {srv.token}\r\n\r\n".encode()
        sock.sendall(head)
        reply = answer(sock)
        assert reply.startswith(b"HTTP/1.1 " + status), reply[:200]
        assert status == b"200" or closed(sock)


def test_a_source_is_an_address_or_an_ipv6_64():
    assert source_of("198.18.0.1") == "198.18.0.1" and source_of("::ffff:198.18.0.1") == "198.18.0.1"
    assert source_of("2001:db8:0:1::5") == source_of("2001:db8:0:1:ffff::9") == "2001:db8:0:1::/64"
    assert source_of("2001:db8:0:2::5") != source_of("2001:db8:0:1::5")



def test_the_open_files_soft_limit_is_raised_to_the_hard_one():
    code = ("import resource; from fathom.api.connections import raise_open_files; "
            "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE); "
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)); "
            "print(raise_open_files(), *resource.getrlimit(resource.RLIMIT_NOFILE))")
    raised, soft, hard = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                                 check=True).stdout.split())
    assert raised == soft > 256 and (soft == hard or hard == resource.RLIM_INFINITY)


def test_a_response_goes_out_in_one_write(serve, monkeypatch):
    """uvicorn writes a response's head and its body apart: the guarded protocol sends them in one
    write (one send, one segment to the client). A 100 Continue still goes out before the body is
    read; a HEAD response (uvicorn writes no body) is its head alone, at once."""
    from fathom.api import connections
    writes: list[bytes] = []

    class Recorder:
        def __init__(self, transport):
            self.transport = transport

        def write(self, data):
            writes.append(bytes(data))
            self.transport.write(data)

        def __getattr__(self, name):
            return getattr(self.transport, name)

    class Recorded(connections.OneWrite):
        def __init__(self, transport):
            super().__init__(Recorder(transport))
    monkeypatch.setattr(connections, "OneWrite", Recorded)
    s = serve()
    sock = s.connect("127.0.0.1")
    got = s.get(sock, s.token)
    assert got.startswith(b"HTTP/1.1 200 ") and writes == [got]
    writes.clear()
    got = s.get(sock, s.token, path="/v1/networks/12345")
    assert got.startswith(b"HTTP/1.1 404 ") and writes == [got]
    writes.clear()
    body = b'{"name": "n1", "type": "vxlan"}'
    sock.sendall(b"POST /v1/networks HTTP/1.1\r\nHost: x\r\nAuthorization: " + s.token.encode() +
                 b"\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
    assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
    sock.sendall(body)
    got = answer(sock)
    assert got.startswith(b"HTTP/1.1 201 ") and writes == [b"HTTP/1.1 100 Continue\r\n\r\n", got]
    writes.clear()
    sock.sendall(f"HEAD /v1/networks HTTP/1.1\r\nHost: x\r\nAuthorization: {s.token}\r\n\r\n".encode())
    assert sock.recv(65536).startswith(b"HTTP/1.1 ") and writes == []
    sock.close()
