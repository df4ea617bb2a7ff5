"""A small IPFIX (RFC 7011) reader for what Open vSwitch exports: template sets, options template
sets and data sets, the fields fathom's flow records use, nothing more.

`Reader.read(message)` checks the whole message before it uses any of it: version 10, a length
that is the datagram's, sets that tile the message exactly, template ids of 256 and up, field
specifiers within their template record, data records within their set. A message that breaks any
of these raises `Malformed` (the collector counts and drops it, and keeps nothing from it).
Templates are kept per observation domain, at most `max_templates` (OVS sends up to about 120 per
domain); a data set whose template is unknown (the exporter's templates are resent every
`template_interval`, 600 s by default) is skipped and counted. Values are read as the IEs' types
say (unsigned integers may come in fewer bytes: reduced-size encoding); fields of other IEs and of
enterprises are skipped by their length.
"""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

VERSION = 10
HEADER = struct.Struct("!HHIII")    # version, length, export time, sequence, observation domain
SET_HEADER = struct.Struct("!HH")   # set id, length
TEMPLATE_SET, OPTIONS_TEMPLATE_SET = 2, 3
VARIABLE = 0xFFFF
MAX_FIELDS = 512

# The IEs a flow record reads: IANA id -> (name, kind)
FIELDS = {
    1: ("bytes", "uint"), 2: ("packets", "uint"), 4: ("proto", "uint"), 7: ("sport", "uint"),
    8: ("src", "ipv4"), 11: ("dport", "uint"), 12: ("dst", "ipv4"), 27: ("src", "ipv6"), 28: ("dst", "ipv6"),
    138: ("point", "uint"), 176: ("icmp_type", "uint"), 177: ("icmp_code", "uint"),
    178: ("icmp_type", "uint"), 179: ("icmp_code", "uint"),
}
_SIZES = {"ipv4": 4, "ipv6": 16}


class Malformed(ValueError):
    pass


@dataclass(frozen=True)
class Template:
    fields: tuple[tuple[int, int, int], ...]   # (IE id, length, enterprise number; 0 = IANA)
    min_length: int                              # bytes of a record at least (variable fields: 1)


@dataclass
class Message:
    domain: int
    export_time: int
    records: list[dict]
    unknown_sets: int = 0         # data sets whose template is not known (yet)
    templates: int = 0            # template records read


class Reader:
    def __init__(self, max_templates: int = 1024):
        self.max_templates = max_templates
        self.templates: dict[tuple[int, int], Template] = {}   # (domain, template id) -> template

    def read(self, data: bytes) -> Message:
        if len(data) < HEADER.size:
            raise Malformed("shorter than a message header")
        version, length, export_time, _seq, domain = HEADER.unpack_from(data)
        if version != VERSION:
            raise Malformed(f"version {version}, not IPFIX (10)")
        if length != len(data):
            raise Malformed(f"message length {length} but {len(data)} bytes came")
        sets, pos = [], HEADER.size
        while pos < length:
            if length - pos < SET_HEADER.size:
                raise Malformed("a set header cut short")
            set_id, set_len = SET_HEADER.unpack_from(data, pos)
            if set_len < SET_HEADER.size or pos + set_len > length:
                raise Malformed(f"set {set_id} of length {set_len} does not fit the message")
            if set_id not in (TEMPLATE_SET, OPTIONS_TEMPLATE_SET) and set_id < 256:
                raise Malformed(f"set id {set_id} is reserved")
            sets.append((set_id, pos + SET_HEADER.size, pos + set_len))
            pos += set_len
        # templates first, checked whole, then kept: a message's data may use its own templates
        new: dict[tuple[int, int], Template] = {}
        for set_id, start, end in sets:
            if set_id in (TEMPLATE_SET, OPTIONS_TEMPLATE_SET):
                for tid, template in _templates(data, start, end, set_id == OPTIONS_TEMPLATE_SET):
                    new[(domain, tid)] = template
        if len(self.templates.keys() | new.keys()) > self.max_templates:
            raise Malformed(f"more than {self.max_templates} templates")
        out = Message(domain, export_time, [], templates=len(new))
        records: list[dict] = []
        for set_id, start, end in sets:
            if set_id < 256:
                continue
            template = new.get((domain, set_id)) or self.templates.get((domain, set_id))
            if template is None:
                out.unknown_sets += 1
                continue
            records += _records(data, start, end, template)
        self.templates.update(new)
        out.records = records
        return out


def _templates(data: bytes, pos: int, end: int, options: bool):
    while end - pos >= 4:
        tid, count = struct.unpack_from("!HH", data, pos)
        pos += 4
        if tid == 0 and count == 0 and not any(data[pos - 4:end]):
            return      # padding
        if options:
            if end - pos < 2:
                raise Malformed("options template cut short")
            pos += 2    # scope field count: the scope fields are ordinary field specifiers here
        if tid < 256:
            raise Malformed(f"template id {tid} is reserved")
        if not 0 < count <= MAX_FIELDS:
            raise Malformed(f"template {tid} has {count} fields")
        fields, min_length = [], 0
        for _ in range(count):
            if end - pos < 4:
                raise Malformed(f"template {tid} cut short")
            ie, flen = struct.unpack_from("!HH", data, pos)
            pos += 4
            enterprise = 0
            if ie & 0x8000:
                if end - pos < 4:
                    raise Malformed(f"template {tid} cut short")
                (enterprise,) = struct.unpack_from("!I", data, pos)
                pos += 4
                ie &= 0x7FFF
            if flen == 0:
                raise Malformed(f"template {tid}: field {ie} of length 0")
            name_kind = FIELDS.get(ie) if enterprise == 0 else None
            if name_kind and flen != VARIABLE and (
                    (name_kind[1] == "uint" and flen > 8) or
                    (name_kind[1] in _SIZES and flen != _SIZES[name_kind[1]])):
                raise Malformed(f"template {tid}: field {ie} of length {flen}")
            fields.append((ie, flen, enterprise))
            min_length += 1 if flen == VARIABLE else flen
        yield tid, Template(tuple(fields), min_length)
    if any(data[pos:end]):
        raise Malformed("template set ends in bytes that are not padding")


def _records(data: bytes, pos: int, end: int, t: Template) -> list[dict]:
    out = []
    while end - pos >= t.min_length:
        rec: dict = {}
        for ie, flen, enterprise in t.fields:
            if flen == VARIABLE:
                if pos >= end:
                    raise Malformed("a variable-length field cut short")
                flen, pos = data[pos], pos + 1
                if flen == 255:
                    if end - pos < 2:
                        raise Malformed("a variable-length field cut short")
                    (flen,), pos = struct.unpack_from("!H", data, pos), pos + 2
            if end - pos < flen:
                raise Malformed("a data record runs past its set")
            name_kind = FIELDS.get(ie) if enterprise == 0 else None
            if name_kind is not None and name_kind[0] not in rec:
                name, kind = name_kind
                raw = data[pos:pos + flen]
                if kind == "uint":
                    if flen > 8:
                        raise Malformed(f"field {ie} of length {flen}")
                    rec[name] = int.from_bytes(raw, "big")
                elif len(raw) == _SIZES[kind]:
                    rec[name] = str(ipaddress.ip_address(raw))
                else:
                    raise Malformed(f"field {ie} of length {flen}")
            pos += flen
        out.append(rec)
    if any(data[pos:end]):
        raise Malformed("a data set ends in bytes that are not padding")
    return out
