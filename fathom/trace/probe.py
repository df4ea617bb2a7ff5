"""The probe of a live trace (fathom trace --live; docs/trace.md): an ICMP echo request, or a TCP
SYN, marked.

The mark is DSCP LIVE_DSCP (RFC 2474 pool 3, for local use) in the IPv4 header plus 48 random
bits — the IP ID, the ICMP identifier and sequence number — that name one trace. All of it lies in
the inner packet: a VXLAN hop encapsulates it, a VLAN hop tags the frame, a router rewrites MACs
and TTL; none of them touches these fields (NAT may change the ICMP identifier of a connection,
which is why the eBPF observation points match the reply by identifier and sequence, the request by
all three). A tenant can set DSCP LIVE_DSCP, but cannot guess 48 bits within a trace's second.
The destination VM answers the echo like any ping; the reply stops at the source port.
A TCP probe is a SYN with the same DSCP and IP ID whose sequence number is the 32 bits an echo
carries as identifier and sequence; the destination answers it like any SYN (SYN-ACK or RST,
acknowledging sequence + 1), and a RST (sequence + 1) sent after it closes what it opened.
"""
from __future__ import annotations

import ipaddress
import secrets
import struct
from dataclasses import dataclass

LIVE_DSCP = 59               # 0b111011: pool 3 (xxxx11), experimental or local use
MIN_SIZE = 28                # bytes of the IP packet: IPv4 header + ICMP header, no payload
MIN_SIZE_TCP = 40            # IPv4 header + TCP header without options


@dataclass(frozen=True)
class Probe:
    ip_id: int
    icmp_id: int
    icmp_seq: int
    dscp: int = LIVE_DSCP

    @classmethod
    def new(cls) -> "Probe":
        return cls(secrets.randbelow(0x10000), secrets.randbelow(0x10000), secrets.randbelow(0x10000))

    def to_json(self) -> dict:
        return {"dscp": self.dscp, "ip_id": self.ip_id, "icmp_id": self.icmp_id, "icmp_seq": self.icmp_seq}

    @property
    def tcp_seq(self) -> int:
        """A TCP probe's sequence number: the 32 bits an ICMP probe carries as identifier and sequence."""
        return self.icmp_id << 16 | self.icmp_seq

    def frame(self, eth_src: str, eth_dst: str, ip_src: str, ip_dst: str, ttl: int, size: int,
              tcp: tuple[int, int] | None = None, reset: bool = False) -> bytes:
        """The Ethernet frame: `size` bytes of IPv4 packet (header, ICMP echo, zero payload); with
        `tcp` (source port, destination port) a SYN of `size` bytes (header, no options, zero payload),
        or with `reset` the RST that ends it (sequence number + 1)."""
        if size < (MIN_SIZE_TCP if tcp else MIN_SIZE):
            raise ValueError(f"a probe is at least {MIN_SIZE_TCP if tcp else MIN_SIZE} bytes")
        src, dst = ipaddress.IPv4Address(ip_src).packed, ipaddress.IPv4Address(ip_dst).packed
        if tcp:
            size = MIN_SIZE_TCP if reset else size
            seg = struct.pack("!HHIIBBHHH", *tcp, (self.tcp_seq + reset) & 0xFFFFFFFF, 0, 5 << 4,
                              0x04 if reset else 0x02, 0 if reset else 64240, 0, 0) + bytes(size - MIN_SIZE_TCP)
            seg = seg[:16] + struct.pack("!H", checksum(src + dst + struct.pack("!BBH", 0, 6, len(seg)) + seg)) + seg[18:]
        else:
            seg = struct.pack("!BBHHH", 8, 0, 0, self.icmp_id, self.icmp_seq) + bytes(size - MIN_SIZE)
            seg = seg[:2] + struct.pack("!H", checksum(seg)) + seg[4:]
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, self.dscp << 2, size, self.ip_id, 0x4000, ttl, 6 if tcp else 1, 0,
                         src, dst)
        ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
        return _mac(eth_dst) + _mac(eth_src) + b"\x08\x00" + ip + seg


def _mac(text: str) -> bytes:
    return bytes(int(b, 16) for b in text.split(":"))


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071)."""
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF
