"""The live trace's eBPF programs (native/pptmon/livetrace.bpf.c) loaded into the kernel and run with
BPF_PROG_TEST_RUN over crafted frames (native/pptmon/livetrace-testrun.c).

The programs fail open: a frame that is not exactly an armed trace's probe (or its answer) —
truncated at any header, IPv4 options or a bad IHL, a fragment, tagged too deep, IPv6, a mark that
differs or is cut short, oversize or GSO — passes (TC_ACT_OK) with its bytes as they were and is
not reported, at ingress and at egress, with or without the injection socket's skb mark. Only the
trace's own frames are reported, turned around (the injected probe) or dropped (its answer at the
source port). Frames are built with scapy, the probe by fathom.trace.probe as the agent builds it.
"""
import os

import pytest
from scapy.all import ARP, ICMP, IP, TCP, UDP, Ether, IPv6, Raw
from scapy.layers.inet import IPOption_EOL, IPOption_NOP
from scapy.layers.inet6 import ICMPv6EchoRequest
from scapy.layers.vxlan import VXLAN

from fathom.pptmon import native
from fathom.trace.probe import LIVE_DSCP, Probe

TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT = 0, 2, 7
INJECT_MARK = 0x66744C54                # LT_INJECT_MARK of native/pptmon/livetrace.h
LO = 1                                  # BPF_PROG_TEST_RUN runs the programs on the loopback device
INGRESS, EGRESS, INJECTED = 0, 1, 2
SYN, RST, ACK = 0x02, 0x04, 0x10
PROBE = Probe(0x1234, 0xBEEF, 0x0007)
TCP_PROBE = Probe(0x4321, 0xCAFE, 0x0009)
MACS, IPS = ("02:fa:00:00:01:01", "02:fa:00:00:01:03"), ("198.19.1.11", "198.19.1.13")
ICMP_TAG, TCP_TAG = 11, 12


def _probe(size: int = 84) -> bytes:
    return PROBE.frame(*MACS, *IPS, 64, size)


def _syn(reset: bool = False) -> bytes:
    return TCP_PROBE.frame(*MACS, *IPS, 64, 40, tcp=(49152, 80), reset=reset)


def _ip(p: Probe = PROBE, **fields) -> IP:
    return IP(**{"src": IPS[1], "dst": IPS[0], "tos": p.dscp << 2, "id": p.ip_id, "flags": "DF", **fields})


def _reply() -> bytes:
    """The destination VM's echo reply: the probe's DSCP, ICMP id and sequence; its own IP ID."""
    return bytes(Ether(src=MACS[1], dst=MACS[0]) / _ip(id=0x0101) / ICMP(type=0, id=PROBE.icmp_id, seq=PROBE.icmp_seq))


def _answer(flags: str) -> bytes:
    """The destination's answer to the TCP probe (SYN-ACK or RST-ACK), acknowledging its sequence + 1."""
    return bytes(Ether(src=MACS[1], dst=MACS[0]) / IP(src=IPS[1], dst=IPS[0]) /
                 TCP(sport=80, dport=49152, flags=flags, seq=77, ack=TCP_PROBE.tcp_seq + 1))


def _vxlan(inner: bytes, vni: int = 1001) -> bytes:
    return bytes(Ether(dst=MACS[0]) / IP(src="198.18.0.10", dst="198.18.0.11") / UDP(sport=40000, dport=4789) / VXLAN(vni=vni)) + inner


def _tagged(frame: bytes, *tags: tuple[int, int]) -> bytes:
    return frame[:12] + b"".join(tpid.to_bytes(2, "big") + vid.to_bytes(2, "big") for tpid, vid in tags) + frame[12:]


def _with_ihl(frame: bytes, ihl: int) -> bytes:
    return frame[:14] + bytes([0x40 | ihl]) + frame[15:]


class LiveTraceRunner(native.TestRunner):
    __test__ = False

    def run(self, prog: str, frame: bytes, mark: int = 0) -> tuple[int, bytes, list[dict]]:
        self.cmd(f"mark {mark}")
        r = self.cmd(f"run {prog} {frame.hex()}")
        return r["retval"], bytes.fromhex(r["data"]), r["seen"]


@pytest.fixture(scope="module")
def tr():
    # under `make test` the suite runs as root with the native build made: anything less is a failure
    assert os.geteuid() == 0, "the eBPF programs are loaded into the kernel: run as root"
    assert native.LIVETRACE_TESTRUN.exists(), f"{native.LIVETRACE_TESTRUN} is missing: run `make native`"
    r = LiveTraceRunner(native.LIVETRACE_TESTRUN)
    try:
        r.cmd("gso 0 0")
        # an ICMP trace whose answer stops at the test device, and a TCP trace whose answer does not
        r.cmd(f"arm 0 {ICMP_TAG} {LIVE_DSCP} {PROBE.ip_id} {PROBE.icmp_id} {PROBE.icmp_seq} icmp {LO}")
        r.cmd(f"arm 2 {TCP_TAG} {LIVE_DSCP} {TCP_PROBE.ip_id} {TCP_PROBE.icmp_id} {TCP_PROBE.icmp_seq} tcp 999")
        yield r
    finally:
        r.close()


def test_the_probe_and_its_answer_are_seen_turned_around_and_stopped(tr):
    probe = _probe()
    assert probe == bytes(Ether(probe))                  # scapy reads it as it is: a real echo request
    for frame, where in ((probe, {}), (_tagged(probe, (0x8100, 120)), {"vlan": 120}),
                         (_tagged(probe, (0x88A8, 7), (0x8100, 120)), {"vlan": 120}),   # the inner tag's
                         (_vxlan(probe), {"encap": 1, "vni": 1001, "outer_src": "198.18.0.10"}),
                         (_probe(1500), {}),
                         # IPv4 options: the ICMP header found after them
                         (probe[:14] + bytes(_ip(src=IPS[0], dst=IPS[1], options=[IPOption_NOP()] * 3 + [IPOption_EOL()])
                                             / ICMP(id=PROBE.icmp_id, seq=PROBE.icmp_seq)), {})):
        verdict, data, seen = tr.run("in", frame)
        assert (verdict, data) == (TC_ACT_OK, frame)
        assert len(seen) == 1 and seen[0].items() >= {"tag": ICMP_TAG, "dir": INGRESS, "kind": 8, "proto": 1,
                                                      "ifindex": LO, "src": IPS[0], "dst": IPS[1],
                                                      "len": len(frame), **where}.items(), seen
        assert seen[0]["ktime_ns"] > 0
    # from the injection socket: turned into the interface's ingress, reported as injected
    verdict, data, seen = tr.run("out", probe, INJECT_MARK)
    assert (verdict, data, [s["dir"] for s in seen]) == (TC_ACT_REDIRECT, probe, [INJECTED])
    # the reply: seen, and stopped at the source port (here the test device)
    verdict, data, seen = tr.run("out", _reply())
    assert (verdict, data, [(s["kind"], s["dir"]) for s in seen]) == (TC_ACT_SHOT, _reply(), [(0, EGRESS)])
    assert tr.run("in", _reply())[0] == TC_ACT_OK


def test_a_tcp_probe_is_reported_by_its_flags_and_its_reset_is_not(tr):
    for frame, prog, flags, kind in ((_syn(), "in", SYN, 8), (_answer("SA"), "out", SYN | ACK, 0),
                                     (_answer("RA"), "in", RST | ACK, 0)):
        verdict, data, seen = tr.run(prog, frame)
        assert (verdict, data) == (TC_ACT_OK, frame)      # its answer stops at another port (999)
        assert [(s["tag"], s["proto"], s["tcp_flags"], s["kind"]) for s in seen] == [(TCP_TAG, 6, flags, kind)]
    # the RST after the probe: turned around when injected, never reported
    assert tr.run("out", _syn(reset=True), INJECT_MARK)[::2] == (TC_ACT_REDIRECT, [])
    assert tr.run("in", _syn(reset=True)) == (TC_ACT_OK, _syn(reset=True), [])


def _not_probes() -> dict[str, bytes]:
    probe, syn = _probe(), _syn()
    icmp_at, tcp_at = 14 + 20, 14 + 20
    fragment = bytes(Ether(dst=MACS[0]) / _ip(frag=0, proto=1, flags="MF") / ICMP(id=PROBE.icmp_id, seq=PROBE.icmp_seq) / Raw(b"x" * 32))
    # a later fragment whose payload, where an ICMP header would be, carries the probe's mark
    later = bytes(Ether(dst=MACS[0]) / _ip(frag=4, proto=1, flags=0) / Raw(bytes(ICMP(id=PROBE.icmp_id, seq=PROBE.icmp_seq))))
    frames = {
        # (BPF_PROG_TEST_RUN refuses an IPv4 frame shorter than an IPv4 header: cut behind a tag)
        "Ethernet header only (a tag's ethertype)": _tagged(probe, (0x8100, 5))[:14],
        "802.1Q tag cut short": _tagged(probe, (0x8100, 5))[:16],
        "IPv4 header cut short": _tagged(probe, (0x8100, 5))[:18 + 19],
        "ICMP header cut before its sequence (the mark cut short)": probe[:icmp_at + 6],
        "ICMP header cut before its identifier": probe[:icmp_at + 4],
        "TCP header cut before its flags": syn[:tcp_at + 13],
        "TCP header cut before its sequence": syn[:tcp_at + 6],
        "IHL 4": _with_ihl(probe, 4), "IHL 0": _with_ihl(probe, 0),
        "IHL 15 past the frame's end": _with_ihl(probe, 15)[:14 + 60],
        "IPv4 options pushing the ICMP header past the end": _with_ihl(probe, 6)[:14 + 24 + 4],
        "IP version 6 in an IPv4 ethertype": probe[:14] + bytes([0x65]) + probe[15:],
        "first fragment of the probe": fragment,
        "later fragment carrying the mark": later,
        "later fragment carrying the reply's mark (at the source port)": bytes(
            Ether(dst=MACS[0]) / _ip(frag=4, proto=1, flags=0) / Raw(bytes(ICMP(type=0, id=PROBE.icmp_id, seq=PROBE.icmp_seq)))),
        "three tags deep": _tagged(probe, (0x88A8, 1), (0x8100, 2), (0x8100, 3)),
        "IPv6 echo with the probe's identifier and sequence": bytes(
            Ether(dst=MACS[0]) / IPv6(src="2001:db8::1", dst="2001:db8::2", tc=LIVE_DSCP << 2) /
            ICMPv6EchoRequest(id=PROBE.icmp_id, seq=PROBE.icmp_seq)),
        "ARP": bytes(Ether(dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=IPS[0], pdst=IPS[1])),
        "another DSCP": probe[:15] + bytes([0]) + probe[16:],
        "another IP ID": probe[:18] + b"\x12\x35" + probe[20:],
        "another ICMP identifier": probe[:icmp_at + 4] + b"\xbe\xee" + probe[icmp_at + 6:],
        "another ICMP sequence": probe[:icmp_at + 6] + b"\x00\x08" + probe[icmp_at + 8:],
        "ICMP type 3 with the mark": probe[:icmp_at] + b"\x03" + probe[icmp_at + 1:],
        "echo reply with another sequence": bytes(Ether(dst=MACS[0]) / _ip(id=1) / ICMP(type=0, id=PROBE.icmp_id, seq=8)),
        "ICMP with the TCP trace's mark": bytes(Ether(dst=MACS[0]) / _ip(TCP_PROBE) / ICMP(id=TCP_PROBE.icmp_id, seq=TCP_PROBE.icmp_seq)),
        "TCP with the ICMP trace's mark": bytes(Ether(dst=MACS[0]) / _ip() / TCP(flags="S", seq=PROBE.tcp_seq)),
        "SYN with another sequence number": bytes(Ether(dst=MACS[0]) / _ip(TCP_PROBE) / TCP(flags="S", seq=TCP_PROBE.tcp_seq + 2)),
        "SYN-FIN with the mark": bytes(Ether(dst=MACS[0]) / _ip(TCP_PROBE) / TCP(flags="SF", seq=TCP_PROBE.tcp_seq)),
        "bare ACK of sequence + 1": bytes(Ether(dst=MACS[0]) / IP() / TCP(flags="A", ack=TCP_PROBE.tcp_seq + 1)),
        "SYN-ACK of another sequence": bytes(Ether(dst=MACS[0]) / IP() / TCP(flags="SA", ack=TCP_PROBE.tcp_seq)),
        "UDP, not VXLAN": bytes(Ether(dst=MACS[0]) / IP() / UDP(dport=53) / Raw(probe[14:])),
        "VXLAN header cut short": _vxlan(probe)[:14 + 20 + 8 + 4],
        "VXLAN with the inner frame cut short": _vxlan(probe)[:14 + 20 + 16 + 14 + 20 + 5],
        "VXLAN in VXLAN": _vxlan(_vxlan(probe)),
        "oversize frame, not a probe": bytes(Ether(dst=MACS[0]) / IP() / UDP(dport=9) / Raw(b"\xff" * 3000)),
        "IPv4 total length beyond the frame": bytes(Ether(dst=MACS[0]) / IP(len=65535) / ICMP(id=1, seq=2) / Raw(b"\x00" * 3000)),
    }
    return frames


def test_every_frame_that_is_not_the_probe_passes_as_it_was(tr):
    """Fail open: at ingress and egress, with and without the injection mark, every crafted frame
    passes unchanged and unreported; with GSO too; and the probe itself once no trace is armed."""
    failed = []
    for gso in ((0, 0), (2, 1448)):
        tr.cmd(f"gso {gso[0]} {gso[1]}")
        for what, frame in _not_probes().items():
            for prog in ("in", "out"):
                for mark in (0, INJECT_MARK):
                    got = tr.run(prog, frame, mark)
                    if got != (TC_ACT_OK, frame, []):
                        failed.append((what, prog, mark, gso, got[0], got[2]))
    tr.cmd("gso 0 0")
    assert failed == [], sorted({f[0] for f in failed})
    try:
        for slot in (0, 2):
            tr.cmd(f"disarm {slot}")
        for frame in (_probe(), _reply(), _syn(), _answer("SA")):
            for prog in ("in", "out"):
                assert tr.run(prog, frame, INJECT_MARK) == (TC_ACT_OK, frame, [])
    finally:
        tr.cmd(f"arm 0 {ICMP_TAG} {LIVE_DSCP} {PROBE.ip_id} {PROBE.icmp_id} {PROBE.icmp_seq} icmp {LO}")
        tr.cmd(f"arm 2 {TCP_TAG} {LIVE_DSCP} {TCP_PROBE.ip_id} {TCP_PROBE.icmp_id} {TCP_PROBE.icmp_seq} tcp 999")
