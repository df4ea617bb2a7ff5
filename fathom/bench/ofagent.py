"""A minimal OpenFlow controller for the switch benchmark, run as its own process.

`python -m fathom.bench.ofagent --host H --port P` starts os-ken with one app, reads JSON commands
(one per line) on stdin and answers one JSON line each on stdout. It runs in the namespace of the
device under test, so the switch connects to it over that namespace's loopback. Times are
CLOCK_REALTIME nanoseconds (`time.time_ns()`), the clock of the kernel's software packet stamps, so
the driver can subtract them from data-plane stamps taken by the traffic engine.

Commands:
  {"op": "wait", "timeout": s}                    -> {"dpid", "version"} once the switch is connected
  {"op": "clear"}                                 delete every flow (and barrier)
  {"op": "flows", "flows": [spec...], "barrier": true, "gap_s": 0}
        -> {"sent_ns": [...], "xids": [...], "barrier_sent_ns", "barrier_reply_ns", "barrier_xid"}; spec = {"priority", "match": {...},
           "actions": [["output", port] | ["push_vlan", vid] | ["set_vlan", vid] | ["pop_vlan"] |
           ["set_eth_dst", mac] | ["set_eth_src", mac] | ["controller"]], "table": 0}
  {"op": "echo", "count": n}                      -> {"rtt_ns": [...]}
  {"op": "packet_in_start"} / {"op": "packet_in_stop"} -> {"events": [[recv_ns, frame_hex_prefix], ...]}
  {"op": "quit"}
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls

log = logging.getLogger("fathom.bench.ofagent")


class BenchController(app_manager.OSKenApp):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dp = None
        self.connected = threading.Event()
        self.waiters: dict[int, tuple[threading.Event, list]] = {}
        self.collect_pin = False
        self.pins: list = []
        self.lock = threading.Lock()
        threading.Thread(target=self._serve, name="bench-stdin", daemon=True).start()

    # ----- switch events -----
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _features(self, ev):
        self.dp = ev.msg.datapath
        self.connected.set()

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def _barrier(self, ev):
        self._wake(ev.msg.xid, time.time_ns())

    @set_ev_cls(ofp_event.EventOFPEchoReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _echo(self, ev):
        self._wake(ev.msg.xid, time.time_ns())

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def _packet_in(self, ev):
        t = time.time_ns()
        if self.collect_pin:
            with self.lock:
                self.pins.append([t, bytes(ev.msg.data[:96]).hex()])

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _error(self, ev):
        log.error("switch error: type=%s code=%s", ev.msg.type, ev.msg.code)

    def _wake(self, xid, t):
        w = self.waiters.get(xid)
        if w:
            w[1].append(t)
            w[0].set()

    # ----- helpers -----
    def _send_and_wait(self, msg, timeout=5.0):
        dp = self.dp
        dp.set_xid(msg)
        ev, box = threading.Event(), []
        self.waiters[msg.xid] = (ev, box)
        t0 = time.time_ns()
        dp.send_msg(msg)
        if not ev.wait(timeout):
            self.waiters.pop(msg.xid, None)
            raise TimeoutError(f"no reply to xid {msg.xid} in {timeout}s")
        self.waiters.pop(msg.xid, None)
        return t0, box[0]

    def _actions(self, spec):
        p, ofp = self.dp.ofproto_parser, self.dp.ofproto
        out = []
        for a in spec:
            kind = a[0]
            if kind == "output":
                out.append(p.OFPActionOutput(int(a[1]), 0xffff))
            elif kind == "controller":
                out.append(p.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER))
            elif kind == "push_vlan":
                out += [p.OFPActionPushVlan(0x8100), p.OFPActionSetField(vlan_vid=int(a[1]) | ofp.OFPVID_PRESENT)]
            elif kind == "set_vlan":
                out.append(p.OFPActionSetField(vlan_vid=int(a[1]) | ofp.OFPVID_PRESENT))
            elif kind == "pop_vlan":
                out.append(p.OFPActionPopVlan())
            elif kind == "set_eth_dst":
                out.append(p.OFPActionSetField(eth_dst=a[1]))
            elif kind == "set_eth_src":
                out.append(p.OFPActionSetField(eth_src=a[1]))
            else:
                raise ValueError(f"unknown action {kind!r}")
        return out

    def _flow_mod(self, f):
        p, ofp = self.dp.ofproto_parser, self.dp.ofproto
        match = dict(f.get("match", {}))
        if "vlan_vid" in match:
            match["vlan_vid"] = int(match["vlan_vid"]) | ofp.OFPVID_PRESENT
        inst = [p.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, self._actions(f.get("actions", [])))]
        return p.OFPFlowMod(self.dp, table_id=f.get("table", 0), priority=f.get("priority", 100),
                            match=p.OFPMatch(**match), instructions=inst, command=ofp.OFPFC_ADD)

    # ----- commands -----
    def op_wait(self, cmd):
        if not self.connected.wait(cmd.get("timeout", 10)):
            raise TimeoutError("the switch did not connect")
        return {"dpid": self.dp.id, "version": self.dp.ofproto.OFP_VERSION}

    def op_clear(self, cmd):
        p, ofp = self.dp.ofproto_parser, self.dp.ofproto
        self.dp.send_msg(p.OFPFlowMod(self.dp, table_id=ofp.OFPTT_ALL, command=ofp.OFPFC_DELETE,
                                      out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, match=p.OFPMatch()))
        t0, t1 = self._send_and_wait(p.OFPBarrierRequest(self.dp))
        return {"barrier_ns": t1 - t0}

    def op_flows(self, cmd):
        mods = [self._flow_mod(f) for f in cmd["flows"]]
        gap = float(cmd.get("gap_s", 0))
        sent = []
        for m in mods:
            self.dp.set_xid(m)
            sent.append(time.time_ns())
            self.dp.send_msg(m)
            if gap:
                time.sleep(gap)
        res = {"sent_ns": sent, "xids": [m.xid for m in mods]}
        if cmd.get("barrier", True):
            req = self.dp.ofproto_parser.OFPBarrierRequest(self.dp)
            t0, t1 = self._send_and_wait(req, cmd.get("timeout", 10))
            res.update(barrier_sent_ns=t0, barrier_reply_ns=t1, barrier_xid=req.xid)
        return res

    def op_echo(self, cmd):
        p = self.dp.ofproto_parser
        rtts = []
        for i in range(int(cmd.get("count", 100))):
            t0, t1 = self._send_and_wait(p.OFPEchoRequest(self.dp, data=b"fathom-%d" % i))
            rtts.append(t1 - t0)
            time.sleep(float(cmd.get("interval_s", 0.002)))
        return {"rtt_ns": rtts}

    def op_packet_in_start(self, cmd):
        with self.lock:
            self.pins = []
        self.collect_pin = True
        return {}

    def op_packet_in_stop(self, cmd):
        self.collect_pin = False
        with self.lock:
            ev, self.pins = self.pins, []
        return {"events": ev}

    def _serve(self):
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            try:
                cmd = json.loads(line)
                if cmd["op"] == "quit":
                    self._reply({"ok": True})
                    break
                if cmd["op"] != "wait" and self.dp is None:
                    raise RuntimeError("no switch connected")
                res = getattr(self, "op_" + cmd["op"])(cmd)
                self._reply({"ok": True, **res})
            except Exception as e:  # every failure goes back to the driver as one line
                log.exception("command failed")
                self._reply({"ok": False, "error": f"{type(e).__name__}: {e}"})
        import os
        os._exit(0)

    @staticmethod
    def _reply(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=6653)
    ap.add_argument("--log", default=None)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, filename=a.log,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from os_ken import cfg
    cfg.CONF(args=["--ofp-listen-host", a.host, "--ofp-tcp-listen-port", str(a.port)], project="os_ken")
    app_manager.AppManager.run_apps(["fathom.bench.ofagent"])


if __name__ == "__main__":
    main()
