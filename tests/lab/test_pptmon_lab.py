"""PPTMon on real chains of VNF namespaces (root; veth, tc, iptables, tcpdump, tshark).

Each test builds its own chain (names start with 'ppl' or 'pm'), turns PPTMon on for every
packet, sends deterministic TCP and UDP traffic and checks, independently of PPTMon:
  * the server receives exactly the bytes the client sent,
  * no packet reaching the server still carries an option or a surplus area,
  * full-size packets (1500-byte IP) carried the option inside the chain,
  * the server's kernel verified every checksum in software and counted no error, and
    tshark (whole packets captured) finds none wrong: with offloads on the chain carries
    CHECKSUM_PARTIAL packets and the veth towards the server completes them,
  * every record names every VNF of the chain with a processing time.
The no-room tests compare, byte for byte, the TCP segments the client sent with those the
server received (captures of whole packets at both ends).
"""
import json
import os
import shutil
import subprocess
import time

import pytest

from fathom.host import exec as host_exec
from fathom.lab import capture
from fathom.pptmon import chain as chainmod
from fathom.pptmon import control, measure, native

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0 or not native.built()
                       or not all(shutil.which(t) for t in ("tcpdump", "tshark", "iptables")),
                       reason="needs root, the native build, tcpdump, tshark and iptables"),
]

KINDS = ["firewall:50", "nat", "forward"]


@pytest.fixture
def make_chain():
    made = []

    def make(name, vnfs, offloads=True, base=100, **kw):
        c = chainmod.Chain(name=name, vnfs=chainmod.parse_vnfs(",".join(vnfs)), base=base,
                           offloads=offloads, **kw)
        control.down(name)  # leftovers of an interrupted run
        made.append(name)
        return chainmod.up(c)

    try:
        yield make
    finally:
        for name in made:
            control.down(name)


def wait_records(name, want, timeout=3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        recs = control.records(name)
        if len(recs) >= want:
            return recs
        time.sleep(0.1)
    return control.records(name)


def check_chain(c, tmp_path, v6=False, mid_final=None):
    """Traffic through chain c with PPTMon on every packet; all independent checks.
    mid_final: checksums between VNF 1 and VNF 2 are final (default: offloads off)."""
    measure.server_validates(c)
    dst = c.server_ip6 if v6 else c.server_ip
    before = measure.nstat(c.server)
    pcap, mid = tmp_path / "server.pcap", tmp_path / "mid.pcap"
    # a second capture between VNF 1 and VNF 2 (host side), where options must be seen
    with measure.capture(c.server, "eth0", pcap), \
            measure.capture(c.host, "h1o" if c.n > 1 else "h0o", mid):
        sent, got = measure.transfer(c, "tcp", v6=v6, bytes=150_000)
        assert got == sent, "TCP byte stream differs"
        usent, ugot = measure.transfer(c, "udp", v6=v6, count=300, rate=3000)
        assert ugot == usent, "UDP datagrams differ"
    assert len(capture.tshark(pcap)) > 300
    if c.n > 1:  # the detector works: mid-chain packets carry the option
        left = measure.leftovers(mid)
        assert any(" TCP " in x for x in left) and any(" UDP " in x for x in left)
    after = measure.nstat(c.server)
    for k in ("TcpInCsumErrors", "UdpInCsumErrors", "Udp6InCsumErrors"):
        assert after.get(k, 0) == before.get(k, 0), k
    # the server really checked: its software checksum verifications saw the packets
    assert after.get("TcpInSegs", 0) - before.get("TcpInSegs", 0) > 100
    to_server = capture.tshark(pcap, "-Y", f"ip{'v6' if v6 else ''}.dst == {dst}")
    assert len(to_server) > 300 and measure.bad_checksums(pcap, dst) == []

    assert measure.leftovers(pcap) == []
    if c.n > 1:  # full-size packets carried the option (the VNF links have MTU headroom)
        sizes = measure.marked_sizes(mid)
        assert sizes.get("tcp", 0) >= 1500 and sizes.get("udp", 0) >= 1500, sizes
        if (not c.offloads) if mid_final is None else mid_final:
            # mid-chain checksums are final too: check them, option inside (an error of
            # the source could otherwise be cancelled by the same error of the sink)
            assert measure.bad_checksums(mid, dst) == []
    recs = wait_records(c.name, 50)
    protos = {r["flow"]["proto"] for r in recs}
    assert protos == {"tcp", "udp"}, f"records for {protos} only ({len(recs)})"
    for r in recs:
        assert [h["vnf"] for h in r["hops"]] == list(range(1, c.n + 1))
        assert all(h["ppt_us"] is not None for h in r["hops"])
        assert r["e2e_us"] == sum(h["ppt_us"] for h in r["hops"])
        assert r["flow"]["family"] == (6 if v6 else 4)
    time.sleep(1.1)  # loaders print their counters every second
    for ns, cnt in control.counters(c.name).items():
        assert cnt["errors"] == 0, (ns, cnt)
    return recs


@pytest.mark.parametrize("offloads", [True, False], ids=["offloads-on", "offloads-off"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_chain_guest(make_chain, tmp_path, n, offloads):
    c = make_chain(f"ppl{n}{int(offloads)}", KINDS[:n], offloads=offloads, base=100 + 10 * n)
    control.enable(c.name, period_ns=0, placement="guest")
    recs = check_chain(c, tmp_path)
    assert len(recs) >= 50


def test_chain_host_mode(make_chain, tmp_path):
    c = make_chain("pplh", KINDS[:2], base=140)
    control.enable(c.name, period_ns=0, placement="host")
    check_chain(c, tmp_path)
    # the VNF namespaces themselves carry no filter of ours
    out = chainmod.run("tc", "filter", "show", "dev", "in0", "ingress", ns=c.vnf_ns(1)).stdout
    assert "ppt_" not in out


def test_chain_ipv6(make_chain, tmp_path):
    c = make_chain("ppl6", ["firewall:10", "forward"], base=150)
    control.enable(c.name, period_ns=0)
    check_chain(c, tmp_path, v6=True)


def test_partial_checksum_completed_mid_chain(make_chain, tmp_path):
    """Client with checksum offload (CHECKSUM_PARTIAL skbs), but VNF 1's output has none:
    the kernel completes the TCP/UDP checksums there, with the option inside.  The server,
    whose side has offloads off, verifies every checksum in software."""
    c = make_chain("pplx", ["forward", "forward"], offloads=True, base=160)
    for ns, dev in ((c.vnf_ns(1), "out0"), (c.host, "h1o"), (c.host, "h2i"), (c.vnf_ns(2), "in0"),
                    (c.vnf_ns(2), "out0"), (c.host, "h2o"), (c.host, "h3i"), (c.server, "eth0")):
        chainmod.run("ethtool", "-K", dev, "tx", "off", "tso", "off", "gso", "off", ns=ns)
    control.enable(c.name, period_ns=0)
    recs = check_chain(c, tmp_path, mid_final=True)
    assert len(recs) >= 50


def test_period_and_detach(make_chain):
    c = make_chain("pplp", ["forward"], base=170)
    # someone else's filter on the same hook must survive enable/disable
    ns = c.vnf_ns(1)
    other = str(native.BUILD / "testpass.bpf.o")
    chainmod.run("tc", "qdisc", "add", "dev", "in0", "clsact", ns=ns)
    chainmod.run("tc", "filter", "add", "dev", "in0", "ingress", "pref", "7", "bpf", "da",
                 "obj", other, "sec", "tc", ns=ns)
    control.enable(c.name, period_ns=10**9)
    measure.transfer(c, "udp", count=200, rate=400)   # 0.5 s at one sample per second
    n1 = len(wait_records(c.name, 1))
    assert 1 <= n1 <= 2
    control.set_period(c.name, 0)
    measure.transfer(c, "udp", count=200, rate=2000)
    assert len(wait_records(c.name, n1 + 150)) >= n1 + 150
    control.disable(c.name)
    out = chainmod.run("tc", "filter", "show", "dev", "in0", "ingress", ns=ns).stdout
    assert "other_pass" in out and "ppt_" not in out
    out = chainmod.run("tc", "filter", "show", "dev", "out0", "egress", ns=ns).stdout
    assert "ppt_" not in out


# PPTMon's own median for the accuracy test's VNF (a 200-rule firewall) at this machine's usual
# speed (5-7 µs for either protocol): the bound the test scales by how busy the machine is
USUAL_PPTMON_P50_US = 7.0


@pytest.mark.parametrize("proto", ["udp", "tcp"])
def test_accuracy_against_capture(make_chain, tmp_path, proto):
    """PPTMon's per-packet time against the same packets captured on both sides of the
    VNF (tcpdump, nanosecond kernel timestamps), with the bounds docs/pptmon.md (Accuracy)
    states.  The capture's window holds PPTMon's: its receive stamp is taken when the
    packet is queued to in0, its transmit stamp after TC egress.  UDP goes in pairs, two
    datagrams back to back every 2 ms: the first finds a cold path, the second a warm one."""
    c = make_chain(f"ppla{proto[0]}", ["firewall:200"], offloads=False, base=180 + len(proto))
    control.enable(c.name, period_ns=0)
    ns = c.vnf_ns(1)
    p_in, p_out = tmp_path / "in.pcap", tmp_path / "out.pcap"
    with measure.capture(ns, "in0", p_in, proto), measure.capture(ns, "out0", p_out, proto):
        if proto == "udp":
            measure.transfer(c, "udp", count=800, rate=500, burst=2, size=[200])
        else:
            measure.transfer(c, "tcp", bytes=60_000)
    recs = [r for r in wait_records(c.name, 100) if r["flow"]["proto"] == proto]
    acc = measure.accuracy(recs, measure.timestamps(p_in, proto), measure.timestamps(p_out, proto))
    print("\naccuracy", proto, json.dumps(acc, indent=1))
    (tmp_path / "accuracy.json").write_text(json.dumps(acc))
    assert acc["matched"] >= 0.8 * len(recs) and acc["matched"] >= 50
    d = acc["ref_minus_pptmon"]
    # PPTMon never exceeds the reference beyond its 1 µs resolution
    assert d["min_us"] >= -1.5, d
    # The bounds below are the kernel's path around the hooks on this machine at its usual speed,
    # where PPTMon's own median for this VNF is at most USUAL_PPTMON_P50_US; in a run where the
    # whole path is slower (a vCPU the host runs late), they grow by as much (docs/pptmon.md, Accuracy)
    slower = max(1.0, acc["pptmon"]["p50_us"] / USUAL_PPTMON_P50_US)
    if proto == "tcp":
        # documented 0.2-0.6 µs on kernel build fc-v782, 0.9 µs on fc-v669 (after the egress stamp 0.1-0.16
        # and 0.48 µs): the kernel's path around the hooks, outside PPTMon's window
        assert d["p50_us"] < 2.0 * slower, (d, slower)
        assert acc["after_egress_stamp"]["p50_us"] < 1.5 * slower, (acc, slower)
    else:
        warm = acc["ref_minus_pptmon_right_after_another"]
        cold = acc["ref_minus_pptmon_after_pause"]
        assert warm["count"] >= 200 and cold["count"] >= 200
        assert warm["p50_us"] < 3.0 * slower, (warm, slower)   # documented 0.5-0.6 µs (fc-v782), 1.4-1.8 µs (fc-v669)
        # documented 2.1-4.3 µs, 6.7 µs in a CI run whose PPTMon median was only 8 µs: nearly all of it
        # before PPTMon's ingress hook, where an idle vCPU's wake-up lands (the kernel's, not PPTMon's)
        assert cold["p50_us"] < 8.0 * slower, (cold, slower)
        # after PPTMon's egress stamp only the transmit tap is left (0.3-0.5 µs documented);
        # the sink's restore and record used to come after it: about 1 µs more on a cold path
        # (0.3-0.5 µs documented on fc-v782, 0.5-0.7 µs on fc-v669)
        assert acc["after_egress_stamp_after_pause"]["p50_us"] < 1.5 * slower, (acc, slower)


def test_foreign_filter_on_our_slot_is_left_alone(make_chain):
    """A filter of another program at our exact handle and priority: enable refuses
    (instead of replacing it) and leaves it in place."""
    c = make_chain("pplf", ["forward"], base=175)
    ns = c.vnf_ns(1)
    other = str(native.BUILD / "testpass.bpf.o")
    chainmod.run("tc", "qdisc", "add", "dev", "in0", "clsact", ns=ns)
    chainmod.run("tc", "filter", "add", "dev", "in0", "ingress", "pref", "1", "handle", "0x5046",
                 "bpf", "da", "obj", other, "sec", "tc", ns=ns)
    with pytest.raises(chainmod.ChainError, match="another program"):
        control.enable(c.name, period_ns=0)
    out = chainmod.run("tc", "filter", "show", "dev", "in0", "ingress", ns=ns).stdout
    assert "other_pass" in out and "ppt_" not in out
    out = chainmod.run("tc", "filter", "show", "dev", "out0", "egress", ns=ns).stdout
    assert "ppt_" not in out


# ---- the option never leaves the chain, even when a hop has no room -------------------

def segments_at_both_ends(c, tmp_path, traffic):
    """Run traffic() with whole-packet captures on the client's and the server's eth0 and
    return (TCP segments the client sent, TCP segments from the client the server got)."""
    p_cli, p_srv, p_mid = tmp_path / "client.pcap", tmp_path / "server.pcap", tmp_path / "mid.pcap"
    with measure.capture(c.client, "eth0", p_cli, "tcp"), measure.capture(c.server, "eth0", p_srv, "tcp"), \
            measure.capture(c.host, "h1o", p_mid, "tcp"):
        traffic()
    return measure.l4_bytes(p_cli, c.client_ip), measure.l4_bytes(p_srv, c.client_ip), p_mid


def per_connection(segments: list[bytes]) -> dict[bytes, list[bytes]]:
    """Segments by their port pair, each connection's as a multiset (sorted): what is checked is
    that every segment arrives byte for byte. Their order may change on the way, even within one
    connection: a client's ACKs leave from whichever CPU received the data they acknowledge, and
    each veth hop hands a frame on in the sending CPU's backlog, so two ACKs on two CPUs race
    through the chain (seen: the same 661 segments in another order)."""
    out: dict[bytes, list[bytes]] = {}
    for seg in segments:
        out.setdefault(seg[:4], []).append(seg)
    return {pair: sorted(segs) for pair, segs in out.items()}


def test_syn_through_four_vnfs_byte_identical(make_chain, tmp_path):
    """Linux's SYN has 20 bytes of options (MSS, SACK permitted, timestamps, window scale):
    with the source's 12 and two transit entries the option space is full at the sink.  The
    sink still removes the option: every segment reaches the server byte for byte as the
    client sent it (TCP header, checksum field and data; offloads on, so the checksum field
    holds the CHECKSUM_PARTIAL seed on both sides), and the SYN's record has 3 hops and says
    the sink could not be measured."""
    c = make_chain("pmsyn", ["forward", "firewall:10", "forward", "forward"], base=40)
    control.enable(c.name, period_ns=0)
    sent, got, mid = segments_at_both_ends(
        c, tmp_path, lambda: measure.transfer(c, "tcp", bytes=20_000))
    syns = [b for b in sent if b[13] & 0x02]
    assert len(syns) == 1 and (syns[0][12] >> 4) * 4 == 40        # 20 bytes of options
    assert len(sent) > 10 and per_connection(got) == per_connection(sent)
    assert any(line for line in capture.tshark(mid, "-Y", "tcp.flags.syn == 1 && tcp.option_kind == 254"))
    recs = wait_records(c.name, 5)
    syn_recs = [r for r in recs if r["flow"]["tcp_seq"] == int.from_bytes(syns[0][4:8], "big")]
    assert len(syn_recs) == 1
    r = syn_recs[0]
    assert [h["vnf"] for h in r["hops"]] == [1, 2, 3] and r["skipped"] == 1
    assert r["sink_measured"] is False and r["restored"] is True and r["e2e_us"] is None
    # the data segments (12 bytes of timestamps) had room at every hop
    assert any(x["skipped"] == 0 and len(x["hops"]) == 4 for x in recs)
    time.sleep(1.1)
    cnt = control.counters(c.name)
    assert cnt[c.vnf_ns(4)]["skip_nospace"] >= 1 and all(v["errors"] == 0 and v["leaked"] == 0
                                                          for v in cnt.values())


def test_timestamps_and_sack_through_three_vnfs_byte_identical(make_chain, tmp_path):
    """The client's ACKs with timestamps and one SACK block (24 bytes of options): with the
    source's 12 and VNF 2's 4 the space is full at VNF 3, the sink.  The server streams to
    the client (iperf3 -R) and VNF 3 drops one of every 40 of its data segments, so the
    client acknowledges with SACK blocks; every client segment must reach the server
    unchanged (offloads on)."""
    c = make_chain("pmsack", ["forward", "forward", "forward"], base=50)
    chainmod.run("iptables", "-A", "FORWARD", "-p", "tcp", "--sport", "5411", "-m", "statistic",
                 "--mode", "nth", "--every", "40", "--packet", "7", "-j", "DROP", ns=c.vnf_ns(3))
    control.enable(c.name, period_ns=0)
    srv = subprocess.Popen(host_exec.argv(["iperf3", "-s", "-1", "-p", "5411"], c.server),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)

        def traffic():
            p = chainmod.run("iperf3", "-c", c.server_ip, "-p", "5411", "-R", "-t", "2", "-b", "200M",
                             ns=c.client, timeout=30)
            assert p.returncode == 0
        sent, got, _ = segments_at_both_ends(c, tmp_path, traffic)
    finally:
        srv.wait(timeout=10)

    def sack_blocks(seg):
        opts, i, blocks = seg[20:(seg[12] >> 4) * 4], 0, 0
        while i < len(opts) and opts[i] != 0:
            if opts[i] == 1:
                i += 1
                continue
            if opts[i] == 5:
                blocks += (opts[i + 1] - 2) // 8
            i += max(2, opts[i + 1])
        return blocks

    one_block = [s for s in sent if sack_blocks(s) == 1 and (s[12] >> 4) * 4 == 44]
    assert len(one_block) >= 3, "no ACK with timestamps and exactly one SACK block"
    assert per_connection(got) == per_connection(sent)
    recs = [r for r in wait_records(c.name, 50) if r["skipped"]]
    assert recs and all([h["vnf"] for h in r["hops"]] == [1, 2] and r["skipped"] == 1
                        and not r["sink_measured"] and r["restored"] for r in recs)
    time.sleep(1.1)
    assert all(v["errors"] == 0 and v["leaked"] == 0 for v in control.counters(c.name).values())
