"""Who may hold a datapath id: the admission rules for OpenFlow connections.

A switch names its datapath id in its features reply. Before os-ken or any app hears of that id,
the gate decides:

1. Identity: over TLS the connection's certificate (signed by the switch CA, checked in the TLS
   handshake) names a node or fabric switch; the claimed datapath id must be one the controller
   expects for that holder (from the store: br-int and br-phy of that node, or that fabric switch),
   and one the certificate binds when it binds any. Over plain TCP (only with --insecure) there is
   no identity: the id must merely be one the controller expects of some switch.
2. One session per datapath id: while a connection holds the id and answers echo, a new
   connection claiming the same id is refused. The holder is sent an echo request at once; only
   if it does not answer within `probe_timeout` is it closed and the newcomer admitted. A rogue
   that claims a node's id never replaces the real switch, and so never receives its flow table
   nor can answer its changes with errors.

A refused connection is closed before any app sees its datapath id: no session, no events.
The os-ken wiring (`GatedListener`) replaces os-ken's own OpenFlow listener so that every
connection, TLS or plain, goes through `Gate.admit`.
"""
from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from typing import Callable

from cryptography import x509
from os_ken.base import app_manager  # noqa: F401 - os-ken's modules import cleanly only after this one
from os_ken.controller import ofp_event
from os_ken.controller.controller import Datapath, OpenFlowController
from os_ken.controller.handler import DEAD_DISPATCHER
from os_ken.lib import hub

from fathom.controller.tls_socket import SerialTLSSocket
from fathom.pki import Identity, PkiError, identity_of

LOG = logging.getLogger("fathom.openflow.gate")
HANDSHAKE_TIMEOUT = 10.0
# Seconds of silence before a quiet connection (Gate.quiet) is sent an echo request: longer than
# the switches' own probe (fathom.controller.bootstrap.CONTROLLER_PROBE_MS, 30 s), which OVS sends
# a controller it heard nothing from, so such a connection costs one echo every 30 s (the switch's,
# answered) instead of one every fathom.controller.ofapp.ECHO_INTERVAL (ours); still dropped after
# the same silence as any other (60 s).
QUIET_ECHO_INTERVAL = 35.0
# How long a send waits for room in a connection's send queue (os-ken's: 16 messages, behind the one
# being written) while the connection's send loop writes nothing. A queue full with nothing written
# for this long is a switch that stopped reading (its socket's buffers full, the write under way
# blocked): its connection is closed, as the keepalive closes a silent one, and the switch is
# reconciled in full when it connects again. A switch that reads, however slowly (a big replay to a
# busy switch), is waited for as long as it reads. Without the bound, whoever sends to a switch that
# stopped reading waits for os-ken's socket timeout (fathom.controller.ofapp.ECHO_INTERVAL, 15 s): a
# pass, or os-ken's ofctl service, whose one thread carries every switch's reads and barriers.
# Shorter than fathom.controller.switch.REPLY_WAIT, so that a request to another switch that waited
# behind such a send is still answered within its wait.
SEND_WAIT = 1.0
# Bytes the send loop hands the socket at a time: between them it marks that it wrote (what SEND_WAIT
# measures), so a write of a big message to a switch that reads slowly is seen progressing.
SEND_CHUNK = 64 * 1024

# identity (None: no TLS) -> the datapath ids it may claim
Expected = Callable[[Identity | None], set[int]]


def identity_problem(claimed: int, identity: Identity | None, tls: bool, expected: Expected) -> str | None:
    """Why `identity` may not claim datapath id `claimed`, or None if it may."""
    if tls and identity is None:
        return "no client certificate"
    if identity is not None and identity.kind == "controller":
        return "a controller certificate does not identify a switch"
    who = f"{identity.kind} {identity.name!r}" if identity else "a plain TCP connection"
    if claimed not in expected(identity):
        return f"datapath id {claimed:016x} is not one the controller expects of {who}"
    if identity is not None and identity.dpids and claimed not in identity.dpids:
        return f"datapath id {claimed:016x} is not bound in the certificate of {who}"
    return None


def _alive(dp) -> bool:
    return getattr(dp, "is_active", True) and dp.state != DEAD_DISPATCHER


class Sessions:
    """The connection holding each datapath id; a live holder keeps it."""

    def __init__(self, probe: Callable[[object], bool], close: Callable[[object], None]):
        self.probe = probe      # send the holder an echo: True if it answered
        self.close = close
        self.lock = threading.Lock()
        self.held: dict[int, object] = {}
        self.probing: set[int] = set()

    def claim(self, dpid: int, dp) -> str | None:
        """Give `dpid` to `dp`, or say why not."""
        with self.lock:
            if dpid in self.probing:
                return f"datapath id {dpid:016x} is already being claimed by another connection"
            old = self.held.get(dpid)
            if old is None or old is dp or not _alive(old):
                self.held[dpid] = dp
                return None
            self.probing.add(dpid)
        try:
            answered = self.probe(old)
        finally:
            with self.lock:
                self.probing.discard(dpid)
        if answered and _alive(old):
            return f"datapath id {dpid:016x} is held by a live session (it answered echo)"
        LOG.warning("datapath %016x: the session holding it failed its echo; handing it to a new connection", dpid)
        self.close(old)
        with self.lock:
            self.held[dpid] = dp
        return None

    def release(self, dp) -> None:
        with self.lock:
            if dp.id is not None and self.held.get(dp.id) is dp:
                del self.held[dp.id]


def echo_probe(dp, timeout: float) -> bool:
    """Send `dp` an echo request now and wait for its reply (os-ken's echo bookkeeping marks it)."""
    try:
        req = dp.ofproto_parser.OFPEchoRequest(dp, data=b"fathom")
        xid = dp.set_xid(req)
        dp.unreplied_echo_requests.append(xid)
        if not dp.send_msg(req):
            return False
    except Exception:  # noqa: BLE001 - a connection that cannot even be written to has failed
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if xid not in dp.unreplied_echo_requests:
            return True
        if not _alive(dp):          # it closed meanwhile: no need to wait for the timeout
            return False
        time.sleep(0.02)
    return False


def peer_certificate(sock) -> x509.Certificate | None:
    """A TLS peer's certificate (verified in the handshake); None on a plain socket."""
    if not isinstance(sock, (ssl.SSLSocket, SerialTLSSocket)):
        return None
    der = sock.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der) if der else None


class Gate:
    def __init__(self, tls: bool, expected: Expected, probe_timeout: float = 2.0):
        self.tls = tls
        self.expected = expected
        self.probe_timeout = probe_timeout
        self.sessions = Sessions(lambda old: echo_probe(old, self.probe_timeout), lambda old: old.close())
        self.refused = 0
        # Whether this controller leaves a switch's connection quiet (in a cluster: a switch another
        # replica masters, fathom.controller.cluster): its keepalive waits QUIET_ECHO_INTERVAL
        self.quiet: Callable[[int], bool] = lambda dpid: False

    def admit(self, dp, claimed: int) -> str | None:
        """None to admit `dp` as datapath `claimed`; otherwise why it is refused."""
        cert = peer_certificate(dp.socket)
        try:
            identity = identity_of(cert) if cert is not None else None
        except PkiError as e:
            return str(e)
        problem = identity_problem(claimed, identity, self.tls, self.expected)
        if problem is None:
            problem = self.sessions.claim(claimed, dp)
        if problem is not None:
            self.refused += 1
        else:
            LOG.info("admitted %s as datapath %016x: %s", dp.address, claimed,
                     f"{identity.kind} {identity.name!r}, certificate serial {cert.serial_number:x}"
                     if identity else "plain TCP")
        return problem

    def release(self, dp) -> None:
        self.sessions.release(dp)


# ------------------------------------------------------------------------------- os-ken wiring

class _GatedBrick:
    """Stands between one connection and os-ken's event bus: nothing of a refused connection
    reaches os-ken's handlers or any app, and the features reply is held until the gate admits."""

    def __init__(self, brick, dp, gate: Gate):
        self._brick, self._dp, self._gate = brick, dp, gate
        self.admitted = self.refused = False

    def send_event_to_observers(self, ev, state=None):
        if self.refused:
            return
        if getattr(ev, "msg", None) is not None:   # a message from the switch: it is alive
            self._dp.heard_at = time.monotonic()
        if isinstance(ev, ofp_event.EventOFPSwitchFeatures) and not self.admitted:
            reason = self._gate.admit(self._dp, ev.msg.datapath_id)
            if reason is not None:
                self.refused = True
                LOG.warning("refused OpenFlow connection from %s claiming %016x: %s",
                            self._dp.address, ev.msg.datapath_id, reason)
                self._dp.close()
                return
            self.admitted = True
        self._brick.send_event_to_observers(ev, state)
        # the apps hear of the death before a newcomer can be admitted under the same id
        if self.admitted and isinstance(ev, ofp_event.EventOFPStateChange) and ev.state == DEAD_DISPATCHER:
            self._gate.release(self._dp)

    def get_handlers(self, ev, state=None):
        return [] if self.refused else self._brick.get_handlers(ev, state)

    def __getattr__(self, name):
        return getattr(self._brick, name)


class GatedDatapath(Datapath):
    """One switch connection: os-ken's, through the gate, with a keepalive that asks only a
    silent switch (as OVS's own probe does): an echo request once nothing was heard from the
    switch for `echo_request_interval` seconds, and the connection dropped once nothing was heard
    for `max_unreplied_echo_requests` + 1 intervals. At rest the reconciler's periodic check (a
    flow count each `interval`, shorter than the echo interval by default) is what the switch
    answers, and no echo is sent. A connection the gate calls quiet (`Gate.quiet`: a switch this
    replica does not master, which no check reaches) is sent an echo only after
    QUIET_ECHO_INTERVAL of silence: a switch that probes its controllers (OVS, every
    fathom.controller.bootstrap.CONTROLLER_PROBE_MS) is heard first, so the keepalive costs its
    probe alone; it is dropped after the same silence as any other."""

    def __init__(self, sock, address, gate: Gate):
        super().__init__(sock, address)
        self.gate = gate
        self.quiet_echo_interval = QUIET_ECHO_INTERVAL
        self.ofp_brick = _GatedBrick(self.ofp_brick, self, gate)
        self.heard_at = time.monotonic()      # the last message from the switch
        self._echo_at = 0.0                   # the last echo request sent
        self._ended = threading.Event()       # the connection's reading ended
        self.send_wait = SEND_WAIT
        self.sent_at = time.monotonic()      # the send loop's last progress (a message taken, a chunk written)

    def send(self, buf, close_socket: bool = False) -> bool:
        """Queue `buf` for the connection's send loop, as os-ken's Datapath.send does (False: the
        connection is closing, nothing queued), waiting for room in the queue as long as the send
        loop writes: once it wrote nothing for `send_wait` seconds of this wait, the switch stopped
        reading and its connection is closed (SEND_WAIT)."""
        started = time.monotonic()
        while True:
            until = max(started, self.sent_at) + self.send_wait    # send_wait after the loop last wrote
            if self._send_q_sem.acquire(timeout=max(0.0, until - time.monotonic())):
                break
            if time.monotonic() >= max(started, self.sent_at) + self.send_wait:
                if self.state != DEAD_DISPATCHER:
                    LOG.warning("switch at %s: nothing written to it for %g s, its send queue full (it stopped "
                                "reading): connection closed", self.address, self.send_wait)
                    self.close()
                return False
        if self.send_q:
            self.send_q.put((buf, close_socket))
            return True
        self._send_q_sem.release()
        return False

    def _send_loop(self):
        """os-ken's send loop (Datapath._send_loop), each message written SEND_CHUNK bytes at a
        time, `sent_at` marked as it goes (what `send` waits on)."""
        try:
            while self.state != DEAD_DISPATCHER:
                buf, close_socket = self.send_q.get()
                self._send_q_sem.release()
                self.sent_at = time.monotonic()
                view = memoryview(buf)
                for at in range(0, len(view), SEND_CHUNK):
                    self.socket.sendall(view[at:at + SEND_CHUNK])
                    self.sent_at = time.monotonic()
                if close_socket:
                    break
        except OSError as e:     # socket.timeout included
            LOG.debug("switch at %s: sending failed: %s", self.address, e)
        finally:
            q, self.send_q = self.send_q, None    # no new message is queued from here on
            try:                                  # and every sender waiting for room is let go
                while q.get(block=False):
                    self._send_q_sem.release()
            except hub.QueueEmpty:
                pass
            self._close_write()

    def _echo_request_loop(self):
        most = self.max_unreplied_echo_requests
        if not most:
            return
        dead = (most + 1) * self.echo_request_interval    # silent this long: dropped
        while self.send_q is not None:
            interval = self._echo_interval()
            now = time.monotonic()
            wait = min(max(self.heard_at, self._echo_at) + interval, self.heard_at + dead) - now
            if self._ended.wait(max(0.05, wait)):
                return
            now = time.monotonic()
            silent = now - self.heard_at
            if silent >= dead:
                LOG.warning("switch at %s: silent for %.0f s, echo requests unanswered: dropped",
                            self.address, silent)
                break
            if silent >= interval and now - self._echo_at >= interval and self.send_q is not None:
                self._echo_at = now
                self.send_msg(self.ofproto_parser.OFPEchoRequest(self))
        self.close()

    def _echo_interval(self) -> float:
        dpid = getattr(self, "id", None)
        if dpid is not None and self.gate.quiet(dpid):
            return max(self.echo_request_interval, self.quiet_echo_interval)
        return self.echo_request_interval

    def _recv_loop(self):
        try:
            super()._recv_loop()
        finally:
            # The switch closed the connection (or it failed). With os-ken's native hub, serve()
            # next joins the send and keepalive threads; until they end the connection would
            # count as alive, and a switch reconnecting at once would wait for the gate's echo
            # probe. The apps and the gate hear of the end now, and both threads are woken to
            # finish.
            self._ended.set()
            self.set_state(DEAD_DISPATCHER)
            self.send(b"", close_socket=True)


class GatedListener(OpenFlowController):
    """os-ken's OpenFlow listener, with our TLS context and every connection through the gate.

    One port: TLS when `ssl_context` is set, plain TCP otherwise. The TLS handshake has a deadline,
    so a peer that connects and sends nothing does not hold a thread forever.
    """
    gate: Gate | None = None
    ssl_context: ssl.SSLContext | None = None

    def server_loop(self, ofp_tcp_listen_port, ofp_ssl_listen_port):
        from os_ken import cfg
        server = hub.listen((cfg.CONF.ofp_listen_host, ofp_tcp_listen_port))
        while True:
            sock, addr = server.accept()
            hub.spawn(self._serve, sock, addr)

    def _serve(self, sock, addr):
        try:
            if self.ssl_context is not None:
                sock.settimeout(HANDSHAKE_TIMEOUT)
                sock = self.ssl_context.wrap_socket(sock, server_side=True)
        except (ssl.SSLError, OSError) as e:
            LOG.warning("refused OpenFlow connection from %s: TLS handshake failed: %s", addr, e)
            with contextlib.suppress(OSError):
                sock.close()
            return
        conn = SerialTLSSocket(sock) if self.ssl_context is not None else sock
        try:
            with contextlib.closing(GatedDatapath(conn, addr, self.gate)) as dp:
                dp.serve()
        finally:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()


def expected_from_store(session_factory) -> Expected:
    """The datapath ids the store expects of a holder: a node's br-int and br-phy, a fabric switch's
    bridge; with no identity (plain TCP) those of every registered node and switch."""
    from fathom.model import datapath_id, datapath_id_phy, datapath_id_fabric
    from fathom.store import models as m
    from fathom.store.fabric_models import FabricSwitch

    def expected(identity: Identity | None) -> set[int]:
        with session_factory() as s:
            if identity is None:
                return ({d for n in s.query(m.Node.id) for d in (datapath_id(n.id), datapath_id_phy(n.id))}
                        | {datapath_id_fabric(x.id) for x in s.query(FabricSwitch.id)})
            if identity.kind == "node":
                node = s.query(m.Node).filter_by(name=identity.name).one_or_none()
                return {datapath_id(node.id), datapath_id_phy(node.id)} if node else set()
            if identity.kind == "switch":
                sw = s.query(FabricSwitch).filter_by(name=identity.name).one_or_none()
                return {datapath_id_fabric(sw.id)} if sw else set()
            return set()
    return expected
