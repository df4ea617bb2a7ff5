"""The controller's HTTP server at rest: no periodic tick, a Date header on every response, and a
shutdown request served at once."""
import email.utils
import signal
import socket
import threading
import time

import httpx
import uvicorn

from uvicorn.protocols.http.h11_impl import H11Protocol

from fathom.controller.server import DateHeader, QuietServer, api_sockets
from fathom.lab.controller import free_port


async def hello(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hi"})


def serve():
    port = free_port()
    server = QuietServer(uvicorn.Config(DateHeader(hello), host="127.0.0.1", port=port, log_level="warning",
                                        lifespan="off", date_header=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{port}"


def test_every_response_has_one_current_date_header_and_a_stop_request_is_served_at_once():
    server, thread, url = serve()
    try:
        r = httpx.get(url)
        dates = [v for k, v in r.headers.multi_items() if k == "date"]
        assert r.text == "hi" and len(dates) == 1
        assert abs(email.utils.parsedate_to_datetime(dates[0]).timestamp() - time.time()) < 2
    finally:
        asked = time.monotonic()
        server.handle_exit(signal.SIGTERM, None)    # as the signal handler does
        thread.join(10)
    assert not thread.is_alive() and time.monotonic() - asked < 2


def test_the_idle_event_loop_sleeps():
    server, thread, _ = serve()
    try:
        ticks = []
        original = server.on_tick

        async def counting(counter):
            ticks.append(counter)
            return await original(counter)
        server.on_tick = counting
        time.sleep(1.5)
        assert ticks == []          # uvicorn's own loop would have ticked 15 times
    finally:
        server.handle_exit(signal.SIGTERM, None)
        thread.join(10)


class NodelayRecorder(H11Protocol):
    """uvicorn's h11 protocol, noting whether each connection it serves has Nagle turned off."""
    seen: list[int] = []

    def connection_made(self, transport) -> None:
        NodelayRecorder.seen.append(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        super().connection_made(transport)


def _nodelay_of_a_served_connection(sockets, loop: str = "uvloop") -> int:
    NodelayRecorder.seen = []
    server = QuietServer(uvicorn.Config(hello, log_level="warning", lifespan="off", http=NodelayRecorder, loop=loop))
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        port = sockets[0].getsockname()[1]
        with httpx.Client() as c:
            assert c.get(f"http://127.0.0.1:{port}/").text == "hi"
            assert c.get(f"http://127.0.0.1:{port}/").text == "hi"     # the same kept-alive connection
    finally:
        server.should_exit = True
        server.handle_exit(signal.SIGTERM, None)
        thread.join(10)
    assert len(NodelayRecorder.seen) == 1
    return NodelayRecorder.seen[0]


def test_the_api_serves_its_connections_with_nagle_off():
    # a response's head and body are two writes: with Nagle on, the body waits for the client's
    # delayed ACK of the head on every call after a connection's first (40 ms on Linux)
    assert _nodelay_of_a_served_connection(api_sockets(["127.0.0.1"], 0)) == 1
    assert _nodelay_of_a_served_connection(api_sockets(["127.0.0.1"], 0), loop="asyncio") == 1
    # the API runs on uvloop, which turns Nagle off on every TCP connection; what asyncio does with
    # a socket made without naming TCP: Nagle stays on
    plain = socket.socket()
    plain.bind(("127.0.0.1", 0))
    assert _nodelay_of_a_served_connection([plain], loop="asyncio") == 0


def test_a_stopping_api_answers_the_agents_held_long_polls_at_once(tmp_path, caplog):
    from fathom.api.app import create_app
    from .auth import headers_for
    app = create_app(f"sqlite:///{tmp_path}/fathom.db", agent_max_wait=30)
    admin = headers_for(app)
    port = free_port()
    server = QuietServer(uvicorn.Config(DateHeader(app), host="127.0.0.1", port=port, log_level="warning",
                                        date_header=False, timeout_graceful_shutdown=20),
                         on_stop=app.state.agent_hub.close)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}/v1"
    assert httpx.post(f"{url}/nodes", headers=admin, json={"name": "c1", "tunnel_ip": "198.18.0.1"},
                      timeout=30).status_code == 201
    agent = headers_for(app, project="admin", roles=("agent",), node="c1")
    rev = httpx.get(f"{url}/agents/c1/desired", headers=agent, timeout=30).json()["revision"]
    got = {}

    def poll():
        got["answer"] = httpx.get(f"{url}/agents/c1/desired", headers=agent, params={"after": rev, "timeout": 25},
                                  timeout=30)
    poller = threading.Thread(target=poll)
    poller.start()
    while app.state.agent_hub._held.get("c1", 0) == 0:
        time.sleep(0.02)      # until the long-poll is held
    asked = time.monotonic()
    server.handle_exit(signal.SIGTERM, None)
    poller.join(10)
    thread.join(10)
    # answered with the revision it had, well before the 20 s the server would wait for it
    assert got["answer"].status_code == 200 and got["answer"].json()["revision"] == rev
    assert not thread.is_alive() and time.monotonic() - asked < 5
    assert "Exception in ASGI application" not in caplog.text and "CancelledError" not in caplog.text
