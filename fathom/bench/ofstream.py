"""The OpenFlow messages in a captured TCP connection, for the switch benchmark (the capture itself:
fathom.lab.capture, nanosecond stamps).

The capture's timestamps are the kernel's software stamps (CLOCK_REALTIME), the clock of the traffic
engine's TX and RX stamps, so a captured OpenFlow message and a data-plane frame can be compared on one
clock.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

OFPT_NAMES = {0: "hello", 2: "echo_request", 3: "echo_reply", 10: "packet_in", 14: "flow_mod",
              20: "barrier_request", 21: "barrier_reply"}


@dataclass
class OfMessage:
    seen_ns: int          # capture stamp of the segment that carried the message's last byte
    to_switch: bool       # True: controller -> switch
    version: int
    type: int
    xid: int
    length: int


def _tcp_segments(frames: list[tuple[int, bytes]], port: int):
    """(ts, to_switch, seq, payload) of each IPv4 TCP segment with data to or from `port`, the controller's
    listening port: segments from it go to the switch (loopback frames have an Ethernet header)."""
    for ts, f in frames:
        if len(f) < 14 + 20 or f[12:14] != b"\x08\x00":
            continue
        ip = f[14:]
        ihl = (ip[0] & 0x0F) * 4
        if ip[9] != 6 or len(ip) < ihl + 20:
            continue
        total = struct.unpack("!H", ip[2:4])[0]
        tcp = ip[ihl:total]
        sport, dport, seq = struct.unpack("!HHI", tcp[:8])
        doff = (tcp[12] >> 4) * 4
        payload = tcp[doff:]
        if payload and port in (sport, dport):
            yield ts, sport == port, seq, payload


def _signed(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


def openflow_messages(frames: list[tuple[int, bytes]], port: int = 6653) -> list[OfMessage]:
    """The OpenFlow messages in both directions of the captured connection, each stamped with the
    capture time of the segment that completed it. Segments seen twice (retransmissions) count once;
    a stream that starts mid-message is resynchronised at the next plausible header."""
    streams: dict[bool, dict] = {True: {"buf": b"", "next": None}, False: {"buf": b"", "next": None}}
    out: list[OfMessage] = []
    for ts, to_switch, seq, payload in _tcp_segments(frames, port):
        st = streams[to_switch]
        if st["next"] is not None:
            d = _signed(seq - st["next"])
            if d < 0:  # (partly) seen before
                if -d >= len(payload):
                    continue
                payload, seq = payload[-d:], st["next"]
            elif d > 0:  # bytes missing from the capture: resynchronise
                st["buf"] = b""
        st["next"] = (seq + len(payload)) & 0xFFFFFFFF
        st["buf"] += payload
        while len(st["buf"]) >= 8:
            version, mtype, length, xid = struct.unpack("!BBHI", st["buf"][:8])
            if not (1 <= version <= 6) or length < 8:
                st["buf"] = st["buf"][1:]  # not a header: resynchronise
                continue
            if len(st["buf"]) < length:
                break
            out.append(OfMessage(ts, to_switch, version, mtype, xid, length))
            st["buf"] = st["buf"][length:]
    return out
