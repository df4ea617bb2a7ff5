"""The OpenFlow admission rules (fathom.controller.ofgate): which identity may claim which datapath
id, the store's expectations, and that a live session is never handed to a newcomer."""
import contextlib
import socket
import threading
import time
import warnings

import pytest
from os_ken.controller.handler import DEAD_DISPATCHER, MAIN_DISPATCHER

from fathom.controller.ofgate import Gate, GatedDatapath, Sessions, echo_probe, expected_from_store, identity_problem
from fathom.model import datapath_id, datapath_id_phy, datapath_id_fabric
from fathom.pki import Identity
from fathom.store.db import open_store, session_factory

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from fathom.api import create_app  # noqa: E402

from .auth import headers_for  # noqa: E402

C1, C1_PHY, C2, FABRIC_SWITCH = datapath_id(1), datapath_id_phy(1), datapath_id(2), datapath_id_fabric(1)
EXPECTED = {("node", "c1"): {C1, C1_PHY}, ("node", "c2"): {C2}, ("switch", "tor1"): {FABRIC_SWITCH}}


def expected(identity):
    if identity is None:
        return set().union(*EXPECTED.values())
    return EXPECTED.get((identity.kind, identity.name), set())


@pytest.mark.parametrize("claimed,identity,tls,problem", [
    (C1, Identity("node", "c1"), True, None),
    (C1_PHY, Identity("node", "c1"), True, None),
    (C1, Identity("node", "c1", frozenset({C1, C1_PHY})), True, None),
    (C1, Identity("node", "c2"), True, "not one the controller expects of node 'c2'"),
    (FABRIC_SWITCH, Identity("node", "c1"), True, "not one the controller expects of node 'c1'"),
    (C1, Identity("switch", "c1"), True, "not one the controller expects of switch 'c1'"),
    (C1, Identity("node", "unregistered"), True, "not one the controller expects"),
    (C1_PHY, Identity("node", "c1", frozenset({C1})), True, "not bound in the certificate"),
    (C1, Identity("controller", "controller"), True, "does not identify a switch"),
    (C1, None, True, "no client certificate"),
    (C1, None, False, None),
    (0x1234, None, False, "not one the controller expects of a plain TCP connection"),
])
def test_identity_rules(claimed, identity, tls, problem):
    got = identity_problem(claimed, identity, tls, expected)
    assert (got is None) if problem is None else (problem in got), got


def test_expected_datapath_ids_come_from_the_store(db_url):
    app = create_app(db_url)
    http = TestClient(app, headers=headers_for(app))
    n1 = http.post("/v1/nodes", json={"name": "c1", "tunnel_ip": "10.0.0.1", "management_ip": "10.1.0.1"}).json()
    n2 = http.post("/v1/nodes", json={"name": "c2", "tunnel_ip": "10.0.0.2", "management_ip": "10.1.0.2"}).json()
    sw = http.post("/v1/fabric/switches", json={"name": "tor1", "management_ip": "10.1.0.9"}).json()
    got = expected_from_store(session_factory(open_store(db_url)))
    assert got(Identity("node", "c1")) == {datapath_id(n1["id"]), datapath_id_phy(n1["id"])}
    assert got(Identity("node", "c2")) == {datapath_id(n2["id"]), datapath_id_phy(n2["id"])}
    assert got(Identity("switch", "tor1")) == {datapath_id_fabric(sw["id"])}
    # kinds do not mix: a node certificate named like the switch gets nothing, and the reverse
    assert got(Identity("node", "tor1")) == set() and got(Identity("switch", "c1")) == set()
    assert got(Identity("node", "gone")) == set()
    assert got(None) == {datapath_id(n1["id"]), datapath_id_phy(n1["id"]), datapath_id(n2["id"]),
                         datapath_id_phy(n2["id"]), datapath_id_fabric(sw["id"])}


class Conn:
    """Stands for an os-ken Datapath: what the session table reads of one."""

    def __init__(self, name, dpid=None):
        self.name, self.id, self.state, self.is_active = name, dpid, MAIN_DISPATCHER, True
        self.closed = False

    def close(self):
        self.closed, self.state = True, DEAD_DISPATCHER


class Table:
    """A session table whose holders answer echo or not, as told."""

    def __init__(self, probe_delay: float = 0.0):
        self.answers: dict[str, bool] = {}
        self.probed: list[str] = []
        self.probe_delay = probe_delay
        self.sessions = Sessions(self._probe, lambda c: c.close())

    def _probe(self, conn):
        self.probed.append(conn.name)
        time.sleep(self.probe_delay)
        return self.answers.get(conn.name, True)


def test_first_claim_wins_and_a_live_holder_keeps_its_datapath_id():
    t = Table()
    real, rogue = Conn("real", C1), Conn("rogue")
    assert t.sessions.claim(C1, real) is None
    problem = t.sessions.claim(C1, rogue)
    assert "held by a live session" in problem
    assert t.probed == ["real"] and not real.closed and t.sessions.held[C1] is real


def test_a_holder_that_fails_its_echo_is_closed_and_replaced():
    t = Table()
    stale, fresh = Conn("stale", C1), Conn("fresh")
    t.sessions.claim(C1, stale)
    t.answers["stale"] = False
    assert t.sessions.claim(C1, fresh) is None
    assert stale.closed and t.sessions.held[C1] is fresh


def test_a_dead_holder_is_replaced_without_a_probe():
    t = Table()
    old, new = Conn("old", C1), Conn("new")
    t.sessions.claim(C1, old)
    old.state = DEAD_DISPATCHER
    assert t.sessions.claim(C1, new) is None and t.probed == []


def test_release_frees_the_id_only_for_its_holder():
    t = Table()
    real, other = Conn("real", C1), Conn("other", C1)
    t.sessions.claim(C1, real)
    t.sessions.release(other)
    assert t.sessions.held[C1] is real
    t.sessions.release(real)
    assert C1 not in t.sessions.held
    assert t.sessions.claim(C1, other) is None and t.probed == []


def test_a_second_claim_while_one_is_being_probed_is_refused():
    t = Table(probe_delay=0.3)
    t.sessions.claim(C1, Conn("real", C1))
    results = {}
    first = threading.Thread(target=lambda: results.setdefault("a", t.sessions.claim(C1, Conn("a"))))
    first.start()
    time.sleep(0.1)
    results["b"] = t.sessions.claim(C1, Conn("b"))
    first.join()
    assert "already being claimed" in results["b"]
    assert "held by a live session" in results["a"]
    assert t.probed == ["real"]


def test_ids_are_independent():
    t = Table()
    assert t.sessions.claim(C1, Conn("c1", C1)) is None
    assert t.sessions.claim(C2, Conn("c2", C2)) is None
    assert t.probed == []


class Recorder:
    """Stands for os-ken's event bus behind the gate: records the events a connection sends."""

    def __init__(self):
        self.events = []

    def send_event_to_observers(self, ev, state=None):
        self.events.append((type(ev).__name__, state))

    def get_handlers(self, ev, state=None):
        return []


def _connection(echo_interval: float = 30.0, unreplied: int = 3):
    """A GatedDatapath serving one end of a real TCP connection on loopback; returns it and the
    switch's end."""
    server = socket.create_server(("127.0.0.1", 0))
    switch_end = socket.create_connection(server.getsockname())
    ours, _ = server.accept()
    server.close()
    dp = GatedDatapath(ours, ("127.0.0.1", 0), Gate(False, lambda identity: set()))
    dp.ofp_brick._brick = Recorder()
    dp.echo_request_interval, dp.max_unreplied_echo_requests = echo_interval, unreplied
    threading.Thread(target=dp.serve, daemon=True).start()
    assert switch_end.recv(8)[1:2] != b""           # our hello
    return dp, switch_end


def _wait(predicate, timeout: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.005)
    return None


def test_a_connection_the_switch_closes_is_dead_at_once():
    # os-ken's native hub would notice only at the next echo tick (30 s here): a switch that
    # reconnects at once would wait for the gate's probe of its own dead session
    dp, switch_end = _connection(echo_interval=30.0)
    switch_end.close()
    took = _wait(lambda: dp.state == DEAD_DISPATCHER, 2.0)
    assert took is not None, "the closed connection still counts as alive"
    assert ("EventOFPStateChange", DEAD_DISPATCHER) in dp.ofp_brick._brick.events


def test_the_echo_probe_ends_when_the_holder_dies():
    dp, switch_end = _connection()
    answer = {}
    probe = threading.Thread(target=lambda: answer.setdefault("alive", echo_probe(dp, timeout=5.0)))
    started = time.monotonic()
    probe.start()
    time.sleep(0.1)
    switch_end.close()                              # never answers: it goes away
    probe.join(6.0)
    assert answer == {"alive": False} and time.monotonic() - started < 2.0


def _tls_connection(tmp_path):
    """As `_connection`, over TLS (the project's own PKI; os-ken's end a SerialTLSSocket, as the
    controller's listener makes it)."""
    import ssl

    from fathom.controller.channels import server_context
    from fathom.controller.tls_socket import SerialTLSSocket
    from fathom.pki import CONTROLLER_NAME, Pki
    pki = Pki(tmp_path / "pki")
    pki.init()
    node = pki.issue("c1", "node")
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.check_hostname = False
    client_ctx.load_cert_chain(str(node.cert), str(node.key))
    client_ctx.load_verify_locations(str(node.trust))
    server = socket.create_server(("127.0.0.1", 0))
    made = {}
    t = threading.Thread(target=lambda: made.update(
        ours=server_context(pki.files(CONTROLLER_NAME)).wrap_socket(server.accept()[0], server_side=True)))
    t.start()
    switch_end = client_ctx.wrap_socket(socket.create_connection(server.getsockname()))
    t.join(5)
    server.close()
    dp = GatedDatapath(SerialTLSSocket(made["ours"]), ("127.0.0.1", 0), Gate(True, lambda identity: set()))
    dp.ofp_brick._brick = Recorder()
    threading.Thread(target=dp.serve, daemon=True).start()
    assert switch_end.recv(8)[1:2] != b""           # our hello
    return dp, switch_end


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_a_switch_that_stopped_reading_holds_a_sender_no_longer_than_the_send_wait(tls, tmp_path):
    """The switch's end reads nothing: the socket's buffers fill, the write under way blocks, the
    send queue fills behind it. The next send waits `send_wait` for room, not until the socket
    timeout (15 s in the controller), and the connection is closed (the apps hear it dead)."""
    dp, switch_end = _tls_connection(tmp_path) if tls else _connection()
    dp.socket.settimeout(15.0)            # the controller's (fathom.controller.ofapp.ECHO_INTERVAL)
    dp.send_wait = 0.5
    queued = []

    def sender():
        while dp.send(b"\0" * (1 << 20)):
            queued.append(1)
    t = threading.Thread(target=sender, daemon=True)
    t.start()
    t.join(10.0)
    try:
        assert not t.is_alive(), f"a send still waits, {len(queued)} MiB queued"
        assert dp.state == DEAD_DISPATCHER
        assert ("EventOFPStateChange", DEAD_DISPATCHER) in dp.ofp_brick._brick.events
        assert _wait(lambda: dp.send_q is None, 2.0) is not None   # the write under way ended too
        assert not dp.send(b"more")       # a closed connection takes nothing, at once
    finally:
        switch_end.close()


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_a_switch_that_reads_slowly_is_waited_for_as_long_as_it_reads(tls, tmp_path):
    """The switch's end reads, slowly (a big replay to a busy switch): one big message takes several
    send waits to write, and the send queue is full behind it. The sends wait while the write goes
    on, the connection stays up and the switch gets everything, in order."""
    dp, switch_end = _tls_connection(tmp_path) if tls else _connection()
    dp.socket.settimeout(15.0)
    dp.send_wait = 0.3
    # small socket buffers, so the big message is written as fast as the switch reads it
    dp.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    switch_end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    messages = [b"\1" * (2 << 20)] + [bytes([2 + i]) * 100 for i in range(20)]
    got = bytearray()

    def reader():
        while len(got) < sum(map(len, messages)):
            chunk = switch_end.recv(16384)
            if not chunk:
                return
            got.extend(chunk)
            time.sleep(0.01)      # some 1.6 MB/s at most: the big message takes more than a second
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    started = time.monotonic()
    try:
        sent = [dp.send(m) for m in messages]
        waited = time.monotonic() - started
        t.join(10.0)
        assert sent == [True] * len(messages) and dp.state != DEAD_DISPATCHER
        assert waited > 2 * dp.send_wait      # the last sends did wait for the big write
        assert bytes(got) == b"".join(messages)
    finally:
        switch_end.close()


# ------------------------------------------------------------------------------- keepalive

class _Conn:
    """What GatedDatapath's keepalive uses of a connection: the switch's last word, the sends."""

    def __init__(self, interval: float, unreplied: int = 3, quiet: bool = False, quiet_interval: float = 35.0):
        from types import SimpleNamespace

        from os_ken.ofproto import ofproto_v1_3_parser
        self.echo_request_interval, self.max_unreplied_echo_requests = interval, unreplied
        self.id, self.gate, self.quiet_echo_interval = 1, SimpleNamespace(quiet=lambda dpid: quiet), quiet_interval
        self.ofproto_parser, self.address = ofproto_v1_3_parser, ("198.18.0.1", 1)
        self.heard_at, self._echo_at, self._ended = time.monotonic(), 0.0, threading.Event()
        self.send_q = object()
        self.echoes: list[float] = []
        self.closed_at: float | None = None

    def send_msg(self, msg):
        self.echoes.append(time.monotonic())

    def close(self):
        self.closed_at = time.monotonic()

    def _echo_interval(self) -> float:
        from fathom.controller.ofgate import GatedDatapath
        return GatedDatapath._echo_interval(self)

    def keepalive(self) -> threading.Thread:
        from fathom.controller.ofgate import GatedDatapath
        t = threading.Thread(target=GatedDatapath._echo_request_loop, args=(self,), daemon=True)
        t.start()
        return t


def test_a_switch_heard_within_the_interval_gets_no_echo():
    conn = _Conn(1.0)
    t = conn.keepalive()
    for _ in range(15):             # the switch answers something (a flow count) every 0.1 s
        time.sleep(0.1)
        conn.heard_at = time.monotonic()
    conn._ended.set()
    t.join(2)
    assert not t.is_alive() and conn.echoes == [] and conn.closed_at is None


def test_a_silent_switch_is_asked_each_interval_and_dropped_after_the_unanswered_echoes():
    conn = _Conn(0.3, unreplied=3)
    start = conn.heard_at
    t = conn.keepalive()
    t.join(5)
    assert not t.is_alive()
    assert len(conn.echoes) == 3, conn.echoes
    assert conn.echoes[0] - start >= 0.29
    assert all(b - a >= 0.29 for a, b in zip(conn.echoes, conn.echoes[1:])), conn.echoes
    assert conn.closed_at is not None and conn.closed_at - start >= 1.19


def test_an_answer_resets_the_count():
    conn = _Conn(0.3, unreplied=3)
    t = conn.keepalive()
    time.sleep(0.7)                 # echoes unanswered, then the switch answers
    answered = conn.heard_at = time.monotonic()
    before = len(conn.echoes)
    t.join(5)
    assert before >= 1
    assert conn.closed_at is not None and conn.closed_at - answered >= 1.19
    assert len([e for e in conn.echoes if e > answered]) == 3


def test_a_quiet_connection_is_asked_once_after_the_longer_interval_and_dropped_after_the_same_silence():
    """A switch this replica does not master (Gate.quiet): no echo before the quiet interval, so a
    switch that probes its controllers (OVS: every 30 s) is heard first; dead after the same
    silence as any connection ((unreplied + 1) echo intervals)."""
    conn = _Conn(0.2, unreplied=3, quiet=True, quiet_interval=0.5)
    start = conn.heard_at
    t = conn.keepalive()
    t.join(5)
    assert not t.is_alive()
    assert len(conn.echoes) == 1 and conn.echoes[0] - start >= 0.49, [e - start for e in conn.echoes]
    assert conn.closed_at is not None and 0.79 <= conn.closed_at - start < 1.2, conn.closed_at - start


def test_a_quiet_connection_whose_switch_probes_gets_no_echo():
    conn = _Conn(0.2, unreplied=3, quiet=True, quiet_interval=0.5)
    t = conn.keepalive()
    for _ in range(12):             # the switch's own probe every 0.3 s, answered (heard)
        time.sleep(0.3)
        conn.heard_at = time.monotonic()
    conn._ended.set()
    t.join(2)
    assert not t.is_alive() and conn.echoes == [] and conn.closed_at is None


def test_the_keepalive_ends_with_the_connection():
    conn = _Conn(30.0)
    t = conn.keepalive()
    conn._ended.set()
    t.join(1)
    assert not t.is_alive() and conn.closed_at is None   # the connection closed itself


def test_every_message_from_the_switch_counts_as_heard():
    from types import SimpleNamespace

    from fathom.controller.ofgate import _GatedBrick
    seen = []
    dp = SimpleNamespace(heard_at=0.0)
    brick = _GatedBrick(SimpleNamespace(send_event_to_observers=lambda ev, state: seen.append(ev)), dp, gate=None)
    brick.admitted = True
    brick.send_event_to_observers(SimpleNamespace(msg=None))        # no message: a state change
    assert dp.heard_at == 0.0
    brick.send_event_to_observers(SimpleNamespace(msg=object()))
    assert dp.heard_at > 0 and len(seen) == 2


def test_a_switch_that_stops_answering_is_sent_echoes_and_dropped():
    dp, switch_end = _connection(echo_interval=0.2, unreplied=3)
    took = _wait(lambda: dp.state == DEAD_DISPATCHER, 3.0)
    assert took is not None and took >= 0.6, took
    switch_end.settimeout(1.0)
    got = b""
    with contextlib.suppress(OSError):
        while chunk := switch_end.recv(4096):
            got += chunk
    types = []
    while len(got) >= 8:                      # OpenFlow headers: version, type, length, xid
        types.append(got[1])
        got = got[int.from_bytes(got[2:4], "big"):]
    assert types.count(2) == 3, types         # OFPT_ECHO_REQUEST, three times, none answered
