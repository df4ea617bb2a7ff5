"""Flow classifiers: their vocabulary (checked once, for the API and the store), the matches they
compile to, and when two of them overlap. Pure functions on the model.

A classifier names IPv4 traffic sent by its logical source port, optionally to its logical
destination port, narrowed by protocol, source / destination prefix and source / destination port
range (TCP or UDP). Two classifiers of different chains overlap when one packet from the same
source port could match both: the API refuses that, so a packet is never claimed by two chains.
A symmetric chain also classifies replies at the destination port with the mirrored classifier,
which takes part in the overlap check as well.
"""
from __future__ import annotations

import ipaddress
from dataclasses import replace

from fathom.openflow.masks import range_to_masks
from fathom.model import FlowClassifier, PortChain, Snapshot

ETH_IPV4 = 0x0800
PROTOCOLS = {"tcp": 6, "udp": 17, "icmp": 1}
PORT_FIELDS = {6: "tcp", 17: "udp"}


class ClassifierError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


def protocol_number(value) -> int | None:
    """tcp, udp, icmp, a number 0..255, or None / "" / "*" for any."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "*", "any")):
        return None
    if isinstance(value, bool):
        raise ClassifierError("protocol", "give tcp, udp, icmp or an IP protocol number")
    if isinstance(value, str) and value.strip().lower() in PROTOCOLS:
        return PROTOCOLS[value.strip().lower()]
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ClassifierError("protocol", "give tcp, udp, icmp or an IP protocol number") from None
    if not 0 <= n <= 255:
        raise ClassifierError("protocol", "an IP protocol number is 0..255")
    return n


def prefix(value, field: str) -> str | None:
    """An IPv4 prefix in canonical form ("10.0.0.0/24"; an address alone is /32); None for any."""
    if value is None or (isinstance(value, str) and value.strip() in ("", "*")):
        return None
    try:
        return str(ipaddress.IPv4Network(str(value).strip(), strict=True))
    except ValueError as e:
        raise ClassifierError(field, f"not an IPv4 prefix with host bits zero: {e}") from None


def port_range(low, high, field: str) -> tuple[int, int] | None:
    if low is None and high is None:
        return None
    low = high if low is None else low
    high = low if high is None else high
    for v, f in ((low, f"{field}_min"), (high, f"{field}_max")):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 65535:
            raise ClassifierError(f, "a port is 0..65535")
    if low > high:
        raise ClassifierError(f"{field}_max", f"the range {low}-{high} is empty (min > max)")
    return (low, high)


def check(fc: FlowClassifier) -> None:
    """Prerequisites between fields (ports need TCP or UDP)."""
    for rng, field in ((fc.source_port_range, "source_port_range_min"),
                       (fc.destination_port_range, "destination_port_range_min")):
        if rng is not None and fc.protocol not in PORT_FIELDS:
            raise ClassifierError(field, "port ranges need protocol tcp or udp")


def mirrored(fc: FlowClassifier) -> FlowClassifier | None:
    """The classifier of the replies (a symmetric chain's reverse direction): from the destination
    port back to the source, addresses and ports swapped; None without a destination port."""
    if fc.logical_destination_port_id is None:
        return None
    return replace(fc, logical_source_port_id=fc.logical_destination_port_id,
                   logical_destination_port_id=fc.logical_source_port_id,
                   source_ip_prefix=fc.destination_ip_prefix, destination_ip_prefix=fc.source_ip_prefix,
                   source_port_range=fc.destination_port_range, destination_port_range=fc.source_port_range)


def _masked_prefix(p: str | None):
    if p is None:
        return None
    net = ipaddress.IPv4Network(p)
    return str(net.network_address) if net.prefixlen == 32 else (str(net.network_address), str(net.netmask))


def _ranges(rng: tuple[int, int] | None) -> list:
    if rng is None or rng == (0, 65535):
        return [None]
    return [v if mk == 0xFFFF else (v, mk) for v, mk in range_to_masks(rng[0], rng[1])]


def matches(fc: FlowClassifier, destination_mac: str | None = None) -> list[dict]:
    """The OpenFlow matches of a classifier (without the source port, which the compiler adds as
    the frame's source-port register): port ranges expand into a few masked matches each. With a
    logical destination port, `destination_mac` is its MAC: the frame is sent to it (one network)."""
    base: dict = {"eth_type": ETH_IPV4}
    if destination_mac is not None:
        base["eth_dst"] = destination_mac
    if fc.protocol is not None:
        base["ip_proto"] = fc.protocol
    for field, p in (("ipv4_src", fc.source_ip_prefix), ("ipv4_dst", fc.destination_ip_prefix)):
        if p is not None:
            base[field] = _masked_prefix(p)
    out = []
    tp = PORT_FIELDS.get(fc.protocol)
    for s in _ranges(fc.source_port_range):
        for d in _ranges(fc.destination_port_range):
            m = dict(base)
            if s is not None:
                m[f"{tp}_src"] = s
            if d is not None:
                m[f"{tp}_dst"] = d
            out.append(m)
    return out


def _prefixes_meet(a: str | None, b: str | None) -> bool:
    return a is None or b is None or ipaddress.IPv4Network(a).overlaps(ipaddress.IPv4Network(b))


def _ranges_meet(a, b) -> bool:
    return a is None or b is None or (a[0] <= b[1] and b[0] <= a[1])


def overlap(a: FlowClassifier, b: FlowClassifier) -> bool:
    """Could one packet from the same source port match both?"""
    if a.logical_source_port_id != b.logical_source_port_id:
        return False
    if None not in (a.logical_destination_port_id, b.logical_destination_port_id) and \
            a.logical_destination_port_id != b.logical_destination_port_id:
        return False
    if None not in (a.protocol, b.protocol) and a.protocol != b.protocol:
        return False
    return (_prefixes_meet(a.source_ip_prefix, b.source_ip_prefix)
            and _prefixes_meet(a.destination_ip_prefix, b.destination_ip_prefix)
            and _ranges_meet(a.source_port_range, b.source_port_range)
            and _ranges_meet(a.destination_port_range, b.destination_port_range))


def entry_classifiers(snapshot: Snapshot, chain: PortChain) -> list[tuple[int, FlowClassifier]]:
    """(direction, classifier) by which traffic enters `chain`: 0 = forward; 1 = the mirrored
    classifiers of a symmetric chain (replies)."""
    by_id = {fc.id: fc for fc in snapshot.flow_classifiers}
    out = []
    for cid in chain.flow_classifier_ids:
        fc = by_id.get(cid)
        if fc is None:
            continue
        out.append((0, fc))
        if chain.symmetric:
            back = mirrored(fc)
            if back is not None:
                out.append((1, back))
    return out


def conflicting_chains(snapshot: Snapshot, chain_id: int) -> list[tuple[int, int]]:
    """(this chain's classifier id, other chain id) for every overlap between what enters
    `chain_id` and what enters another chain."""
    chains = {c.id: c for c in snapshot.port_chains}
    mine = chains.get(chain_id)
    if mine is None:
        return []
    out = set()
    own = entry_classifiers(snapshot, mine)
    for other in chains.values():
        if other.id == chain_id:
            continue
        theirs = entry_classifiers(snapshot, other)
        for _, a in own:
            if any(overlap(a, b) for _, b in theirs):
                out.add((a.id, other.id))
    return sorted(out)
