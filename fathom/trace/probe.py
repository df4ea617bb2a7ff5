"""The probe of a live trace (fathom trace --live; docs/trace.md): an ICMP echo request, marked.

The mark is DSCP LIVE_DSCP (RFC 2474 pool 3, for local use) in the IPv4 header plus 48 random
bits — the IP ID, the ICMP identifier and sequence number — that name one trace. All of it lies in
the inner packet: a VXLAN hop encapsulates it, a VLAN hop tags the frame, a router rewrites MACs
and TTL; none of them touches these fields (NAT may change the ICMP identifier of a connection,
which is why the eBPF observation points match the reply by identifier and sequence, the request by
all three). A tenant can set DSCP LIVE_DSCP, but cannot guess 48 bits within a trace's second.
The destination VM answers the echo like any ping; the reply stops at the source port.
"""
from __future__ import annotations

import ipaddress
import secrets
import struct
from dataclasses import dataclass

LIVE_DSCP = 59               # 0b111011: pool 3 (xxxx11), experimental or local use
MIN_SIZE = 28                # bytes of the IP packet: IPv4 header + ICMP header, no payload


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

    def frame(self, eth_src: str, eth_dst: str, ip_src: str, ip_dst: str, ttl: int, size: int) -> bytes:
        """The Ethernet frame: `size` bytes of IPv4 packet (header, ICMP echo, zero payload)."""
        if size < MIN_SIZE:
            raise ValueError(f"a probe is at least {MIN_SIZE} bytes")
        payload = bytes(size - MIN_SIZE)
        icmp = struct.pack("!BBHHH", 8, 0, 0, self.icmp_id, self.icmp_seq) + payload
        icmp = icmp[:2] + struct.pack("!H", checksum(icmp)) + icmp[4:]
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, self.dscp << 2, size, self.ip_id, 0x4000, ttl, 1, 0,
                         ipaddress.IPv4Address(ip_src).packed, ipaddress.IPv4Address(ip_dst).packed)
        ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
        return _mac(eth_dst) + _mac(eth_src) + b"\x08\x00" + ip + icmp


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
