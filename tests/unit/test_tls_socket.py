"""A switch's TLS connection read by one thread and written by another, as os-ken serves it.

Run against a bare ssl.SSLSocket this exchange ends within a fraction of a second in a spurious
EOF or a corrupted stream on OpenSSL 3; through SerialTLSSocket every byte arrives in order."""
import hashlib
import os
import select
import socket
import ssl
import threading
import time

import pytest

from fathom.controller.channels import server_context
from fathom.controller.tls_socket import SerialTLSSocket
from fathom.pki import CONTROLLER_NAME, Pki

SECONDS = 2.0


@pytest.fixture
def tls_pair(tmp_path):
    """(controller side, switch side) of one TLS connection made with the project's own PKI."""
    pki = Pki(tmp_path / "pki")
    pki.init()
    switch = pki.issue("c1", "node")
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.check_hostname = False
    client_ctx.load_cert_chain(str(switch.cert), str(switch.key))
    client_ctx.load_verify_locations(str(switch.trust))
    a, b = socket.socketpair()
    for s in (a, b):
        s.settimeout(5)
    made = {}
    t = threading.Thread(target=lambda: made.update(
        server=server_context(pki.files(CONTROLLER_NAME)).wrap_socket(a, server_side=True)))
    t.start()
    client = client_ctx.wrap_socket(b)
    t.join(5)
    yield made["server"], client
    client.close()
    made["server"].close()


def test_one_thread_reads_while_another_writes_and_every_byte_arrives_in_order(tls_pair):
    server, client = tls_pair
    conn = SerialTLSSocket(server)
    conn.settimeout(15.0)
    heard, said = hashlib.sha256(), hashlib.sha256()   # what the controller heard / the switch said
    got, sent, problems = [0], [0], []
    said_all = threading.Event()    # the switch has made its last message and handed it all to TLS
    stop = time.monotonic() + SECONDS

    def controller_reads():     # small reads, as os-ken's loop reads message headers
        while True:
            try:
                data = conn.recv(8)
            except socket.timeout:
                continue
            except OSError as e:
                problems.append(f"controller read: {e!r}")
                return
            if not data:
                return
            heard.update(data)
            got[0] += len(data)

    received = hashlib.sha256()

    def switch():
        """One thread, as ovs-vswitchd: a small message every 0.2 ms, and whatever arrives read."""
        client.setblocking(False)
        pending, next_at = b"", 0.0
        while True:
            now = time.monotonic()
            if now < stop and not pending and now >= next_at:
                pending, next_at = os.urandom(64), now + 0.0002
                said.update(pending)
                sent[0] += len(pending)
            elif now >= stop and not pending:
                said_all.set()
            if pending:
                try:
                    pending = pending[client.send(pending):]
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    pass
            try:
                data = client.recv(65536)
            except ssl.SSLWantReadError:
                select.select([client], [], [], 0.0002)
                continue
            except OSError as e:
                problems.append(f"switch read: {e!r}")
                return
            if not data:
                return
            received.update(data)

    threads = [threading.Thread(target=f, daemon=True) for f in (controller_reads, switch)]
    for t in threads:
        t.start()
    written = hashlib.sha256()
    total = 0
    while time.monotonic() < stop:             # the controller's flow mods: large bursts
        burst = os.urandom(200) * 40
        conn.sendall(burst)
        written.update(burst)
        total += len(burst)
    # `sent` is final only once the switch says so: a message it decided on just before `stop` can
    # still be on its way into `sent` after this thread has seen the clock pass `stop`
    deadline = time.monotonic() + 10
    while not (said_all.is_set() and got[0] >= sent[0]) and time.monotonic() < deadline and not problems:
        time.sleep(0.01)
    conn.shutdown(socket.SHUT_WR)
    threads[1].join(10)
    assert not problems
    assert said_all.is_set()
    assert total > 1_000_000 and sent[0] > 10_000, (total, sent[0])
    assert (got[0], heard.hexdigest()) == (sent[0], said.hexdigest())
    assert received.hexdigest() == written.hexdigest()
    assert conn.recv(8) == b""                  # shut down: reads end too


def test_a_read_with_nothing_to_read_times_out_as_on_a_socket(tls_pair):
    conn = SerialTLSSocket(tls_pair[0])
    conn.settimeout(0.2)
    t0 = time.monotonic()
    with pytest.raises(socket.timeout):
        conn.recv(8)
    assert 0.15 < time.monotonic() - t0 < 2


class HeldPoll:
    """select for tls_socket: its polls tell when a thread starts waiting (`waiting`) and when the
    wait returned (`woke`), then hold that thread until `go`."""

    POLLIN, POLLOUT = select.POLLIN, select.POLLOUT

    def __init__(self):
        self.waiting, self.woke, self.go = threading.Event(), threading.Event(), threading.Event()

    def poll(self):
        real, held = select.poll(), self

        class Poller:
            register = real.register

            def poll(self, timeout=None):
                held.waiting.set()
                events = real.poll(timeout)
                held.woke.set()
                held.go.wait(10)
                return events
        return Poller()


@pytest.mark.parametrize("side", ["reader", "writer"])
def test_close_wakes_a_thread_waiting_on_the_socket_and_closes_it_once_that_thread_left(
        tls_pair, monkeypatch, side):
    """A descriptor closed under a thread's poll does not wake it (it would wait out its timeout,
    forever without one), and its number could go to another socket while that thread still waits
    on it: close shuts the connection down (the wait ends) and leaves the socket open until the
    thread is out of its wait."""
    from fathom.controller import tls_socket
    held = HeldPoll()
    monkeypatch.setattr(tls_socket, "select", held)
    server = tls_pair[0]
    conn = SerialTLSSocket(server)
    conn.settimeout(30.0)
    fd, ended = conn.fileno(), []

    def wait():     # the switch sends nothing and reads nothing: a read or a large write waits
        try:
            ended.append(conn.recv(8) if side == "reader" else conn.sendall(b"x" * 50_000_000))
        except OSError as e:
            ended.append(e)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    try:
        assert held.waiting.wait(10)
        conn.close()
        assert held.woke.wait(2), "close did not wake the waiting thread"
        os.fstat(fd)        # still open: its number is not free for another socket yet
        assert server.fileno() == fd
    finally:
        held.go.set()
    thread.join(5)
    assert not thread.is_alive()
    assert ended == [b""] if side == "reader" else isinstance(ended[0], BrokenPipeError), ended
    assert server.fileno() == -1        # closed by the thread that left its wait last
