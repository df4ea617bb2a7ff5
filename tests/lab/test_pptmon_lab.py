"""PPTMon on real chains of VNF namespaces (root; veth, tc, iptables, tcpdump, tshark).

Each test builds its own chain (names start with 'ppl'), turns PPTMon on for every packet,
sends deterministic TCP and UDP traffic and checks, independently of PPTMon:
  * the server receives exactly the bytes the client sent,
  * no packet reaching the server still carries an option or a surplus area,
  * tshark finds no bad checksum (offloads off: every checksum on the wire is final),
  * the server's kernel counted no checksum error,
  * every record names every VNF of the chain with a processing time.
"""
import json
import os
import shutil
import time

import pytest

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


def check_chain(c, tmp_path, v6=False):
    """Traffic through chain c with PPTMon on every packet; all independent checks."""
    before = measure.nstat(c.server)
    pcap, mid = tmp_path / "server.pcap", tmp_path / "mid.pcap"
    # a second capture between VNF 1 and VNF 2 (host side), where options must be seen
    with measure.Capture(c.server, "eth0", pcap), \
            measure.Capture(c.host, "h1o" if c.n > 1 else "h0o", mid):
        sent, got = measure.transfer(c, "tcp", v6=v6, bytes=150_000)
        assert got == sent, "TCP byte stream differs"
        usent, ugot = measure.transfer(c, "udp", v6=v6, count=300, rate=3000)
        assert ugot == usent, "UDP datagrams differ"
    assert len(measure.tshark(pcap)) > 300
    if c.n > 1:  # the detector works: mid-chain packets carry the option
        left = measure.leftovers(mid)
        assert any(" TCP " in x for x in left) and any(" UDP " in x for x in left)
    after = measure.nstat(c.server)
    for k in ("TcpInCsumErrors", "UdpInCsumErrors", "Udp6InCsumErrors"):
        assert after.get(k, 0) == before.get(k, 0), k
    assert measure.leftovers(pcap) == []
    if not c.offloads:
        assert measure.bad_checksums(pcap) == []
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
    recs = check_chain(c, tmp_path)
    pcap = tmp_path / "server.pcap"
    assert measure.bad_checksums(pcap) == []
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


@pytest.mark.parametrize("proto", ["udp", "tcp"])
def test_accuracy_against_capture(make_chain, tmp_path, proto):
    """PPTMon's per-packet time against the same packets captured on both sides of the
    VNF (tcpdump, nanosecond kernel timestamps).  The capture taps sit just outside the
    hooks (rx tap before TC ingress, tx tap after TC egress), so the reference is expected
    a little larger."""
    c = make_chain(f"ppla{proto[0]}", ["firewall:200"], offloads=False, base=180 + len(proto))
    control.enable(c.name, period_ns=0)
    ns = c.vnf_ns(1)
    p_in, p_out = tmp_path / "in.pcap", tmp_path / "out.pcap"
    with measure.Capture(ns, "in0", p_in, proto), measure.Capture(ns, "out0", p_out, proto):
        if proto == "udp":
            measure.transfer(c, "udp", count=400, rate=500, size=[200])
        else:
            measure.transfer(c, "tcp", bytes=60_000)
    recs = [r for r in wait_records(c.name, 100) if r["flow"]["proto"] == proto]
    acc = measure.accuracy(recs, measure.timestamps(p_in, proto), measure.timestamps(p_out, proto))
    print("\naccuracy", proto, json.dumps(acc, indent=1))
    (tmp_path / "accuracy.json").write_text(json.dumps(acc))
    assert acc["matched"] >= 0.8 * len(recs) and acc["matched"] >= 50
    d = acc["ref_minus_pptmon"]
    # PPTMon's window lies inside the capture's: the reference is never smaller (beyond the
    # ±1 µs of PPTMon's microsecond stamps).  The receive tap's own work (≈ 10 µs on this
    # VM) sits between its timestamp and TC ingress, so the reference runs higher; the
    # difference is reported, and bounded here only loosely.
    assert d["min_us"] >= -1.5, d
    assert d["p50_us"] < 60, d


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
