"""Packet captures as witnesses for the switch benchmark: tcpdump in a namespace writing a nanosecond
pcap, a reader for it, and a reader of the OpenFlow messages in a captured TCP connection.

The capture's timestamps are the kernel's software stamps (CLOCK_REALTIME), the clock of the traffic
engine's TX and RX stamps, so a captured OpenFlow message and a data-plane frame can be compared on one
clock.
"""
from __future__ import annotations

import signal
import struct
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fathom.host.exec import argv

from .engine import BenchError

PCAP_NS_MAGIC = 0xA1B23C4D


def read_pcap_ns(path: str | Path) -> list[tuple[int, bytes]]:
    """(timestamp_ns, frame) of each record of a nanosecond pcap file (tcpdump --time-stamp-precision=nano)."""
    data = Path(path).read_bytes()
    if len(data) < 24:
        return []
    magic = struct.unpack("<I", data[:4])[0]
    if magic != PCAP_NS_MAGIC:
        raise BenchError(f"{path}: not a little-endian nanosecond pcap (magic {magic:#x})")
    off, out = 24, []
    while off + 16 <= len(data):
        sec, nsec, incl, _ = struct.unpack("<IIII", data[off:off + 16])
        out.append((sec * 1_000_000_000 + nsec, data[off + 16:off + 16 + incl]))
        off += 16 + incl
    return out


@contextmanager
def tcpdump(ns: str, ifname: str, pcap: str | Path, bpf_filter: str, direction: str | None = None):
    """Capture on ns:ifname into pcap (full frames, ns timestamps) for the duration of the block."""
    args = argv(["tcpdump", "-i", ifname, "-n", "-s", "0", "-U", "--immediate-mode", "-B", "16384",
                 "--time-stamp-precision=nano", "-w", str(pcap)], ns)
    if direction:
        args += ["-Q", direction]
    proc = subprocess.Popen(args + [bpf_filter], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # tcpdump says "listening on ..." once its socket is bound
        deadline = time.monotonic() + 10
        line = ""
        while time.monotonic() < deadline and "listening on" not in line:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                raise BenchError(f"tcpdump on {ns}:{ifname} failed to start")
        time.sleep(0.1)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# ----------------------------------------------------------------- OpenFlow over a captured TCP connection

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
