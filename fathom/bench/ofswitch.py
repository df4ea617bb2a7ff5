"""Simulated switches that speak OpenFlow 1.4 to a real controller over TCP, for `fathom bench scale`.

Each switch is a `fathom.controller.fakeswitch.FakeSwitch` (flow, group and meter tables with
OpenFlow's rules, decoded with os-ken's parser and fathom's decoder) behind a TCP connection to the
controller. It does what the controller needs of OVS: hello, features (its datapath id), echo,
barrier, flow/group/meter mods, bundles (open, add, commit: all or nothing; an error names the
refused add by its xid, as OVS does), and the flow, group-description, meter-config, aggregate (the
periodic check's flow count) and port
description multipart requests (replies split at 64 KiB like any switch's). What a flow stats
entry says about a flow is the match and instructions exactly as the controller sent them.

A switch has one connection per controller target, each with its role as OVS keeps it: a new
connection is equal; role requests as OpenFlow 1.4 says them (the switch keeps the largest
generation_id of a master or slave request and refuses an older one, OFPRRFC_STALE; a new master
turns the previous one into a slave and sends it a role status), and a slave's writes are refused
(OFPBRC_IS_SLAVE). A lost connection is tried again every second (the controller sets max_backoff
to 1 s). With a node's OVSDB given (`connect`'s "ovsdb"), the switch's targets are that OVSDB's
Controller rows, followed as they change, and each write there is acknowledged as ovs-vswitchd does
(cur_cfg set to next_cfg), so the controller's OVSDB transactions complete.

Run as its own process, so the controller's CPU is measured alone:

    python -m fathom.bench.ofswitch --controller 127.0.0.1:6653

Commands, one JSON line each on stdin, one JSON line answered on stdout:
  {"op": "connect", "dpids": [int, ...]}   connect these switches (answers once all are in MAIN state,
                                           i.e. the controller asked for their port descriptions, on
                                           every connection); with "ovsdb": {dpid: "tcp:IP:6640"},
                                           each to the targets in its node's OVSDB
  {"op": "roles"}                          -> {dpid: {"generation": n, "masters": k, "connections": c}}
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

SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"

HEADER = struct.Struct("!BBHI")
FLOW_MOD_FIXED = 48        # header + the flow mod's fields before its match
GROUP_MOD_FIXED = 16       # header + command, type, pad, group id
METER_MOD_FIXED = 16       # header + command, flags, meter id
MAX_MSG = 0xFFFF
NO_GENERATION = 0xFFFFFFFFFFFFFFFF   # the generation_id a switch answers before any master or slave request
RECONNECT_S = 1.0                    # between attempts to reach a controller (fathom sets max_backoff 1 s)
WRITES = (ofp.OFPT_FLOW_MOD, ofp.OFPT_GROUP_MOD, ofp.OFPT_METER_MOD, ofp.OFPT_BUNDLE_CONTROL,
          ofp.OFPT_BUNDLE_ADD_MESSAGE)   # refused from a slave (OFPBRC_IS_SLAVE)


class OFSwitch:
    """One simulated switch: its tables, and one connection (Channel) per controller target."""

    def __init__(self, dpid: int, controller: tuple[str, int] | None = None):
        self.dpid = dpid
        self.tables = FakeSwitch(dpid)
        self.raw_flows: dict[tuple, bytes] = {}   # flow key -> match + instructions as received
        self.raw_groups: dict[int, bytes] = {}    # group id -> buckets as received
        self.raw_meters: dict[int, bytes] = {}    # meter id -> bands as received
        self.bundles: dict[int, list[tuple[int, bytes]]] = {}   # bundle id -> [(add xid, message)]
        self.generation: int | None = None        # the largest generation_id of a master or slave request
        self.channels: dict[tuple[str, int], Channel] = {}
        self.lock = threading.Lock()
        if controller is not None:
            self.set_targets([controller])

    def set_targets(self, targets: list[tuple[str, int]]) -> None:
        """Connect to these controllers (and close the connections to any other)."""
        with self.lock:
            for target in set(self.channels) - set(targets):
                self.channels.pop(target).stop()
            for target in targets:
                if target not in self.channels:
                    self.channels[target] = Channel(self, target)

    def ready(self) -> bool:
        """Connected to every target, each in MAIN state (the controller asked for our ports)."""
        with self.lock:
            channels = list(self.channels.values())
        return bool(channels) and all(c.ready.is_set() for c in channels)

    # ------------------------------------------------------------------------------ roles

    def _role(self, channel: "Channel", xid: int, msg: bytes) -> None:
        """A role request, as OVS answers it (ofproto's handle_role_request)."""
        role, generation = struct.unpack_from("!I4xQ", msg, HEADER.size)
        names = {ofp.OFPCR_ROLE_EQUAL: "equal", ofp.OFPCR_ROLE_MASTER: "master", ofp.OFPCR_ROLE_SLAVE: "slave"}
        demoted = []
        with self.lock:
            if role in (ofp.OFPCR_ROLE_MASTER, ofp.OFPCR_ROLE_SLAVE):
                if self.generation is not None and (generation - self.generation) % 2**64 >= 2**63:
                    channel.error(xid, ofp.OFPET_ROLE_REQUEST_FAILED, ofp.OFPRRFC_STALE, msg)
                    return
                self.generation = generation
            if role == ofp.OFPCR_ROLE_MASTER:
                demoted = [c for c in self.channels.values() if c is not channel and c.role == "master"]
                for other in demoted:
                    other.role = "slave"
            if role in names:
                channel.role = names[role]
            current = {"equal": ofp.OFPCR_ROLE_EQUAL, "master": ofp.OFPCR_ROLE_MASTER,
                       "slave": ofp.OFPCR_ROLE_SLAVE}[channel.role]
            now = NO_GENERATION if self.generation is None else self.generation
        for other in demoted:   # OpenFlow 1.4's role status: another controller became master
            other.send(ofp.OFPT_ROLE_STATUS, 0, struct.pack("!IB3xQ", ofp.OFPCR_ROLE_SLAVE,
                                                            ofp.OFPCRR_MASTER_REQUEST, now))
        channel.send(ofp.OFPT_ROLE_REPLY, xid, struct.pack("!I4xQ", current, now))

    def roles(self) -> dict:
        with self.lock:
            return {"generation": self.generation, "connections": len(self.channels),
                    "masters": sum(c.role == "master" for c in self.channels.values())}

    # ------------------------------------------------------------------------------ messages

    def handle(self, channel: "Channel", msg_type: int, xid: int, msg: bytes) -> None:
        """One message from the controller on `channel`."""
        if msg_type == ofp.OFPT_FEATURES_REQUEST:
            channel.send(ofp.OFPT_FEATURES_REPLY, xid, struct.pack("!QIBB2xII", self.dpid, 0, 254, 0, 0x4F, 0))
        elif msg_type == ofp.OFPT_ECHO_REQUEST:
            channel.send(ofp.OFPT_ECHO_REPLY, xid, msg[HEADER.size:])
        elif msg_type == ofp.OFPT_BARRIER_REQUEST:
            channel.send(ofp.OFPT_BARRIER_REPLY, xid, b"")
        elif msg_type == ofp.OFPT_MULTIPART_REQUEST:
            self._multipart(channel, xid, msg)
        elif msg_type == ofp.OFPT_ROLE_REQUEST:
            self._role(channel, xid, msg)
        elif channel.role == "slave" and msg_type in WRITES:
            channel.error(xid, ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_IS_SLAVE, msg)
        elif msg_type in (ofp.OFPT_FLOW_MOD, ofp.OFPT_GROUP_MOD, ofp.OFPT_METER_MOD):
            with self.lock:
                failed = self._apply([(xid, msg)])
            if failed is not None:
                channel.error(xid, *failed[1:], msg)
        elif msg_type == ofp.OFPT_BUNDLE_CONTROL:
            self._bundle_control(channel, xid, msg)
        elif msg_type == ofp.OFPT_BUNDLE_ADD_MESSAGE:
            bundle_id, _flags = struct.unpack_from("!I2xH", msg, HEADER.size)
            with self.lock:
                self.bundles.setdefault(bundle_id, []).append((xid, msg[HEADER.size + 8:]))
        # hello, set_config and anything else: nothing to answer

    def _bundle_control(self, channel: "Channel", xid: int, msg: bytes) -> None:
        bundle_id, ctrl_type, flags = struct.unpack_from("!IHH", msg, HEADER.size)
        reply = {ofp.OFPBCT_OPEN_REQUEST: ofp.OFPBCT_OPEN_REPLY, ofp.OFPBCT_CLOSE_REQUEST: ofp.OFPBCT_CLOSE_REPLY,
                 ofp.OFPBCT_COMMIT_REQUEST: ofp.OFPBCT_COMMIT_REPLY,
                 ofp.OFPBCT_DISCARD_REQUEST: ofp.OFPBCT_DISCARD_REPLY}.get(ctrl_type)
        with self.lock:
            failed = None
            if ctrl_type == ofp.OFPBCT_OPEN_REQUEST:
                self.bundles[bundle_id] = []
            elif ctrl_type == ofp.OFPBCT_COMMIT_REQUEST:
                failed = self._apply(self.bundles.pop(bundle_id, []))
            elif ctrl_type == ofp.OFPBCT_DISCARD_REQUEST:
                self.bundles.pop(bundle_id, None)
        if failed is not None:   # the refused add by its own xid, then the commit fails
            add_xid, err_type, code = failed
            channel.error(add_xid, err_type, code, b"")
            channel.error(xid, ofp.OFPET_BUNDLE_FAILED, ofp.OFPBFC_MSG_FAILED, msg)
            return
        if reply is not None:
            channel.send(ofp.OFPT_BUNDLE_CONTROL, xid, struct.pack("!IHH", bundle_id, reply, flags))

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

    def _multipart(self, channel: "Channel", xid: int, msg: bytes) -> None:
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
            channel.send(ofp.OFPT_MULTIPART_REPLY, xid, struct.pack("!HH4x", mp_type, more) + b"".join(chunk))
        if mp_type == ofp.OFPMP_PORT_DESC:
            channel.ready.set()

    def close(self) -> None:
        self.set_targets([])


class Channel:
    """One controller connection of a switch (a thread reads and answers), tried again every
    RECONNECT_S while it is wanted; a new connection is equal, as in OVS."""

    def __init__(self, switch: OFSwitch, target: tuple[str, int]):
        self.switch, self.target = switch, target
        self.role = "equal"
        self.ready = threading.Event()            # the controller asked for our ports: MAIN state
        self.stopped = threading.Event()
        self.sock: socket.socket | None = None
        self.send_lock = threading.Lock()
        threading.Thread(target=self._run, daemon=True, name=f"ofswitch-{switch.dpid:x}-{target[1]}").start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.sock = socket.create_connection(self.target)
            except OSError:
                self.stopped.wait(RECONNECT_S)
                continue
            if self.stopped.is_set():
                break
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.role = "equal"
            try:
                self.send(ofp.OFPT_HELLO, 0, b"")
                self._loop()
            except OSError:
                pass
            self.ready.clear()
            self.role = "equal"
            self.sock.close()
            self.stopped.wait(RECONNECT_S)

    def _loop(self) -> None:
        buf = b""
        while True:
            data = self.sock.recv(1 << 20)
            if not data:
                return
            buf += data
            while len(buf) >= HEADER.size:
                _version, msg_type, length, xid = HEADER.unpack_from(buf)
                if len(buf) < length:
                    break
                msg, buf = buf[:length], buf[length:]
                self.switch.handle(self, msg_type, xid, msg)

    def send(self, msg_type: int, xid: int, body: bytes) -> None:
        with self.send_lock:
            self.sock.sendall(HEADER.pack(ofp.OFP_VERSION, msg_type, HEADER.size + len(body), xid) + body)

    def error(self, xid: int, err_type: int, code: int, offending: bytes) -> None:
        self.send(ofp.OFPT_ERROR, xid, struct.pack("!HH", err_type, code) + offending[:64])

    def stop(self) -> None:
        self.stopped.set()
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class NodeConfig:
    """What ovs-vswitchd does with a node's OVSDB, for the simulated switches: each switch connects
    to the targets of its node's Controller rows, followed as they change, and every write there is
    acknowledged (Open_vSwitch cur_cfg set to next_cfg, which ovsdbapp's transactions wait for).
    One thread runs every node's IDL."""

    def __init__(self):
        self.nodes: dict[str, tuple[OFSwitch, object]] = {}   # OVSDB remote -> (switch, IDL)
        self.pending: dict[str, object] = {}                    # remote -> its cur_cfg transaction
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def follow(self, switch: OFSwitch, remote: str) -> None:
        from ovs.db import idl
        helper = idl.SchemaHelper(location=SCHEMA)
        helper.register_columns("Open_vSwitch", ["next_cfg", "cur_cfg"])
        helper.register_columns("Controller", ["target"])
        with self.lock:
            self.nodes[remote] = (switch, idl.Idl(remote, helper))
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, daemon=True, name="node-config")
            self.thread.start()

    def _run(self) -> None:
        import ovs.poller
        while not self.stopped.is_set():
            poller = ovs.poller.Poller()
            with self.lock:
                nodes = list(self.nodes.items())
            for remote, (switch, node_idl) in nodes:
                self._step(remote, switch, node_idl)
                node_idl.wait(poller)
                if remote in self.pending:
                    self.pending[remote].wait(poller)
            poller.timer_wait(500)
            poller.block()

    def _step(self, remote: str, switch: OFSwitch, node_idl) -> None:
        from ovs.db import idl
        node_idl.run()
        txn = self.pending.get(remote)
        if txn is not None and txn.commit() != idl.Transaction.INCOMPLETE:
            del self.pending[remote]
        if remote not in self.pending:
            for row in node_idl.tables["Open_vSwitch"].rows.values():
                if row.cur_cfg < row.next_cfg:
                    txn = self.pending[remote] = idl.Transaction(node_idl)
                    row.cur_cfg = row.next_cfg
                    txn.commit()
        targets = []
        for row in node_idl.tables["Controller"].rows.values():
            kind, _, address = row.target.partition(":")
            host, _, port = address.rpartition(":")
            if kind == "tcp" and port.isdigit():
                targets.append((host, int(port)))
        if node_idl.has_ever_connected():
            switch.set_targets(targets)

    def stop(self) -> None:
        self.stopped.set()
        with self.lock:
            for _switch, node_idl in self.nodes.values():
                node_idl.close()


class Fleet:
    """The switches of one benchmark process, by datapath id."""

    def __init__(self, controller: tuple[str, int] | None):
        self.controller = controller
        self.switches: dict[int, OFSwitch] = {}
        self.config = NodeConfig()

    def connect(self, dpids: list[int], timeout: float = 60, ovsdb: dict[int, str] | None = None) -> dict:
        """Connect these switches: to the --controller, or (`ovsdb`: dpid -> its node's OVSDB remote) to
        the targets of their node's OVSDB."""
        for dpid in dpids:
            if dpid not in self.switches:
                if ovsdb:
                    sw = self.switches[dpid] = OFSwitch(dpid)
                    self.config.follow(sw, ovsdb[dpid])
                else:
                    self.switches[dpid] = OFSwitch(dpid, self.controller)
        deadline = time.monotonic() + timeout
        waiting = list(dpids)
        while waiting and time.monotonic() < deadline:
            time.sleep(0.05)
            waiting = [d for d in waiting if not self.switches[d].ready()]
        return {"connected": len(dpids) - len(waiting), "not_ready": [f"{d:016x}" for d in waiting]}

    def roles(self) -> dict:
        return {str(dpid): sw.roles() for dpid, sw in self.switches.items()}

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

    def close(self) -> None:
        self.config.stop()
        for sw in self.switches.values():
            sw.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--controller", help="HOST:PORT of the controller's OpenFlow listener (else each switch "
                                             "follows its node's OVSDB)")
    args = parser.parse_args()
    host, _, port = (args.controller or "").rpartition(":")
    fleet = Fleet((host, int(port)) if args.controller else None)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.get("op")
        try:
            if op == "connect":
                answer = fleet.connect([int(d) for d in cmd["dpids"]], cmd.get("timeout", 60),
                                       {int(d): r for d, r in cmd.get("ovsdb", {}).items()})
            elif op == "roles":
                answer = fleet.roles()
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
    fleet.close()


if __name__ == "__main__":
    main()
