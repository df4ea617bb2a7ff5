"""MAC and IPv4 address checks shared by the API, the lab topology and the tap identifiers.

Each returns the canonical text form (lower-case MAC, dotted IPv4) or raises ValueError with a
message meant for the person who typed the value.
"""
from __future__ import annotations

import ipaddress
import re

MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def parse_mac(value: object, *, unicast_for: str | None = None) -> str:
    """A MAC address like 02:00:00:00:00:01. `unicast_for` ("a port", "a VM") also refuses
    multicast and all-zero addresses, naming what needs a unicast one."""
    text = str(value).strip().lower()
    if not MAC_RE.match(text):
        raise ValueError(f"{value!r} is not a MAC address like 02:00:00:00:00:01")
    if unicast_for:
        if int(text[:2], 16) & 1:
            raise ValueError(f"{text} is a multicast MAC; {unicast_for} needs a unicast one")
        if text == "00:00:00:00:00:00":
            raise ValueError("00:00:00:00:00:00 is not a usable MAC")
    return text


def parse_ipv4(value: object) -> str:
    try:
        return str(ipaddress.IPv4Address(str(value).strip()))
    except ValueError:
        raise ValueError(f"{value!r} is not an IPv4 address") from None
