"""Deterministic test traffic whose delivery can be checked byte for byte.

    python -m fathom.pptmon.traffic server tcp|udp --port P [--count N] [--idle S]
    python -m fathom.pptmon.traffic client tcp|udp --dst ADDR --port P [--bytes N | --count N]
                                        [--rate PPS] [--seed S] [--burst N]

Both sides print one JSON object: the SHA-256 of what was sent / received (TCP: the byte
stream; UDP: the datagrams in order), so a test compares them.  The client mixes write and
datagram sizes (odd and even, tiny and MTU-sized) and paces itself so that the chain sees
packets that are not GSO super-packets.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import socket
import struct
import sys
import time

TCP_CHUNKS = [1, 100, 999, 1448, 3000, 17, 1200, 1428]   # 1448 / 1428: one full-size segment (IPv4 / IPv6, timestamps)
UDP_SIZES = [1, 2, 63, 64, 999, 1000, 1400, 1452, 1472]   # 1452: full size over IPv6


def _family(addr: str) -> int:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def tcp_server(port: int, timeout: float) -> dict:
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("::", port))
    s.listen(1)
    print(json.dumps({"listening": port}), flush=True)
    s.settimeout(timeout)
    c, _ = s.accept()
    c.settimeout(timeout)
    h, n = hashlib.sha256(), 0
    while True:
        b = c.recv(65536)
        if not b:
            break
        h.update(b)
        n += len(b)
    c.close()
    return {"bytes": n, "sha256": h.hexdigest()}


def udp_server(port: int, count: int, idle: float) -> dict:
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind(("::", port))
    print(json.dumps({"listening": port}), flush=True)
    s.settimeout(idle * 10)
    h, n, nbytes = hashlib.sha256(), 0, 0
    while n < count:
        try:
            b = s.recv(65536)
        except socket.timeout:
            break
        s.settimeout(idle)
        h.update(struct.pack("!I", len(b)) + b)
        n += 1
        nbytes += len(b)
    return {"count": n, "bytes": nbytes, "sha256": h.hexdigest()}


def tcp_client(dst: str, port: int, total: int, seed: int) -> dict:
    rnd = random.Random(seed)
    s = socket.socket(_family(dst), socket.SOCK_STREAM)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.connect((dst, port))
    h, sent, i = hashlib.sha256(), 0, 0
    while sent < total:
        n = min(TCP_CHUNKS[i % len(TCP_CHUNKS)], total - sent)
        b = rnd.randbytes(n)
        s.sendall(b)
        h.update(b)
        sent += n
        i += 1
        if i % 4 == 0:
            time.sleep(0.0005)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    s.close()
    return {"bytes": sent, "sha256": h.hexdigest()}


def udp_client(dst: str, port: int, count: int, rate: float, seed: int,
               sizes: list[int] | None = None, burst: int = 1) -> dict:
    """count datagrams, `burst` back to back every 1/rate seconds."""
    rnd = random.Random(seed)
    s = socket.socket(_family(dst), socket.SOCK_DGRAM)
    s.connect((dst, port))  # connected: IPv4 IDs increase per datagram (used to match captures)
    sizes = sizes or UDP_SIZES
    h, nbytes = hashlib.sha256(), 0
    gap = 1.0 / rate if rate > 0 else 0.0
    t0 = time.perf_counter()
    for i in range(count):
        n = max(sizes[i % len(sizes)], 8)
        b = struct.pack("!Q", i) + rnd.randbytes(n - 8) if n >= 8 else rnd.randbytes(n)
        b = b[:sizes[i % len(sizes)]]
        s.send(b)
        h.update(struct.pack("!I", len(b)) + b)
        nbytes += len(b)
        if gap and (i + 1) % burst == 0:
            delay = t0 + (i + 1) // burst * gap - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
    return {"count": count, "bytes": nbytes, "sha256": h.hexdigest()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fathom.pptmon.traffic")
    ap.add_argument("role", choices=["server", "client"])
    ap.add_argument("proto", choices=["tcp", "udp"])
    ap.add_argument("--dst")
    ap.add_argument("--port", type=int, default=5301)
    ap.add_argument("--bytes", type=int, default=200_000)
    ap.add_argument("--count", type=int, default=400)
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--idle", type=float, default=1.0)
    ap.add_argument("--size", type=int, action="append", help="UDP datagram size(s)")
    ap.add_argument("--burst", type=int, default=1, help="UDP datagrams sent back to back per period")
    a = ap.parse_args(argv)
    if a.role == "server":
        out = tcp_server(a.port, 20) if a.proto == "tcp" else udp_server(a.port, a.count, a.idle)
    else:
        if not a.dst:
            ap.error("--dst is required")
        if a.proto == "tcp":
            out = tcp_client(a.dst, a.port, a.bytes, a.seed)
        else:
            out = udp_client(a.dst, a.port, a.count, a.rate, a.seed, a.size, max(1, a.burst))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
