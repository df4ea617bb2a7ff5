"""Pure-Python parts of PPTMon: wire model, statistics, periods, chain model, CLI wiring."""
import struct

import pytest
from click.testing import CliRunner

from fathom.pptmon import chain as chainmod
from fathom.pptmon import control, stats, wire


def test_option_roundtrip_and_bytes():
    opt = wire.Option(hops=[wire.Hop(1, 12), wire.Hop(2, 0xABCDEF)], seq=0x0102, flags=0)
    b = opt.pack(wire.TCP_KIND)
    assert b == bytes([254, 16, 0x50, 0x46, 0x10, 2, 1, 2, 1, 0, 0, 12, 2, 0xAB, 0xCD, 0xEF])
    assert wire.Option.unpack(b, wire.TCP_KIND) == opt
    assert wire.Option.unpack(b, wire.UDP_KIND) is None          # wrong kind
    bad = bytearray(b)
    bad[1] = 12                                                  # length disagrees with hops
    assert wire.Option.unpack(bytes(bad), wire.TCP_KIND) is None


@pytest.mark.parametrize("udp_len", [9, 10, 1000, 1001])
def test_udp_surplus_layout_and_ocs(udp_len):
    opt = wire.Option(hops=[wire.Hop(3, 5)], seq=7, flags=wire.F_PENDING)
    s = wire.udp_surplus(opt, udp_len)
    pad = udp_len % 2
    assert len(s) == pad + 2 + 12 and (not pad or s[0] == 0)
    assert s[pad + 2] == wire.UDP_KIND
    assert wire.ocs_ok(s, udp_len)
    # OCS = checksum over (surplus length from the OCS, OCS..end)
    t = s[pad:]
    assert wire.inet_sum(struct.pack("!H", len(t)) + t) == 0xFFFF
    broken = bytearray(s)
    broken[-1] ^= 0x40
    assert not wire.ocs_ok(bytes(broken), udp_len)


def test_inet_checksum_known_value():
    # RFC 1071 example words
    data = bytes([0x00, 0x01, 0xF2, 0x03, 0xF4, 0xF5, 0xF6, 0xF7])
    assert wire.inet_sum(data) == 0xDDF2
    assert wire.inet_checksum(data) == 0x220D


def test_percentiles_and_chain_stats():
    assert stats.percentile([1, 2, 3, 4], 50) == 2.5
    assert stats.percentile([5], 99) == 5
    recs = [{"hops": [{"vnf": 1, "ppt_us": v}, {"vnf": 2, "ppt_us": 2 * v}], "e2e_us": 3 * v}
            for v in range(1, 101)]
    recs.append({"hops": [{"vnf": 1, "ppt_us": None}, {"vnf": 2, "ppt_us": 4}], "e2e_us": None})
    s = stats.chain_stats(recs)
    assert s["records"] == 101 and s["incomplete"] == 1
    assert s["vnfs"][1]["count"] == 100 and s["vnfs"][2]["count"] == 101
    assert s["vnfs"][1]["p50_us"] == 50.5 and s["e2e"]["max_us"] == 300
    assert stats.summarize([])["count"] == 0


@pytest.mark.parametrize("text,ns", [("1s", 10**9), ("500ms", 5 * 10**8), ("0", 0),
                                     ("20/s", 5 * 10**7), ("0.5/s", 2 * 10**9), ("250us", 250_000),
                                     ("2", 2 * 10**9)])
def test_parse_period(text, ns):
    assert control.parse_period(text) == ns


def test_parse_period_rejects():
    for bad in ("fast", "-1s", "0/s"):
        with pytest.raises(ValueError):
            control.parse_period(bad)


def test_chain_model():
    c = chainmod.Chain(name="ppx", vnfs=chainmod.parse_vnfs("fw:100,nat,fwd"), base=200)
    c.validate()
    assert [v.label() for v in c.vnfs] == ["firewall:100", "nat", "forward"]
    assert c.client_ip == "198.18.200.1" and c.server_ip == "198.18.203.2"
    assert c.server_ip6 == "2001:2:0:cb::2"
    assert c.namespaces() == ["ppx-host", "ppx-client", "ppx-vnf1", "ppx-vnf2", "ppx-vnf3",
                              "ppx-server"]
    assert chainmod.Chain.from_json(c.to_json()) == c
    assert control._modes(1) == ["source-sink"]
    assert control._modes(3) == ["source", "transit", "sink"]
    assert control.attach_points(c, 2, "guest") == ("ppx-vnf2", "in0:ingress", "out0:egress")
    assert control.attach_points(c, 2, "host") == ("ppx-host", "h2i:egress", "h2o:ingress")
    for bad in (dict(name="lab1"), dict(name="ppTOOLONGNAME"), dict(name="ppx", vnfs=[]),
                dict(name="ppx", base=254, vnfs=chainmod.parse_vnfs("fwd,fwd")),
                dict(name="ppx", vnfs=[chainmod.Vnf(kind="ids")])):
        with pytest.raises(chainmod.ChainError):
            chainmod.Chain(**bad).validate()


def test_firewall_rules_never_match_chain_traffic():
    rules = chainmod._firewall_rules(300)
    lines = [x for x in rules.splitlines() if x.startswith("-A FORWARD")]
    assert len(lines) == 300 and len(set(lines)) == 300
    assert all(" -s 198.19." in x for x in lines)  # chain traffic is 198.18.0.0/16


def test_cli_group(tmp_path, monkeypatch):
    from fathom.cli.pptmon import pptmon
    r = CliRunner().invoke(pptmon, ["--help"])
    assert r.exit_code == 0 and "enable" in r.output and "stats" in r.output
    monkeypatch.setattr(chainmod, "STATE_ROOT", tmp_path)
    monkeypatch.setattr(control, "STATE_ROOT", tmp_path)
    d = tmp_path / "ppz"
    d.mkdir()
    c = chainmod.Chain(name="ppz", vnfs=chainmod.parse_vnfs("fwd,fwd"))
    (d / "chain.json").write_text(__import__("json").dumps(c.to_json()))
    rec = {"type": "ppt", "time_ns": 1, "hops": [{"vnf": 1, "ppt_us": 3}, {"vnf": 2, "ppt_us": 4}],
           "e2e_us": 7, "flow": {}}
    (d / "vnf2.jsonl").write_text(__import__("json").dumps(rec) + "\n{partial")
    r = CliRunner().invoke(pptmon, ["stats", "ppz", "--json"])
    assert r.exit_code == 0, r.output
    out = __import__("json").loads(r.output)
    assert out["records"] == 1 and out["e2e"]["p50_us"] == 7
    r = CliRunner().invoke(pptmon, ["stats", "ppz"])
    assert "end-to-end" in r.output


def test_chain_list_beside_the_bpffs_mount(tmp_path, monkeypatch):
    """The loaders' bpffs is mounted at <state>/.bpffs and outlives every chain; a lookup of
    a file that was never pinned there fails with EPERM.  `chain list` must skip it."""
    import ctypes
    import json
    import os
    import subprocess

    from fathom.cli.pptmon import pptmon
    if os.geteuid() != 0:
        pytest.fail("needs root to mount a bpffs")
    monkeypatch.setattr(chainmod, "STATE_ROOT", tmp_path)
    monkeypatch.setattr(control, "STATE_ROOT", tmp_path)
    bpffs = tmp_path / ".bpffs"
    bpffs.mkdir()
    subprocess.run(["mount", "-t", "bpf", "bpf", str(bpffs)], check=True)
    try:
        with pytest.raises(PermissionError):   # what the old lookup ran into
            (bpffs / "chain.json").exists()
        r = CliRunner().invoke(pptmon, ["chain", "list", "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.output) == []
        d = tmp_path / "pmz"
        d.mkdir()
        c = chainmod.Chain(name="pmz", vnfs=chainmod.parse_vnfs("fwd"))
        (d / "chain.json").write_text(json.dumps(c.to_json()))
        (tmp_path / "notachain").mkdir()           # not a chain name: ignored
        r = CliRunner().invoke(pptmon, ["chain", "list", "--json"])
        assert r.exit_code == 0, r.output
        assert [row["name"] for row in json.loads(r.output)] == ["pmz"]
        r = CliRunner().invoke(pptmon, ["chain", "list"])
        assert r.exit_code == 0 and "pmz" in r.output
        with pytest.raises(chainmod.ChainError):
            chainmod.load(".bpffs")
    finally:
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.umount2(str(bpffs).encode(), 0) == 0, os.strerror(ctypes.get_errno())
