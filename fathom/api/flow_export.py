"""Flow records forwarded to an external IPFIX collector (RFC 7011 over UDP), as the controller
files them: the same 5-tuples, scaled packets and bytes that `GET /v1/flow-records` reports.

The controller exports, not the agents: it alone knows a record's owner (it refuses what the model
does not back) and the rate to scale by, and one collector address is configured in one place
(`PUT /v1/flow-records/export`, stored in the `flow_record_export` row; docs/flow-records.md).

Each message carries both templates (collectors may start at any time and UDP loses messages, so
a template is never more than one message away), then data records, at most MESSAGE_MAX bytes:

    template 256 (IPv4) / 257 (IPv6): sourceIPv4Address (8) | sourceIPv6Address (27),
        destinationIPv4Address (12) | destinationIPv6Address (28), protocolIdentifier (4),
        sourceTransportPort (7), destinationTransportPort (11), octetDeltaCount (1),
        packetDeltaCount (2), flowStartMilliseconds (152), flowEndMilliseconds (153),
        observationPointId (138: fathom's owner of the sample, fathom.model.flow_records)

Observation domain OBS_DOMAIN. ICMP records carry type and code in the port fields, as the
collectors' own tools show them.
"""
from __future__ import annotations

import ipaddress
import socket
import struct
import threading
import time

from fathom.model.flow_records import OBS_DOMAIN

MESSAGE_MAX = 1400          # bytes: one unfragmented datagram on any path
TEMPLATE_V4, TEMPLATE_V6 = 256, 257
# (IE id, length) of the fields after the two addresses
_TAIL = ((4, 1), (7, 2), (11, 2), (1, 8), (2, 8), (152, 8), (153, 8), (138, 4))
_FIELDS = {TEMPLATE_V4: ((8, 4), (12, 4)) + _TAIL, TEMPLATE_V6: ((27, 16), (28, 16)) + _TAIL}
_TAIL_PACK = struct.Struct("!BHHQQQQI")
_HEADER = struct.Struct("!HHIII")


def _template_set() -> bytes:
    body = b"".join(struct.pack("!HH", tid, len(f)) + b"".join(struct.pack("!HH", ie, n) for ie, n in f)
                    for tid, f in _FIELDS.items())
    return struct.pack("!HH", 2, 4 + len(body)) + body


TEMPLATES = _template_set()


def _data(rec: dict) -> tuple[int, bytes]:
    src, dst = ipaddress.ip_address(rec["src"]), ipaddress.ip_address(rec["dst"])
    tid = TEMPLATE_V4 if src.version == 4 else TEMPLATE_V6
    first = int(rec["first"] * 1000)
    return tid, src.packed + dst.packed + _TAIL_PACK.pack(
        rec["proto"], rec["sport"], rec["dport"], rec["bytes"], rec["packets"], first,
        max(first, int(rec["last"] * 1000)), rec["point"])


def messages(records: list[dict], sequence: int, export_time: int) -> list[bytes]:
    """The records as IPFIX messages of at most MESSAGE_MAX bytes, each with the templates;
    `sequence` is the number of data records sent before (RFC 7011 3.1)."""
    out: list[bytes] = []
    sets: dict[int, list[bytes]] = {}
    size, count = _HEADER.size + len(TEMPLATES), 0

    def flush():
        nonlocal sets, size, count, sequence
        body = TEMPLATES + b"".join(struct.pack("!HH", tid, 4 + sum(map(len, rs))) + b"".join(rs)
                                    for tid, rs in sets.items())
        out.append(_HEADER.pack(10, _HEADER.size + len(body), export_time, sequence, OBS_DOMAIN) + body)
        sequence += count
        sets, size, count = {}, _HEADER.size + len(TEMPLATES), 0

    for rec in records:
        tid, data = _data(rec)
        grow = len(data) + (0 if tid in sets else 4)
        if count and size + grow > MESSAGE_MAX:
            flush()
            grow = len(data) + 4
        sets.setdefault(tid, []).append(data)
        size, count = size + grow, count + 1
    if count:
        flush()
    return out


class Exporter:
    """Sends filed records to the configured collector (a UDP socket per address family, made on
    first use; a send error is counted, never raised into the ingestion that called)."""

    def __init__(self):
        self.sockets: dict[int, socket.socket] = {}
        self.sequence = 0
        self.counters = {"records": 0, "messages": 0, "errors": 0}
        self._lock = threading.Lock()

    def send(self, collector: tuple[str, int], records: list[dict]) -> None:
        host, port = collector
        family = socket.AF_INET if ipaddress.ip_address(host).version == 4 else socket.AF_INET6
        with self._lock:
            for msg in messages(records, self.sequence, int(time.time())):
                try:
                    if family not in self.sockets:
                        self.sockets[family] = socket.socket(family, socket.SOCK_DGRAM)
                    self.sockets[family].sendto(msg, (host, port))
                    self.counters["messages"] += 1
                except OSError:
                    self.counters["errors"] += 1
            self.sequence = (self.sequence + len(records)) & 0xFFFFFFFF
            self.counters["records"] += len(records)
