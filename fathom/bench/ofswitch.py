"""Simulated switches that speak OpenFlow 1.4 to a real controller over TCP, for `fathom bench scale`.

Each switch is a `fathom.controller.fakeswitch.FakeSwitch` (flow, group and meter tables with
OpenFlow's rules, decoded with os-ken's parser and fathom's decoder) behind a TCP connection to the
controller. It does what the controller needs of OVS: hello, features (its datapath id), echo,
barrier, flow/group/meter mods, bundles (open, add, commit: all or nothing; an error names the
refused add by its xid, as OVS does), and the flow, group-description, meter-config, aggregate (the
periodic check's flow count) and port
description multipart requests (replies split at 64 KiB like any switch's). What a flow stats
entry says about a flow is the match and instructions exactly as the controller sent them.

Run as its own process, so the controller's CPU is measured alone:

    python -m fathom.bench.ofswitch --controller 127.0.0.1:6653

Commands, one JSON line each on stdin, one JSON line answered on stdout:
  {"op": "connect", "dpids": [int, ...]}   connect these switches (answers once all are in MAIN state,
                                           i.e. the controller asked for their port descriptions)
  {"op": "counts"}                         -> {"flows": {dpid: n}, "groups": {...}, "meters": {...}}
  {"op": "wipe"}                           empty every table (like `ovs-ofctl del-flows` on each)
  {"op": "quit"}
"""
from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import threading
import time

from os_ken.ofproto import ofproto_parser, ofproto_v1_4 as ofp

from fathom.controller.fakeswitch import FakeSwitch

HEADER = struct.Struct("!BBHI")
FLOW_MOD_FIXED = 48        # header + the flow mod's fields before its match
GROUP_MOD_FIXED = 16       # header + command, type, pad, group id
METER_MOD_FIXED = 16       # header + command, flags, meter id
MAX_MSG = 0xFFFF


class OFSwitch:
    """One simulated switch on one OpenFlow connection (a thread reads and answers)."""

    def __init__(self, dpid: int, controller: tuple[str, int]):
        self.dpid = dpid
        self.tables = FakeSwitch(dpid)
        self.raw_flows: dict[tuple, bytes] = {}   # flow key -> match + instructions as received
        self.raw_groups: dict[int, bytes] = {}    # group id -> buckets as received
        self.raw_meters: dict[int, bytes] = {}    # meter id -> bands as received
        self.bundles: dict[int, list[tuple[int, bytes]]] = {}   # bundle id -> [(add xid, message)]
        self.ready = threading.Event()            # the controller asked for our ports: MAIN state
        self.closed = threading.Event()
        self.lock = threading.Lock()
        self.sock = socket.create_connection(controller)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.send(ofp.OFPT_HELLO, 0, b"")
        threading.Thread(target=self._loop, daemon=True, name=f"ofswitch-{dpid:x}").start()

    # ------------------------------------------------------------------------------ wire

    def send(self, msg_type: int, xid: int, body: bytes) -> None:
        self.sock.sendall(HEADER.pack(ofp.OFP_VERSION, msg_type, HEADER.size + len(body), xid) + body)

    def _loop(self) -> None:
        buf = b""
        try:
            while True:
                data = self.sock.recv(1 << 20)
                if not data:
                    break
                buf += data
                while len(buf) >= HEADER.size:
                    _version, msg_type, length, xid = HEADER.unpack_from(buf)
                    if len(buf) < length:
                        break
                    msg, buf = buf[:length], buf[length:]
                    self._handle(msg_type, xid, msg)
        except OSError:
            pass
        finally:
            self.closed.set()

    def _error(self, xid: int, err_type: int, code: int, offending: bytes) -> None:
        self.send(ofp.OFPT_ERROR, xid, struct.pack("!HH", err_type, code) + offending[:64])

    # ------------------------------------------------------------------------------ messages

    def _handle(self, msg_type: int, xid: int, msg: bytes) -> None:
        if msg_type == ofp.OFPT_FEATURES_REQUEST:
            self.send(ofp.OFPT_FEATURES_REPLY, xid, struct.pack("!QIBB2xII", self.dpid, 0, 254, 0, 0x4F, 0))
        elif msg_type == ofp.OFPT_ECHO_REQUEST:
            self.send(ofp.OFPT_ECHO_REPLY, xid, msg[HEADER.size:])
        elif msg_type == ofp.OFPT_BARRIER_REQUEST:
            self.send(ofp.OFPT_BARRIER_REPLY, xid, b"")
        elif msg_type == ofp.OFPT_MULTIPART_REQUEST:
            self._multipart(xid, msg)
        elif msg_type in (ofp.OFPT_FLOW_MOD, ofp.OFPT_GROUP_MOD, ofp.OFPT_METER_MOD):
            with self.lock:
                failed = self._apply([(xid, msg)])
            if failed is not None:
                self._error(xid, *failed[1:], msg)
        elif msg_type == ofp.OFPT_BUNDLE_CONTROL:
            self._bundle_control(xid, msg)
        elif msg_type == ofp.OFPT_BUNDLE_ADD_MESSAGE:
            bundle_id, _flags = struct.unpack_from("!I2xH", msg, HEADER.size)
            self.bundles.setdefault(bundle_id, []).append((xid, msg[HEADER.size + 8:]))
        # hello, set_config, role and anything else: nothing to answer

    def _bundle_control(self, xid: int, msg: bytes) -> None:
        bundle_id, ctrl_type, flags = struct.unpack_from("!IHH", msg, HEADER.size)
        reply = {ofp.OFPBCT_OPEN_REQUEST: ofp.OFPBCT_OPEN_REPLY, ofp.OFPBCT_CLOSE_REQUEST: ofp.OFPBCT_CLOSE_REPLY,
                 ofp.OFPBCT_COMMIT_REQUEST: ofp.OFPBCT_COMMIT_REPLY,
                 ofp.OFPBCT_DISCARD_REQUEST: ofp.OFPBCT_DISCARD_REPLY}.get(ctrl_type)
        if ctrl_type == ofp.OFPBCT_OPEN_REQUEST:
            self.bundles[bundle_id] = []
        elif ctrl_type == ofp.OFPBCT_COMMIT_REQUEST:
            with self.lock:
                failed = self._apply(self.bundles.pop(bundle_id, []))
            if failed is not None:   # the refused add by its own xid, then the commit fails
                add_xid, err_type, code = failed
                self._error(add_xid, err_type, code, b"")
                self._error(xid, ofp.OFPET_BUNDLE_FAILED, ofp.OFPBFC_MSG_FAILED, msg)
                return
        elif ctrl_type == ofp.OFPBCT_DISCARD_REQUEST:
            self.bundles.pop(bundle_id, None)
        if reply is not None:
            self.send(ofp.OFPT_BUNDLE_CONTROL, xid, struct.pack("!IHH", bundle_id, reply, flags))

    def _apply(self, messages: list[tuple[int, bytes]]) -> tuple[int, int, int] | None:
        """Apply messages all or nothing; (xid, error type, code) of the first refused one."""
        t = self.tables
        saved = (dict(t.flows), dict(t.groups), dict(t.meters),
                 dict(self.raw_flows), dict(self.raw_groups), dict(self.raw_meters))
        for xid, raw in messages:
            version, msg_type, length, _ = HEADER.unpack_from(raw)
            parsed = ofproto_parser.msg(t.dp, version, msg_type, length, xid, raw)
            error = t._one(parsed)
            if error is None:
                if msg_type == ofp.OFPT_FLOW_MOD:
                    key = t.last_flow.key
                    if parsed.command == ofp.OFPFC_ADD:
                        self.raw_flows[key] = raw[FLOW_MOD_FIXED:]
                    else:
                        self.raw_flows.pop(key, None)
                elif msg_type == ofp.OFPT_GROUP_MOD:
                    if parsed.group_id in t.groups:
                        self.raw_groups[parsed.group_id] = raw[GROUP_MOD_FIXED:]
                    else:
                        self.raw_groups.pop(parsed.group_id, None)
                else:
                    if parsed.meter_id in t.meters:
                        self.raw_meters[parsed.meter_id] = raw[METER_MOD_FIXED:]
                    else:
                        self.raw_meters.pop(parsed.meter_id, None)
                continue
            (t.flows, t.groups, t.meters, self.raw_flows, self.raw_groups, self.raw_meters) = saved
            kind = {ofp.OFPT_FLOW_MOD: ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPT_GROUP_MOD: ofp.OFPET_GROUP_MOD_FAILED,
                    ofp.OFPT_METER_MOD: ofp.OFPET_METER_MOD_FAILED}.get(msg_type, ofp.OFPET_BAD_REQUEST)
            return xid, kind, 0
        return None

    def _multipart(self, xid: int, msg: bytes) -> None:
        mp_type, _flags = struct.unpack_from("!HH", msg, HEADER.size)
        entries: list[bytes] = []
        with self.lock:
            t = self.tables
            if mp_type == ofp.OFPMP_FLOW:
                for key, flow in t.flows.items():
                    tail = self.raw_flows[key]
                    entries.append(struct.pack("!HBxIIHHHHH2xQQQ", 48 + len(tail), flow.table, 0, 0, flow.priority,
                                               0, 0, 0, 0, flow.cookie, 0, 0) + tail)
            elif mp_type == ofp.OFPMP_GROUP_DESC:
                types = {"all": ofp.OFPGT_ALL, "select": ofp.OFPGT_SELECT, "indirect": ofp.OFPGT_INDIRECT}
                for gid, group in t.groups.items():
                    tail = self.raw_groups[gid]
                    entries.append(struct.pack("!HBxI", 8 + len(tail), types[group.type], gid) + tail)
            elif mp_type == ofp.OFPMP_AGGREGATE:
                # every flow (the reconciler's check asks for all tables, any cookie): one reply
                entries.append(struct.pack("!QQI4x", 0, 0, len(t.flows)))
            elif mp_type == ofp.OFPMP_METER_CONFIG:
                for mid, meter in t.meters.items():
                    tail = self.raw_meters[mid]
                    flags = ofp.OFPMF_PKTPS if meter.unit == "pktps" else ofp.OFPMF_KBPS
                    if meter.burst:
                        flags |= ofp.OFPMF_BURST
                    entries.append(struct.pack("!HHI", 8 + len(tail), flags, mid) + tail)
        # replies of at most 64 KiB, every one but the last flagged "more"
        chunks, current, size = [], [], HEADER.size + 8
        for e in entries:
            if size + len(e) > MAX_MSG and current:
                chunks.append(current)
                current, size = [], HEADER.size + 8
            current.append(e)
            size += len(e)
        chunks.append(current)
        for i, chunk in enumerate(chunks):
            more = ofp.OFPMPF_REPLY_MORE if i < len(chunks) - 1 else 0
            self.send(ofp.OFPT_MULTIPART_REPLY, xid, struct.pack("!HH4x", mp_type, more) + b"".join(chunk))
        if mp_type == ofp.OFPMP_PORT_DESC:
            self.ready.set()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Fleet:
    """The switches of one benchmark process, by datapath id."""

    def __init__(self, controller: tuple[str, int]):
        self.controller = controller
        self.switches: dict[int, OFSwitch] = {}

    def connect(self, dpids: list[int], timeout: float = 60) -> dict:
        for dpid in dpids:
            if dpid not in self.switches or self.switches[dpid].closed.is_set():
                self.switches[dpid] = OFSwitch(dpid, self.controller)
        deadline = time.monotonic() + timeout
        for dpid in dpids:
            self.switches[dpid].ready.wait(max(0.0, deadline - time.monotonic()))
        waiting = [f"{d:016x}" for d in dpids if not self.switches[d].ready.is_set()]
        return {"connected": len(dpids) - len(waiting), "not_ready": waiting}

    def counts(self) -> dict:
        out: dict[str, dict] = {"flows": {}, "groups": {}, "meters": {}}
        for dpid, sw in self.switches.items():
            with sw.lock:
                out["flows"][str(dpid)] = len(sw.tables.flows)
                out["groups"][str(dpid)] = len(sw.tables.groups)
                out["meters"][str(dpid)] = len(sw.tables.meters)
        return out

    def wipe(self) -> dict:
        for sw in self.switches.values():
            with sw.lock:
                sw.tables.flows, sw.tables.groups, sw.tables.meters = {}, {}, {}
                sw.raw_flows, sw.raw_groups, sw.raw_meters = {}, {}, {}
        return {"wiped": len(self.switches)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--controller", required=True, help="HOST:PORT of the controller's OpenFlow listener")
    args = parser.parse_args()
    host, port = args.controller.rsplit(":", 1)
    fleet = Fleet((host, int(port)))
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.get("op")
        try:
            if op == "connect":
                answer = fleet.connect([int(d) for d in cmd["dpids"]], cmd.get("timeout", 60))
            elif op == "counts":
                answer = fleet.counts()
            elif op == "wipe":
                answer = fleet.wipe()
            elif op == "quit":
                break
            else:
                answer = {"error": f"unknown op {op!r}"}
        except Exception as e:  # noqa: BLE001 - reported to the driver
            answer = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    for sw in fleet.switches.values():
        sw.close()


if __name__ == "__main__":
    main()
