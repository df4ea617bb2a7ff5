"""PPTMon eBPF programs through BPF_PROG_TEST_RUN on packets crafted with scapy.

Every check is made against fathom.pptmon.wire (an independent model of the format)
and an independent checksum computation, never against the programs' own output.
"""
import os
import struct
import time

import pytest
from scapy.all import ARP, ICMP, IP, TCP, UDP, Dot1AD, Dot1Q, Ether, IPv6, Raw
from scapy.layers.inet6 import IPv6ExtHdrHopByHop

from fathom.pptmon import native, wire
from fathom.pptmon.native import IN_NONE, IN_SOURCE, IN_TRANSIT

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not native.TESTRUN.exists(),
    reason="needs root and the native build (make -C native/pptmon)")

SRC4, DST4 = "198.18.200.2", "198.18.203.2"
SRC6, DST6 = "2001:2:0:c8::2", "2001:2:0:cb::2"


@pytest.fixture(scope="module")
def tr():
    r = native.TestRunner()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(autouse=True)
def _fresh(tr):
    tr.gso(0, 0)
    tr.reset_sampling()


# ---- independent packet model ------------------------------------------------------

def l3_offset(frame: bytes) -> tuple[int, int]:
    off, eth = 12, struct.unpack("!H", frame[12:14])[0]
    off = 14
    while eth in (0x8100, 0x88A8):
        eth = struct.unpack("!H", frame[off + 2:off + 4])[0]
        off += 4
    return off, eth


def split(frame: bytes):
    """(l3 offset, family, ip header bytes, l4 bytes (to the IP end), proto)."""
    off, eth = l3_offset(frame)
    if eth == 0x0800:
        ihl = (frame[off] & 0xF) * 4
        tot = struct.unpack("!H", frame[off + 2:off + 4])[0]
        return off, 4, frame[off:off + ihl], frame[off + ihl:off + tot], frame[off + 9]
    plen = struct.unpack("!H", frame[off + 4:off + 6])[0]
    return off, 6, frame[off:off + 40], frame[off + 40:off + 40 + plen], frame[off + 6]


def pseudo(family, iph, proto, length):
    if family == 4:
        return iph[12:20] + struct.pack("!BBH", 0, proto, length)
    return iph[8:40] + struct.pack("!IxxxB", length, proto)


def assert_checksums(frame: bytes):
    off, fam, iph, l4, proto = split(frame)
    if fam == 4:
        assert wire.inet_sum(iph) == 0xFFFF, "bad IPv4 header checksum"
    if proto == 6:
        assert wire.inet_sum(pseudo(fam, iph, proto, len(l4)) + l4) == 0xFFFF, "bad TCP checksum"
    elif proto == 17:
        ulen = struct.unpack("!H", l4[4:6])[0]
        if struct.unpack("!H", l4[6:8])[0] != 0:
            dg = l4[:ulen]
            assert wire.inet_sum(pseudo(fam, iph, proto, ulen) + dg) == 0xFFFF, "bad UDP checksum"
        if len(l4) > ulen:
            assert wire.ocs_ok(l4[ulen:], ulen), "bad OCS"


def option_of(frame: bytes) -> wire.Option | None:
    _, _, _, l4, proto = split(frame)
    return wire.tcp_option(l4) if proto == 6 else wire.udp_option(l4)


def tcp4(payload=b"p" * 100, options=(), **kw):
    return bytes(Ether() / IP(src=SRC4, dst=DST4, id=77, **kw)
                 / TCP(sport=40000, dport=5201, seq=1000, flags="PA", options=list(options))
                 / Raw(payload))


def udp4(payload=b"u" * 101, **kw):
    return bytes(Ether() / IP(src=SRC4, dst=DST4, id=78, **kw) / UDP(sport=40001, dport=5202)
                 / Raw(payload))


TS = [("NOP", None), ("NOP", None), ("Timestamp", (123, 456))]


def chain(tr, frame: bytes, n: int):
    """Run a frame through an n-VNF chain: VNF 1 source, 2..n-1 transit, n sink."""
    steps = []
    for i in range(1, n + 1):
        role = IN_SOURCE if i == 1 else IN_TRANSIT
        tr.config(in_role=role, sink=(i == n), vnf=i)
        rv, frame, _ = tr.run("in", frame)
        assert rv == -1
        steps.append(("in", i, frame))
        rv, frame, recs = tr.run("out", frame)
        assert rv == -1
        steps.append(("out", i, frame))
    return frame, recs, steps


# ---- TCP --------------------------------------------------------------------------

def test_tcp_source_exact_bytes(tr):
    orig = tcp4(options=TS)
    tr.config(in_role=IN_SOURCE, vnf=7)
    rv, out, recs = tr.run("in", orig)
    assert rv == -1 and recs == []
    off, _, iph, l4, _ = split(out)
    o_off, _, o_iph, o_l4, _ = split(orig)
    # IP total length +12, TCP data offset +3 words
    assert struct.unpack("!H", iph[2:4])[0] == struct.unpack("!H", o_iph[2:4])[0] + 12
    assert (l4[12] >> 4) == (o_l4[12] >> 4) + 3
    assert len(out) == len(orig) + 12
    # option right after the base header, exact header bytes
    assert l4[20:28] == bytes([254, 12, 0x50, 0x46, 0x11, 1, 0, 0])
    assert l4[28] == 7  # VNF id, then a 24-bit timestamp
    # the original options and payload follow, unchanged
    assert l4[32:] == o_l4[20:]
    assert l4[:12] == o_l4[:12] and l4[13:16] == o_l4[13:16]
    assert_checksums(out)
    opt = option_of(out)
    assert opt and opt.flags == wire.F_PENDING and [h.vnf for h in opt.hops] == [7]


def test_tcp_source_sink_restores_original(tr):
    orig = tcp4(options=TS)
    tr.config(in_role=IN_SOURCE, sink=True, vnf=3)
    start = time.monotonic_ns()          # the clock bpf_ktime_get_ns reads
    _, mid, _ = tr.run("in", orig)
    rv, out, recs = tr.run("out", mid)
    elapsed_us = (time.monotonic_ns() - start) / 1000
    assert out == orig
    assert len(recs) == 1
    r = recs[0]
    assert r["sink_vnf"] == 3 and [h["vnf"] for h in r["hops"]] == [3]
    # the hop's time lies between the two runs: within the time around them (1 us of rounding)
    assert r["hops"][0]["ppt_us"] is not None and 0 <= r["hops"][0]["ppt_us"] <= elapsed_us + 1
    assert r["flow"] == {"family": 4, "proto": "tcp", "src": SRC4, "dst": DST4, "sport": 40000,
                         "dport": 5201, "ip_id": 77, "tcp_seq": 1000, "l4_len": len(split(orig)[3])}


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_tcp_chain(tr, n):
    orig = tcp4(options=TS)
    out, recs, steps = chain(tr, orig, n)
    assert out == orig
    for where, i, frame in steps[:-1]:
        assert_checksums(frame)
        opt = option_of(frame)
        assert opt is not None and [h.vnf for h in opt.hops] == list(range(1, i + 1))
        # egress clears the pending flag, ingress sets it
        assert bool(opt.flags & wire.F_PENDING) == (where == "in")
        assert len(frame) == len(orig) + 8 + 4 * i
    assert len(recs) == 1
    assert [h["vnf"] for h in recs[0]["hops"]] == list(range(1, n + 1))
    assert all(h["ppt_us"] is not None for h in recs[0]["hops"])
    assert recs[0]["e2e_us"] == sum(h["ppt_us"] for h in recs[0]["hops"])


def test_tcp_transit_entry_exact(tr):
    orig = tcp4()
    tr.config(in_role=IN_SOURCE, vnf=1)
    _, a, _ = tr.run("in", orig)
    _, b, _ = tr.run("out", a)
    tr.config(in_role=IN_TRANSIT, vnf=9)
    _, c, _ = tr.run("in", b)
    l4b, l4c = split(b)[3], split(c)[3]
    assert l4c[20:28] == bytes([254, 16, 0x50, 0x46, 0x11, 2]) + l4b[26:28]
    assert l4c[28:32] == l4b[28:32]  # hop 1 untouched (already a duration)
    assert l4c[32] == 9
    assert l4c[36:] == l4b[32:]
    assert_checksums(c)


def test_tcp_option_space_full_unchanged(tr):
    # 40 bytes of options already: nothing fits
    full = [("NOP", None)] * 2 + [("Timestamp", (1, 2))] + [("SAckOK", b"")] * 1 + \
        [("NOP", None)] * 2 + [("SAck", (1, 2, 3, 4))] + [("NOP", None)] * 6
    orig = tcp4(options=full)
    assert (split(orig)[3][12] >> 4) == 15
    tr.config(in_role=IN_SOURCE, vnf=1)
    before = tr.stats()["skip_nospace"]
    rv, out, _ = tr.run("in", orig)
    assert out == orig and rv == -1
    assert tr.stats()["skip_nospace"] == before + 1
    # 32 bytes of options: 12 more would make 44 > 40
    orig = tcp4(options=[("NOP", None)] * 32)
    _, out, _ = tr.run("in", orig)
    assert out == orig


# Options a real TCP stack sends: a SYN (MSS, SACK permitted, timestamps, window scale: 20
# bytes, as Linux sends it) and a segment with timestamps and one SACK block (24 bytes).
SYN_OPTS = [("MSS", 1460), ("SAckOK", b""), ("Timestamp", (1, 0)), ("NOP", None), ("WScale", 7)]
TS_SACK = [("NOP", None), ("NOP", None), ("Timestamp", (5, 6)),
           ("NOP", None), ("NOP", None), ("SAck", (1000, 2000))]


def syn4(**kw):
    return bytes(Ether() / IP(src=SRC4, dst=DST4, id=79, **kw)
                 / TCP(sport=40002, dport=5201, seq=7, flags="S", window=64240, options=SYN_OPTS))


def tcp_opt_len(frame: bytes) -> int:
    return (split(frame)[3][12] >> 4) * 4 - 20


@pytest.mark.parametrize("case,n,measured", [
    ("ts+sack", 3, 2),     # 24 + 12 + 4 = 40: the sink (hop 3) has no room
    ("syn", 4, 3),         # 20 + 12 + 4 + 4 = 40: the sink (hop 4) has no room
    ("ts", 7, 5),          # 12 + 12 + 4 * 4 = 40: hops 6 and 7 have no room
    ("syn", 8, 3),
])
def test_no_room_the_option_still_never_leaves_the_chain(tr, case, n, measured):
    """A hop that finds no option room counts itself in the option; the sink removes the
    option whatever it finds and the packet leaves exactly as it entered.  The record has
    the hops that were measured and says how many were not, the sink among them."""
    orig = {"ts+sack": tcp4(options=TS_SACK), "syn": syn4(), "ts": tcp4(options=TS)}[case]
    s0 = tr.stats()
    out, recs, steps = chain(tr, orig, n)
    assert out == orig
    for where, i, frame in steps[:-1]:
        assert_checksums(frame)
        opt = option_of(frame)
        assert [h.vnf for h in opt.hops] == list(range(1, min(i, measured) + 1))
        assert opt.skipped == max(0, i - measured)
        assert tcp_opt_len(frame) <= 40
    assert len(recs) == 1
    r = recs[0]
    assert [h["vnf"] for h in r["hops"]] == list(range(1, measured + 1))
    assert all(h["ppt_us"] is not None for h in r["hops"])
    assert r["skipped"] == n - measured and r["sink_measured"] is False and r["restored"] is True
    assert r["e2e_us"] is None   # not the whole chain
    assert r["flow"]["l4_len"] == len(split(orig)[3])
    s1 = tr.stats()
    assert s1["skip_nospace"] - s0["skip_nospace"] == n - measured
    assert s1["skip_counted"] - s0["skip_counted"] == n - measured
    assert s1["stripped"] - s0["stripped"] == 1 and s1["errors"] == s0["errors"]
    assert s1["leaked"] == s0["leaked"]


def test_no_room_syn_exact_bytes(tr):
    """The 4-VNF SYN at the sink's ingress: the option is full (40 bytes of options), the
    sink adds nothing but counts itself: flags byte 0x10 | skipped << 1, checksum right."""
    frame = syn4()
    for i in range(1, 4):
        tr.config(in_role=IN_SOURCE if i == 1 else IN_TRANSIT, vnf=i)
        _, frame, _ = tr.run("in", frame)
        _, frame, _ = tr.run("out", frame)
    tr.config(in_role=IN_TRANSIT, sink=True, vnf=4)
    _, at_sink, _ = tr.run("in", frame)
    l4a, l4b = split(frame)[3], split(at_sink)[3]
    assert len(at_sink) == len(frame) and tcp_opt_len(at_sink) == 40
    assert l4b[20:28] == bytes([254, 20, 0x50, 0x46, 0x12, 3]) + l4a[26:28]
    assert l4b[28:] == l4a[28:] and l4b[:16] == l4a[:16]
    assert_checksums(at_sink)
    _, out, recs = tr.run("out", at_sink)
    assert out == syn4() and recs[0]["skipped"] == 1


def test_hop_cap_udp(tr):
    """UDP has no option-space limit, but the hop cap (8): hops 9 and 10 are counted."""
    orig = udp4(payload=b"c" * 33)
    out, recs, steps = chain(tr, orig, 10)
    assert out == orig
    r = recs[0]
    assert [h["vnf"] for h in r["hops"]] == list(range(1, 9))
    assert r["skipped"] == 2 and r["sink_measured"] is False and r["e2e_us"] is None
    for _, _, frame in steps[:-1]:
        assert_checksums(frame)


@pytest.mark.parametrize("l4", ["tcp", "udp"])
def test_mtu_at_one_hop(tr, l4):
    """VNF 2's MTU is too small for one more entry: it counts itself, VNF 3 (the sink) adds
    its entry; the record names VNFs 1 and 3 and says one was missed."""
    orig = tcp4(payload=b"m" * 1400, options=TS) if l4 == "tcp" else udp4(payload=b"m" * 1400)
    frame, steps = orig, []
    for i in (1, 2, 3):
        mtu = len(split(frame)[3]) + 20 + 3 if i == 2 else 0   # 4 more bytes do not fit
        tr.config(in_role=IN_SOURCE if i == 1 else IN_TRANSIT, sink=(i == 3), vnf=i, mtu=mtu)
        _, frame, _ = tr.run("in", frame)
        steps.append(frame)
        _, frame, recs = tr.run("out", frame)
    assert frame == orig
    assert option_of(steps[1]).skipped == 1 and len(steps[1]) == len(steps[0])
    for f in steps:
        assert_checksums(f)
    r = recs[0]
    assert [h["vnf"] for h in r["hops"]] == [1, 3] and r["skipped"] == 1
    assert r["sink_measured"] is True and r["e2e_us"] is None


def test_tcp_source_no_room_unchanged(tr):
    # 40 bytes of options already: the source cannot insert; nothing is marked
    full = [("NOP", None)] * 2 + [("Timestamp", (1, 2))] + [("SAckOK", b"")] * 1 + \
        [("NOP", None)] * 2 + [("SAck", (1, 2, 3, 4))] + [("NOP", None)] * 6
    orig = tcp4(options=full)
    assert (split(orig)[3][12] >> 4) == 15
    tr.config(in_role=IN_SOURCE, vnf=1)
    before = tr.stats()["skip_nospace"]
    rv, out, _ = tr.run("in", orig)
    assert out == orig and rv == -1
    assert tr.stats()["skip_nospace"] == before + 1
    # 32 bytes of options: 12 more would make 44 > 40
    orig = tcp4(options=[("NOP", None)] * 32)
    _, out, _ = tr.run("in", orig)
    assert out == orig


def test_tcp_ip_options_and_padding(tr):
    orig = bytes(Ether() / IP(src=SRC4, dst=DST4, options=[b"\x94\x04\x00\x00"])
                 / TCP(sport=1, dport=2, flags="A") / Raw(b"ab"))
    orig_padded = orig + b"\0" * (60 - len(orig)) if len(orig) < 60 else orig
    for frame in (orig, orig_padded):
        out, recs, _ = chain(tr, frame, 2)
        assert out == frame and len(recs) == 1


def test_gso_packet_untouched(tr):
    orig = tcp4(payload=b"g" * 1400)
    tr.gso(2, 700)
    tr.config(in_role=IN_SOURCE, sink=True, vnf=1)
    before = tr.stats()["skip_gso"]
    _, out, _ = tr.run("in", orig)
    assert out == orig
    assert tr.stats()["skip_gso"] == before + 1
    tr.gso(0, 0)
    _, out, _ = tr.run("in", orig)  # the next eligible packet is sampled
    assert option_of(out) is not None


def test_mtu_checked_before_growing(tr):
    orig = tcp4(payload=b"m" * 1440)  # IP length 1480
    tr.config(in_role=IN_SOURCE, vnf=1, mtu=1490)
    _, out, _ = tr.run("in", orig)
    assert out == orig
    tr.config(in_role=IN_SOURCE, vnf=1, mtu=1492)
    _, out, _ = tr.run("in", orig)
    assert len(out) == len(orig) + 12
    u = udp4(payload=b"m" * 1452)  # IP length 1480, +1 pad? no: UDP length 1460 even -> +14
    tr.config(in_role=IN_SOURCE, vnf=1, mtu=1493)
    _, out, _ = tr.run("in", u)
    assert out == u
    tr.config(in_role=IN_SOURCE, vnf=1, mtu=1494)
    _, out, _ = tr.run("in", u)
    assert len(out) == len(u) + 14


def test_sampling_period(tr):
    orig = tcp4()
    tr.config(in_role=IN_SOURCE, vnf=1, period_ns=10_000_000_000)
    _, a, _ = tr.run("in", orig)
    _, b, _ = tr.run("in", orig)
    assert option_of(a) is not None and b == orig
    tr.config(in_role=IN_SOURCE, vnf=1, period_ns=0)  # every packet
    seqs = []
    for _ in range(3):
        _, c, _ = tr.run("in", orig)
        seqs.append(option_of(c).seq)
    assert seqs == [seqs[0], seqs[0] + 1, seqs[0] + 2]


def test_disabled_and_not_ours(tr):
    orig = tcp4()
    tr.config(in_role=IN_SOURCE, vnf=1, enabled=False)
    _, out, _ = tr.run("in", orig)
    assert out == orig
    tr.config(in_role=IN_SOURCE, vnf=1)
    _, marked, _ = tr.run("in", orig)
    tr.config(in_role=IN_NONE, vnf=2)  # VNF 2's egress (transit): hop 1 is not its own
    before = tr.stats()["not_ours"]
    _, out, recs = tr.run("out", marked)
    assert out == marked and recs == []
    assert tr.stats()["not_ours"] == before + 1
    # a sink removes the option even when no entry is its own
    tr.config(in_role=IN_NONE, sink=True, vnf=2)
    _, out, recs = tr.run("out", marked)
    assert out == orig
    assert recs[0]["hops"] == [{"vnf": 1, "ppt_us": None}] and recs[0]["sink_measured"] is False


def test_unfinalised_hop_reported_unknown(tr):
    orig = tcp4()
    tr.config(in_role=IN_SOURCE, vnf=1)
    _, a, _ = tr.run("in", orig)  # VNF 1's egress program never runs
    tr.config(in_role=IN_TRANSIT, sink=True, vnf=2)
    _, b, _ = tr.run("in", a)
    assert_checksums(b)
    _, out, recs = tr.run("out", b)
    assert out == orig
    assert recs[0]["hops"][0] == {"vnf": 1, "ppt_us": None} and recs[0]["e2e_us"] is None


# ---- UDP --------------------------------------------------------------------------

@pytest.mark.parametrize("plen", [100, 101])
def test_udp_source_exact_surplus(tr, plen):
    orig = udp4(payload=b"u" * plen)
    tr.config(in_role=IN_SOURCE, vnf=4)
    _, out, _ = tr.run("in", orig)
    _, _, o_iph, o_l4, _ = split(orig)
    _, _, iph, l4, _ = split(out)
    ulen = 8 + plen
    assert l4[:ulen] == o_l4  # UDP header (length, checksum) and data unchanged
    surplus = l4[ulen:]
    pad = ulen % 2
    assert len(surplus) == pad + 2 + 12
    if pad:
        assert surplus[0] == 0
    assert surplus[pad + 2:pad + 10] == bytes([127, 12, 0x50, 0x46, 0x11, 1, 0, 0])
    assert surplus[pad + 10] == 4
    assert wire.ocs_ok(surplus, ulen)
    assert struct.unpack("!H", iph[2:4])[0] == struct.unpack("!H", o_iph[2:4])[0] + len(surplus)
    assert_checksums(out)
    # the model produces the same surplus from the decoded option
    opt = option_of(out)
    assert wire.udp_surplus(opt, ulen) == surplus


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("plen", [64, 65])
def test_udp_chain(tr, n, plen):
    orig = udp4(payload=bytes(range(plen)))
    out, recs, steps = chain(tr, orig, n)
    assert out == orig
    for where, i, frame in steps[:-1]:
        assert_checksums(frame)
        opt = option_of(frame)
        assert [h.vnf for h in opt.hops] == list(range(1, i + 1))
        assert bool(opt.flags & wire.F_PENDING) == (where == "in")
    assert [h["vnf"] for h in recs[0]["hops"]] == list(range(1, n + 1))
    assert recs[0]["flow"]["proto"] == "udp" and recs[0]["flow"]["l4_len"] == 8 + plen


def test_udp_zero_checksum_and_existing_surplus(tr):
    z = bytearray(udp4())
    z[14 + 20 + 6:14 + 20 + 8] = b"\0\0"  # IPv4 UDP checksum disabled
    z = bytes(z)
    out, recs, _ = chain(tr, z, 2)
    assert out == z and len(recs) == 1
    # a datagram that already has a surplus area (someone else's options) is left alone
    base = Ether() / IP(src=SRC4, dst=DST4) / UDP(sport=1, dport=2, len=8 + 10) / Raw(b"d" * 10)
    other = bytes(base / Raw(b"\x00\x00\x01\x00"))
    tr.config(in_role=IN_SOURCE, vnf=1)
    _, out, _ = tr.run("in", other)
    assert out == other


# ---- IPv6, VLAN, other protocols -----------------------------------------------------

@pytest.mark.parametrize("l4", ["tcp", "udp"])
def test_ipv6_chain(tr, l4):
    seg = TCP(sport=3, dport=4, flags="A", seq=5, options=TS) if l4 == "tcp" else UDP(sport=3, dport=4)
    orig = bytes(Ether() / IPv6(src=SRC6, dst=DST6) / seg / Raw(b"six" * 33))
    tr.config(in_role=IN_SOURCE, vnf=1)
    _, a, _ = tr.run("in", orig)
    assert_checksums(a)
    grow = 12 if l4 == "tcp" else 14 + 1  # UDP length 8 + 99 is odd: one pad byte
    assert struct.unpack("!H", a[18:20])[0] == struct.unpack("!H", orig[18:20])[0] + grow
    out, recs, _ = chain(tr, orig, 3)
    assert out == orig
    assert recs[0]["flow"]["family"] == 6 and recs[0]["flow"]["src"] == SRC6


@pytest.mark.parametrize("tags", [1, 2])
@pytest.mark.parametrize("l4", ["tcp", "udp"])
def test_vlan_chain(tr, tags, l4):
    vl = Dot1Q(vlan=100) if tags == 1 else Dot1AD(vlan=200) / Dot1Q(vlan=100)
    seg = TCP(sport=3, dport=4, flags="A", options=TS) if l4 == "tcp" else UDP(sport=3, dport=4)
    orig = bytes(Ether() / vl / IP(src=SRC4, dst=DST4) / seg / Raw(b"v" * 50))
    tr.config(in_role=IN_SOURCE, vnf=1)
    _, a, _ = tr.run("in", orig)
    assert option_of(a) is not None
    assert_checksums(a)
    out, recs, _ = chain(tr, orig, 2)
    assert out == orig and len(recs) == 1


@pytest.mark.parametrize("pkt", [
    Ether() / IP(src=SRC4, dst=DST4) / ICMP() / Raw(b"ping"),
    Ether() / ARP(psrc=SRC4, pdst=DST4),
    Ether() / IP(src=SRC4, dst=DST4, flags="MF") / UDP(sport=1, dport=2) / Raw(b"frag" * 10),
    Ether() / IP(src=SRC4, dst=DST4, frag=100) / Raw(b"frag" * 10),
    Ether() / IPv6(src=SRC6, dst=DST6) / IPv6ExtHdrHopByHop() / TCP(sport=1, dport=2) / Raw(b"x"),
    Ether() / IP(src=SRC4, dst=DST4, proto=132) / Raw(b"sctp-ish" * 4),
], ids=["icmp", "arp", "frag-first", "frag-later", "ipv6-ext", "sctp"])
def test_other_protocols_unchanged(tr, pkt):
    orig = bytes(pkt)
    for role, sink in ((IN_SOURCE, False), (IN_TRANSIT, True)):
        tr.config(in_role=role, sink=sink, vnf=1)
        for prog in ("in", "out"):
            rv, out, recs = tr.run(prog, orig)
            assert out == orig and recs == [] and rv == -1


def test_counters_move(tr):
    s0 = tr.stats()
    chain(tr, tcp4(), 2)
    s1 = tr.stats()
    assert s1["sampled"] == s0["sampled"] + 1
    assert s1["appended"] == s0["appended"] + 1
    assert s1["reported"] == s0["reported"] + 1
    assert s1["stripped"] == s0["stripped"] + 1
    assert s1["errors"] == s0["errors"]


# ---- fail open; checksum states ----------------------------------------------------

def v6(seg, payload=b"six" * 33):
    return bytes(Ether() / IPv6(src=SRC6, dst=DST6) / seg / Raw(payload))


PACKETS = {
    "tcp4": lambda: tcp4(options=TS),
    "udp4": lambda: udp4(payload=b"o" * 101),
    "tcp6": lambda: v6(TCP(sport=3, dport=4, flags="A", seq=5, options=TS)),
    "udp6": lambda: v6(UDP(sport=3, dport=4)),
    "syn4": syn4,
}


def step_input(tr, kind: str, step: str):
    """(program, frame, config) for one step of a chain, from a real upstream run."""
    orig = PACKETS[kind]()
    if step == "source":
        return "in", orig, dict(in_role=IN_SOURCE, vnf=1)
    if step == "skip":   # a hop that finds no room: counts itself in place
        n = 3 if kind == "syn4" else (8 if kind.startswith("udp") else 5)
        frame = orig
        for i in range(1, n + 1):
            tr.config(in_role=IN_SOURCE if i == 1 else IN_TRANSIT, vnf=i)
            _, frame, _ = tr.run("in", frame)
            _, frame, _ = tr.run("out", frame)
        return "in", frame, dict(in_role=IN_TRANSIT, vnf=n + 1)
    tr.config(in_role=IN_SOURCE, vnf=1)
    _, a, _ = tr.run("in", orig)
    _, b, _ = tr.run("out", a)
    if step == "append":
        return "in", b, dict(in_role=IN_TRANSIT, vnf=2)
    tr.config(in_role=IN_TRANSIT, vnf=2)
    _, c, _ = tr.run("in", b)
    if step == "finalise":
        return "out", c, dict(in_role=IN_TRANSIT, vnf=2)
    assert step == "strip"
    return "out", c, dict(in_role=IN_TRANSIT, sink=True, vnf=2)


STEPS = ["source", "append", "skip", "finalise", "strip"]


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("kind", ["tcp4", "udp4", "tcp6", "udp6", "syn4"])
def test_every_failure_passes_the_packet_unchanged(tr, kind, step):
    """Make each fallible helper call of the step fail in turn (loads, checksum
    differences, bpf_skb_change_tail, the first store of an in-place rewrite): the packet
    must come out exactly as it went in, counted as an error (and, at the sink, as a
    leak, with a record saying the packet was not restored)."""
    prog, frame, cfg = step_input(tr, kind, step)
    tr.config(**cfg)
    tr.reset_sampling()
    _, good, _ = tr.run(prog, frame)
    calls = tr.fallible
    assert good != frame and calls >= 1
    try:
        for nth in range(1, calls + 1):
            tr.fault(nth)
            tr.reset_sampling()
            s0 = tr.stats()
            rv, out, recs = tr.run(prog, frame)
            s1 = tr.stats()
            assert rv == -1 and out == frame, f"failure at fallible call {nth} of {calls}"
            assert s1["errors"] == s0["errors"] + 1
            if cfg.get("sink"):
                assert s1["leaked"] == s0["leaked"] + 1
                assert all(r["restored"] is False for r in recs)
    finally:
        tr.fault(0)


@pytest.mark.parametrize("step", ["finalise", "skip"])
@pytest.mark.parametrize("kind", ["tcp4", "udp4", "tcp6", "udp6"])
def test_in_place_rewrites_keep_checksum_complete(tr, kind, step):
    """With CHECKSUM_COMPLETE the kernel checks after the run that skb->csum still is the
    sum of the packet (BPF_F_TEST_SKB_CHECKSUM_COMPLETE; EBADMSG otherwise).  The in-place
    rewrites keep it; the resizing paths start with bpf_skb_change_tail, which turns a
    COMPLETE skb into CHECKSUM_NONE."""
    prog, frame, cfg = step_input(tr, kind, step)
    tr.config(**cfg)
    tr.csum_complete(True)
    try:
        _, out, _ = tr.run(prog, frame)
    finally:
        tr.csum_complete(False)
    assert out != frame and len(out) == len(frame)
    assert_checksums(out)


def test_tcp_checksum_zero_restored_exactly(tr):
    """A segment whose TCP checksum is 0x0000 (its sum is 0xffff): incremental updates
    must come back to 0x0000, not the other zero 0xffff."""
    # with a zero word in the payload the checksum is C = ~S; putting C into that word
    # makes the sum S + ~S = 0xffff, whose checksum is 0x0000
    first = tcp4(payload=b"z" * 40 + b"\0\0", options=TS)
    orig = tcp4(payload=b"z" * 40 + split(first)[3][16:18], options=TS)
    assert split(orig)[3][16:18] == b"\0\0"
    out, recs, _ = chain(tr, orig, 3)
    assert out == orig and len(recs) == 1
