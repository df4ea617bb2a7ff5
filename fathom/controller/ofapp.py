"""The os-ken application: keeps the connected switches and hands their events to the runtime.

os-ken runs its own threads (the `native` hub); `start()` runs the app manager in a daemon thread
and returns the app. Reads (flow stats, barrier) and plain messages go through os-ken's ofctl service,
which matches the replies up to a barrier and answers an OpenFlow error. A bundle's commit is awaited here
(`expect`): its reply acknowledges the whole bundle, so no barrier follows it, and the errors the
switch sent for the bundle's messages before that reply are recorded by the same handler thread
before the commit's waiter wakes.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.ofproto import ofproto_v1_3, ofproto_v1_4

from fathom.controller.metrics import METRICS

LOG = logging.getLogger("fathom.openflow")
# Keepalive of every switch connection, in seconds (fathom.controller.ofgate.GatedDatapath): a
# switch silent for ECHO_INTERVAL is sent an echo request, and one silent for (ECHO_UNREPLIED + 1) *
# ECHO_INTERVAL = 60 s (ECHO_UNREPLIED echoes unanswered) is dropped and reconciled in full when it
# connects again: that is how a switch that died silently (its host or the path to it gone, no
# TCP reset) is noticed; a switch whose OVS or host restarts closes or resets the connection and
# is dropped at once. At rest the reconciler's check (a flow count per switch every `interval`,
# 5 s by default) is heard first, so no echo is sent; the switches' own probe is longer
# (fathom.controller.bootstrap.CONTROLLER_PROBE_MS), so they send none either. A blocked read or
# write on a switch's socket gives up after ECHO_INTERVAL (os-ken's socket timeout); a send that
# finds the connection's send queue full gives up sooner, once nothing was written to the switch
# for fathom.controller.ofgate.SEND_WAIT.
ECHO_INTERVAL = 15
ECHO_UNREPLIED = 3
# (experimenter, exp_type) of the ONF role status extension OVS sends over OpenFlow 1.3
ONF_ROLE_STATUS = (0x4F4E4600, 1911)


class Reply:
    """A reply awaited from a switch, however long it takes: `wait` returns what settled it, `then(fn)`
    calls fn(it) once it came, for a waiter that gave up (fathom.controller.switch.Unanswered). A
    bundle's commit (`expect`) settles with the reply or error message, or None when the connection
    closed first; a request through os-ken's ofctl service (fathom.controller.switch.ask) with
    ofctl's answer."""

    def __init__(self, dp):
        self.dp = dp
        self.msg = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._then: Callable[[object], None] | None = None

    def settle(self, msg) -> None:
        with self._lock:
            self.msg = msg
            self._done.set()
            then = self._then
        if then is not None:
            then(msg)

    def wait(self, timeout: float) -> tuple[bool, object]:
        """(whether it came within timeout s, the message or None)"""
        return self._done.wait(timeout), self.msg

    def then(self, fn: Callable[[object], None]) -> None:
        """fn(message) when the reply comes or the connection closes (at once if it already did),
        on the thread that settles it: fn must be quick."""
        with self._lock:
            done = self._done.is_set()
            if not done:
                self._then = fn
        if done:
            fn(self.msg)


class FathomOFApp(app_manager.OSKenApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION, ofproto_v1_4.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.datapaths: dict[int, object] = {}
        self.lock = threading.Lock()
        self.errors: dict[tuple[int, int], object] = {}  # (dpid, xid) -> OpenFlow error message
        self.pending: dict[tuple[int, int], Reply] = {}  # (dpid, xid) -> a reply awaited (`expect`)
        # dpid -> when the connection of a switch that was connected closed (wall clock); a switch
        # never connected since this process started is not here (it may just not have come yet)
        self.lost: dict[int, float] = {}
        # set by the runtime: called with (dpid, datapath or None)
        self.on_switch: Callable[[int, object | None], None] = lambda dpid, dp: None
        self.on_packet_in: Callable[[object], None] = lambda msg: None
        # called with the dpid of a switch that reported a port added, removed or changed
        self.on_port_status: Callable[[int], None] = lambda dpid: None
        # called with the dpid of a switch that said this connection is not (any longer) its master:
        # a role status demoting it (another controller became master), or a write refused with
        # OFPBRC_IS_SLAVE; fathom.controller.switch.NotMaster says the same to the writer
        self.on_not_master: Callable[[int], None] = lambda dpid: None

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state_change(self, ev):
        dp = ev.datapath
        if dp.id is None:
            return
        if ev.state == MAIN_DISPATCHER:
            with self.lock:
                self.datapaths[dp.id] = dp
                self.lost.pop(dp.id, None)
            LOG.info("switch %016x connected (OpenFlow 0x%02x)", dp.id, dp.ofproto.OFP_VERSION)
            self.on_switch(dp.id, dp)
        else:
            with self.lock:
                if self.datapaths.get(dp.id) is dp:   # not a stale connection the switch replaced
                    del self.datapaths[dp.id]
                    self.lost[dp.id] = time.time()
                closed = [k for k, r in self.pending.items() if r.dp is dp]
                for key in closed:
                    self.pending.pop(key).settle(None)
            LOG.info("switch %016x disconnected", dp.id)
            self.on_switch(dp.id, None)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, MAIN_DISPATCHER)
    def _error(self, ev):
        key = (ev.msg.datapath.id, ev.msg.xid)
        with self.lock:
            self.errors[key] = ev.msg
            if len(self.errors) > 10000:
                self.errors.pop(next(iter(self.errors)))
            reply = self.pending.pop(key, None)
        if reply is not None:
            reply.settle(ev.msg)
        ofp = ev.msg.datapath.ofproto
        if (ev.msg.type, ev.msg.code) == (ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_IS_SLAVE):
            METRICS.not_master.labels("is_slave").inc()
            self.on_not_master(ev.msg.datapath.id)
        elif (ev.msg.type, ev.msg.code) == (ofp.OFPET_ROLE_REQUEST_FAILED, ofp.OFPRRFC_STALE):
            METRICS.not_master.labels("stale").inc()

    @set_ev_cls(ofp_event.EventOFPRoleStatus, MAIN_DISPATCHER)
    def _role_status(self, ev):
        """OpenFlow 1.4's role status: sent to a master that another controller's request demoted."""
        if ev.msg.role == ev.msg.datapath.ofproto.OFPCR_ROLE_SLAVE:
            METRICS.not_master.labels("demoted").inc()
            self.on_not_master(ev.msg.datapath.id)

    @set_ev_cls(ofp_event.EventOFPExperimenter, MAIN_DISPATCHER)
    def _experimenter(self, ev):
        """OpenFlow 1.3 has no role status; OVS sends the ONF extension's instead (its body: role u32,
        reason u8, pad, generation_id u64)."""
        msg = ev.msg
        if (msg.experimenter, msg.exp_type) == ONF_ROLE_STATUS and len(msg.data) >= 4 \
                and int.from_bytes(msg.data[:4], "big") == msg.datapath.ofproto.OFPCR_ROLE_SLAVE:
            METRICS.not_master.labels("demoted").inc()
            self.on_not_master(msg.datapath.id)

    @set_ev_cls(ofp_event.EventOFPBundleCtrlMsg, MAIN_DISPATCHER)
    def _bundle_reply(self, ev):
        with self.lock:
            reply = self.pending.pop((ev.msg.datapath.id, ev.msg.xid), None)
        if reply is not None:
            reply.settle(ev.msg)

    def expect(self, dp, xid: int) -> Reply:
        """Await the reply (or error) to request `xid` on dp's connection: register before sending.
        On a connection already closed the reply is settled at once (its close was handled before
        we registered, and a send may still be queued while os-ken's send loop winds down)."""
        reply = Reply(dp)
        with self.lock:
            if self.datapaths.get(dp.id) is dp and dp.state != DEAD_DISPATCHER:
                self.pending[(dp.id, xid)] = reply
            else:
                reply.settle(None)
        return reply

    def forget(self, dp, xid: int) -> None:
        """Stop awaiting a reply (the request was never sent, or its wait ran out)."""
        with self.lock:
            self.pending.pop((dp.id, xid), None)

    def take_errors(self, dpid: int, xids) -> list:
        with self.lock:
            return [e for x in xids if (e := self.errors.pop((dpid, x), None)) is not None]

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev):
        self.on_port_status(ev.msg.datapath.id)

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def _packet_in(self, ev):
        self.on_packet_in(ev.msg)

    def datapath(self, dpid: int):
        with self.lock:
            return self.datapaths.get(dpid)

    def still_connected(self, dp) -> bool:
        """False once dp's connection is closed, even before our handler has heard of it."""
        return self.datapath(dp.id) is dp and dp.state != DEAD_DISPATCHER

    def lost_since(self, dpid: int) -> float | None:
        """When a switch that had connected lost its connection (None: connected, or never was)."""
        with self.lock:
            return self.lost.get(dpid)


def start(listen_host: str, listen_port: int, gate, ssl_context=None, echo_interval: int = ECHO_INTERVAL) -> FathomOFApp:
    """Start os-ken in this process (in a thread) listening for switches; returns our app.

    Every connection passes `gate` (fathom.controller.ofgate) before any app hears of it; with
    `ssl_context` the listener speaks TLS only, without it plain TCP only.
    """
    from os_ken import cfg
    from os_ken.controller import controller  # noqa: F401 - registers the ofp/echo options parsed below
    from os_ken.controller import ofp_handler
    from fathom.controller.ofgate import GatedListener
    # os-ken's OFPHandler builds its listener from this name when it starts: ours replaces it
    GatedListener.gate, GatedListener.ssl_context = gate, ssl_context
    ofp_handler.OpenFlowController = GatedListener
    cfg.CONF(args=["--ofp-listen-host", listen_host, "--ofp-tcp-listen-port", str(listen_port)], project="os_ken")
    # echo keepalive (see ECHO_INTERVAL)
    cfg.CONF.set_override("echo_request_interval", echo_interval)
    cfg.CONF.set_override("maximum_unreplied_echo_requests", ECHO_UNREPLIED)
    cfg.CONF.set_override("socket_timeout", float(echo_interval))
    manager = app_manager.AppManager.get_instance()
    manager.load_apps(["fathom.controller.ofapp", "os_ken.app.ofctl.service"])
    services = manager.instantiate_apps(**manager.create_contexts())
    from os_ken.lib import hub
    threading.Thread(target=hub.joinall, args=(services,), daemon=True, name="os-ken").start()
    return app_manager.lookup_service_brick("FathomOFApp")
