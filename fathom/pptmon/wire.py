"""Reference model of the PPTMon wire format, independent of the eBPF code.

TCP (option inserted right after the 20-byte TCP header, before any other option):

    kind=254 | len=8+4n | ExID (16) | ver<<4|flags | hops=n | sample seq (16)
    n entries, in path order: VNF id (8) | time (24, µs), network byte order

UDP (RFC 9868 surplus area after the UDP user data; UDP length unchanged):

    [0 pad if the UDP length is odd] | OCS (16) | kind=127 (EXP) | len=8+4n | ExID |
    ver<<4|flags | hops | seq | entries ...

The OCS is the Internet checksum over the bytes from the OCS to the end of the IP payload,
prefixed by a 16-bit pseudo-header holding the number of those bytes.
While a hop's entry holds its ingress timestamp, the PENDING flag is set; the hop's egress
replaces the timestamp by the processing time and clears the flag.  Flag bits 1-3 count the
VNFs that could not add their entry (option room, hop cap, MTU), saturating at 7.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

TCP_KIND = 254
UDP_KIND = 127
EXID = 0x5046
VERSION = 1
F_PENDING = 0x01
SKIP_SHIFT, SKIP_MASK, SKIP_MAX = 1, 0x0E, 7   # flags bits 1-3: VNFs that added no entry
HDR_LEN = 8
ENTRY_LEN = 4
MAX_HOPS = 8
TIME_MASK = 0xFFFFFF
TIME_UNKNOWN = 0xFFFFFF


def inet_sum(data: bytes, start: int = 0) -> int:
    """Ones' complement sum of 16-bit big-endian words (odd length padded with zero)."""
    if len(data) % 2:
        data += b"\0"
    s = start
    for (w,) in struct.iter_unpack("!H", data):
        s += w
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def inet_checksum(data: bytes, start: int = 0) -> int:
    return (~inet_sum(data, start)) & 0xFFFF


@dataclass
class Hop:
    vnf: int
    time_us: int  # timestamp while pending, duration after the hop's egress

    def pack(self) -> bytes:
        return struct.pack("!I", (self.vnf << 24) | (self.time_us & TIME_MASK))


@dataclass
class Option:
    hops: list[Hop] = field(default_factory=list)
    seq: int = 0
    flags: int = 0

    @property
    def skipped(self) -> int:
        return (self.flags & SKIP_MASK) >> SKIP_SHIFT

    @property
    def length(self) -> int:
        return HDR_LEN + ENTRY_LEN * len(self.hops)

    def pack(self, kind: int) -> bytes:
        head = struct.pack("!BBHBBH", kind, self.length, EXID, (VERSION << 4) | self.flags,
                           len(self.hops), self.seq)
        return head + b"".join(h.pack() for h in self.hops)

    @classmethod
    def unpack(cls, data: bytes, kind: int) -> "Option | None":
        if len(data) < HDR_LEN + ENTRY_LEN:
            return None
        k, ln, exid, vf, n, seq = struct.unpack("!BBHBBH", data[:HDR_LEN])
        if k != kind or exid != EXID or vf >> 4 != VERSION or not 1 <= n <= MAX_HOPS:
            return None
        if ln != HDR_LEN + ENTRY_LEN * n or len(data) < ln:
            return None
        hops = []
        for i in range(n):
            (w,) = struct.unpack("!I", data[HDR_LEN + 4 * i:HDR_LEN + 4 * i + 4])
            hops.append(Hop(w >> 24, w & TIME_MASK))
        return cls(hops=hops, seq=seq, flags=vf & 0xF)


def udp_surplus(opt: Option, udp_len: int) -> bytes:
    """Surplus area (padding, OCS, our EXP option) for a datagram of UDP length udp_len."""
    body = opt.pack(UDP_KIND)
    t = b"\0\0" + body
    ocs = inet_checksum(t, len(t))
    if ocs == 0:
        ocs = 0xFFFF
    return (b"\0" if udp_len % 2 else b"") + struct.pack("!H", ocs) + body


def ocs_ok(surplus: bytes, udp_len: int) -> bool:
    t = surplus[udp_len % 2:]
    return inet_sum(t, len(t)) == 0xFFFF


def tcp_option(ip_payload: bytes) -> Option | None:
    """Our option in a TCP segment (bytes from the TCP header on), if present."""
    doff = (ip_payload[12] >> 4) * 4
    if doff < 20 + HDR_LEN + ENTRY_LEN:
        return None
    return Option.unpack(ip_payload[20:doff], TCP_KIND)


def udp_option(ip_payload: bytes) -> Option | None:
    """Our option in the surplus area of a UDP datagram, if present and the OCS is right."""
    (udp_len,) = struct.unpack("!H", ip_payload[4:6])
    surplus = ip_payload[udp_len:]
    if not surplus:
        return None
    if not ocs_ok(surplus, udp_len):
        return None
    return Option.unpack(surplus[udp_len % 2 + 2:], UDP_KIND)
