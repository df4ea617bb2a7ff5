"""The batch a node's agent delivers its flow records in (POST /v1/flow-records/ingest): one
interval's records, packed in columns, read by the controller without an object per record
(docs/flow-records.md). Content type CONTENT_TYPE (the version is in its name); every number in
network byte order:

    header     interval_end f64 (seconds since the epoch)  interval_s f64
               n4 u16  n6 u16  n u16
    addresses  n4 IPv4 addresses (4 bytes each), then n6 IPv6 addresses (16 bytes each)
    columns    n values of each of COLUMNS, one column after the other: point u32, src u16,
               dst u16, proto u8, sport u16, dport u16, packets u64, bytes u64, first u64, last u64

A record's src and dst are indices into the addresses (the IPv4 ones first); first and last are
milliseconds since the epoch. `decode` checks a batch whole before any of it is used: its length
is exactly what its counts say, and every bound is checked per column (its largest value); a batch
that breaks one raises BadBatch, naming the field.
"""
from __future__ import annotations

import ipaddress
import math
import struct
import sys
from array import array
from dataclasses import dataclass

CONTENT_TYPE = "application/vnd.fathom.flow-records.v1"
MAX_RECORDS = 5000              # records per batch (225 kB of columns)
MAX_PACKETS = 1 << 48
MAX_BYTES = 1 << 56
MAX_TIME = 1e11                 # seconds since the epoch (the year 5138)
MAX_INTERVAL = 3600.0

HEADER = struct.Struct("!ddHHH")
# (name, array type code) of each column, in the batch's order
COLUMNS = (("point", "I"), ("src", "H"), ("dst", "H"), ("proto", "B"), ("sport", "H"), ("dport", "H"),
           ("packets", "Q"), ("bytes", "Q"), ("first", "Q"), ("last", "Q"))
WIDTHS = {"I": 4, "H": 2, "B": 1, "Q": 8}
RECORD_SIZE = sum(WIDTHS[code] for _, code in COLUMNS)
assert all(array(code).itemsize == width for code, width in WIDTHS.items())
SWAP = sys.byteorder == "little"        # arrays hold the host's order, the batch network order


class BadBatch(ValueError):
    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Batch:
    interval_end: float
    interval_s: float
    addresses: list[str]            # canonical text, as str(ipaddress.ip_address(...)) writes it
    columns: tuple[array, ...]      # COLUMNS' values; src and dst index `addresses`, first and last in ms

    def __len__(self) -> int:
        return len(self.columns[0])

    def records(self):
        """(point, src, dst, proto, sport, dport, packets, bytes, first, last) of each record."""
        return zip(*self.columns)


def encode(records: list[dict], interval_end: float, interval_s: float) -> bytes:
    """`records` as one batch: dicts of point, src and dst (addresses as text), proto, sport, dport,
    packets, bytes, first and last (seconds), as the agent's Aggregator.take makes them."""
    addresses = {text: ipaddress.ip_address(text) for r in records for text in (r["src"], r["dst"])}
    ordered = sorted(addresses, key=lambda text: addresses[text].version)      # IPv4 first
    index = {text: i for i, text in enumerate(ordered)}
    n4 = sum(1 for a in addresses.values() if a.version == 4)
    values = {"src": [index[r["src"]] for r in records], "dst": [index[r["dst"]] for r in records],
              "first": [round(r["first"] * 1000) for r in records], "last": [round(r["last"] * 1000) for r in records]}
    body = [HEADER.pack(interval_end, interval_s, n4, len(ordered) - n4, len(records)),
            *(addresses[text].packed for text in ordered)]
    for name, code in COLUMNS:
        column = array(code, values[name] if name in values else [r.get(name, 0) for r in records])
        if SWAP:
            column.byteswap()
        body.append(column.tobytes())
    return b"".join(body)


def decode(body: bytes) -> Batch:
    """The batch in `body`, checked whole; BadBatch when any of it is out of bounds."""
    if len(body) < HEADER.size:
        raise BadBatch(f"a batch is at least {HEADER.size} bytes, not {len(body)}", "body")
    interval_end, interval_s, n4, n6, n = HEADER.unpack_from(body)
    if not (math.isfinite(interval_end) and 0 <= interval_end <= MAX_TIME):
        raise BadBatch(f"interval_end is seconds since the epoch, 0..{MAX_TIME:g}", "interval_end")
    if not (math.isfinite(interval_s) and 0 < interval_s <= MAX_INTERVAL):
        raise BadBatch(f"interval_s is above 0 and at most {MAX_INTERVAL:g}", "interval_s")
    if n > MAX_RECORDS:
        raise BadBatch(f"a batch holds at most {MAX_RECORDS} records, not {n}", "records")
    if n4 + n6 > 2 * n:
        raise BadBatch(f"{n} records name at most {2 * n} addresses, not {n4 + n6}", "addresses")
    at = HEADER.size + 4 * n4 + 16 * n6
    if len(body) != at + n * RECORD_SIZE:
        raise BadBatch(f"the body is {len(body)} bytes, its counts say {at + n * RECORD_SIZE}", "body")
    addresses = [str(ipaddress.IPv4Address(body[i:i + 4])) for i in range(HEADER.size, HEADER.size + 4 * n4, 4)]
    addresses += [str(ipaddress.IPv6Address(body[i:i + 16])) for i in range(HEADER.size + 4 * n4, at, 16)]
    columns = {}
    for name, code in COLUMNS:
        column = columns[name] = array(code, body[at:at + n * WIDTHS[code]])
        if SWAP:
            column.byteswap()
        at += n * WIDTHS[code]
    if n:
        for name, top in (("src", len(addresses) - 1), ("dst", len(addresses) - 1), ("packets", MAX_PACKETS),
                          ("bytes", MAX_BYTES), ("first", MAX_TIME * 1000), ("last", MAX_TIME * 1000)):
            if max(columns[name]) > top:
                raise BadBatch(f"a record's {name} is above {top:g}", name)
    return Batch(interval_end, interval_s, addresses, tuple(columns.values()))
