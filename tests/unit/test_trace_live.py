"""`fathom trace --live` without a lab: the probe's bytes, where it is watched, the order of the
requests to the agents (arm everywhere, inject at the source, collect), the verdict and times read
from sightings, what the agent refuses, and the API's refusals before anything is injected (no
request reaches an agent). The whole path on real switches and eBPF: tests/lab/test_tenant.py."""
from __future__ import annotations

import os
import tempfile

import pytest
from fastapi.testclient import TestClient
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.layers.vxlan import VXLAN

from fathom.agent.livetrace import WATCH, LiveTraces
from fathom.agent.local import LocalOvs
from fathom.api.agent_traces import TraceDesk
from fathom.api.app import create_app
from fathom.api.traces import traces_router
from fathom.model.views import ports_by_id
from fathom.trace import live
from fathom.trace.probe import LIVE_DSCP, Probe

from .auth import headers_for
from .test_trace import LAB, cloud, run


def test_the_probe_is_a_marked_icmp_echo_with_right_checksums():
    p = Probe(0x1234, 0xBEEF, 7)
    frame = p.frame("02:fa:00:00:01:01", "02:fa:00:00:01:03", "198.19.1.11", "198.19.1.13", 64, 84)
    pkt = Ether(frame)
    assert len(frame) == 14 + 84 and pkt[IP].tos >> 2 == LIVE_DSCP == 59 and pkt[IP].id == 0x1234
    assert (pkt[ICMP].type, pkt[ICMP].id, pkt[ICMP].seq, pkt[IP].ttl, pkt[IP].flags) == (8, 0xBEEF, 7, 64, "DF")
    ip_sum, icmp_sum = pkt[IP].chksum, pkt[ICMP].chksum
    del pkt[IP].chksum, pkt[ICMP].chksum
    again = Ether(bytes(pkt))
    assert (again[IP].chksum, again[ICMP].chksum) == (ip_sum, icmp_sum)
    with pytest.raises(ValueError):
        p.frame("02:fa:00:00:01:01", "02:fa:00:00:01:03", "198.19.1.11", "198.19.1.13", 64, 27)


def test_a_tcp_probe_is_a_marked_syn_and_its_reset_follows_it():
    p = Probe(0x1234, 0xBEEF, 7)
    args = ("02:fa:00:00:01:01", "02:fa:00:00:01:03", "198.19.1.11", "198.19.1.13", 64, 40)
    syn, rst = Ether(p.frame(*args, tcp=(49152, 80))), Ether(p.frame(*args, tcp=(49152, 80), reset=True))
    for pkt, flags, seq in ((syn, "S", 0xBEEF0007), (rst, "R", 0xBEEF0008)):
        assert (pkt[IP].tos >> 2, pkt[IP].id, pkt[IP].len, pkt[TCP].flags, pkt[TCP].seq) == (59, 0x1234, 40, flags, seq)
        assert (pkt[TCP].sport, pkt[TCP].dport) == (49152, 80)
        sums = pkt[IP].chksum, pkt[TCP].chksum
        del pkt[IP].chksum, pkt[TCP].chksum
        again = Ether(bytes(pkt))
        assert (again[IP].chksum, again[TCP].chksum) == sums


def test_the_bench_finds_the_probe_plain_tagged_and_in_vxlan():
    from fathom.bench.trace_live import probe_of
    frame = Probe(1, 0xBEEF, 7).frame("02:fa:00:00:01:01", "02:fa:00:00:01:03", "198.19.1.11", "198.19.1.13", 64, 84)
    tagged = frame[:12] + b"\x81\x00\x00\x78" + frame[12:]
    outer = Ether() / IP(src="198.18.0.10", dst="198.18.0.11") / UDP(dport=4789) / VXLAN(vni=1001)
    assert probe_of(frame) == probe_of(tagged) == probe_of(bytes(outer) + tagged) == (8, 0xBEEF, 7)
    assert probe_of(bytes(Ether() / IP() / UDP(dport=53))) is None and probe_of(b"\x00" * 10) is None


def _walk(src="vm1", to="198.19.1.13"):
    snapshot, states = cloud(LAB / "tenants.yaml")
    ports = {p.name: p for p in snapshot.ports}
    return run(snapshot, states, src, to), ports


def test_watched_where_the_walk_crosses_kernel_interfaces():
    walk, ports = _walk()
    points = live.watch_points(walk, ports["vm1"], ports["vm3"])
    # the tunnel port is no kernel interface: the underlay port carries its frames
    assert points["compute1"][0] == "vm1" and "ul0" in points["compute1"] and "vxlan0" not in points["compute1"]
    assert set(points["compute2"]) >= {"ul0", "vm3"}
    vlan, _ = _walk("grn1", "198.19.2.22")         # green is a VLAN network: through br-phy and the fabric
    assert "ul0" in live.watch_points(vlan, ports["grn1"], ports["grn2"])["compute1"]


def _seen(dev, direction, t, icmp_type=8, **extra):
    return {"dev": dev, "dir": direction, "ktime_ns": t, "icmp_type": icmp_type, "ttl": 64, "len": 98,
            "src": "198.19.1.11", "dst": "198.19.1.13", **extra}


SIGHTINGS = {
    "compute1": [_seen("vm1", "injected", 1000), _seen("vm1", "ingress", 1050),
                 _seen("ul0", "egress", 1500, vxlan={"vni": 1001, "src": "198.18.0.10", "dst": "198.18.0.11"}),
                 _seen("vm1", "egress", 4000, 0)],
    "compute2": [_seen("ul0", "ingress", 1900), _seen("vm3", "egress", 2400), _seen("vm3", "ingress", 2700, 0)]}


def _agents(seen, down=()):
    asked = []

    def ask(batch):
        asked.append({node: req["kind"] for node, req in batch.items()})
        out = {}
        for node, req in batch.items():
            if node in down:
                out[node] = f"node {node}'s agent is down"
            elif req["kind"] == "live-arm":
                out[node] = {"watched": [d for d in req["devs"] if d != "patch-phy"]}
                if "inject" in req:
                    assert bytes.fromhex(req["inject"]["frame"])[12:14] == b"\x08\x00" and req["inject"]["dev"] == "vm1"
                    # the source node collects its own points after the settle time
                    assert req["collect_after_ms"] == live.SETTLE * 1000
                    out[node].update(injected=True, seen=seen.get(node, []), realtime_offset_ns=0)
            else:
                out[node] = {"seen": seen.get(node, []), "realtime_offset_ns": 0}
        return out
    return ask, asked


def test_armed_everywhere_then_injected_then_collected(monkeypatch):
    monkeypatch.setattr(live, "SETTLE", 0)
    walk, ports = _walk()
    ask, asked = _agents(SIGHTINGS)
    found = live.run(walk, ports["vm1"], ports["vm3"], 64, 84, ask)
    # the source node armed last, injecting as soon as it is and answering with its own sightings;
    # then the others collected
    assert [set(a.values()) for a in asked] == [{"live-arm"}, {"live-arm"}, {"live-collect"}]
    assert list(asked[0]) == ["compute2"] and list(asked[1]) == ["compute1"] and list(asked[2]) == ["compute2"]
    assert [p["at_us"] for p in found["points"]] == [0, 0.05, 0.5, 0.9, 1.4, 1.7, 3.0]
    assert [(s["where"], s["us"]) for s in found["segments"]] == [
        ("switches of compute1", 0.45), ("underlay compute1 → compute2", 0.4), ("switches of compute2", 0.5),
        ("VM behind vm3 on compute2 (answering)", 0.3), ("vm3 ingress on compute2 → vm1 egress on compute1", 1.3)]
    v = live.verdict(found, ports["vm3"], "vm3", {})
    assert (v["result"], v["port"], v["node"]) == ("delivered", "vm3", "compute2") and "answered" in v["reason"]
    result = {"hops": walk["hops"]}
    live.annotate(result, found)
    assert [h.get("time_us") for h in result["hops"]][:2] == [0.45, 0.5]


def _tcp(seen: dict, flags: int) -> dict:
    """A TCP probe's sighting of the watcher's (its flags, no ICMP type) from an ICMP one."""
    return {**{k: v for k, v in seen.items() if k != "icmp_type"}, "tcp_flags": flags}


SYN, SYN_ACK, RST_ACK = 0x02, 0x12, 0x14


def _tcp_sightings(answer: int) -> dict:
    return {node: [_tcp(s, SYN if s["icmp_type"] == 8 else answer) for s in seen] for node, seen in SIGHTINGS.items()}


def test_sightings_are_named_by_what_they_saw_in_the_json_the_table_and_the_svg(monkeypatch, capsys):
    """An ICMP probe's points are its echo request and reply; a TCP probe's its SYN and the SYN-ACK
    or RST answering it (by their TCP flags), in `live.points`, `live.segments`, the verdict, the
    CLI's table and the SVG."""
    import xml.etree.ElementTree as ET

    from fathom.cli.trace import _show_live
    from fathom.trace import svg
    monkeypatch.setattr(live, "SETTLE", 0)
    walk, ports = _walk()
    icmp = live.run(walk, ports["vm1"], ports["vm3"], 64, 84, _agents(SIGHTINGS)[0])
    assert [p["packet"] for p in icmp["points"]] == ["echo request"] * 5 + ["echo reply"] * 2
    for answer, name, how in ((SYN_ACK, "SYN-ACK", "a socket listens"), (RST_ACK, "RST", "no socket listens")):
        walk, ports = _walk()
        found = live.run(walk, ports["vm1"], ports["vm3"], 64, 40, _agents(_tcp_sightings(answer))[0], tcp=(49152, 80))
        assert [p["packet"] for p in found["points"]] == ["SYN"] * 5 + [name] * 2
        assert not any("icmp_type" in p for p in found["points"])
        assert [s["packet"] for s in found["segments"]] == ["SYN"] * 3 + [name] * 2
        # timed and judged as the ICMP probe is: the same segments, hop times and verdict
        assert [(s["where"], s["us"]) for s in found["segments"]] == [(s["where"], s["us"]) for s in icmp["segments"]]
        result = {"hops": walk["hops"], "live": found, "source": {"port": "vm1", "ip": "198.19.1.11"},
                  "to": {"ip": "198.19.1.13", "port": "vm3"}, "leaves": walk["leaves"],
                  "assumptions": {"state": "desired", "ct_state": "new"},
                  "verdict": live.verdict(found, ports["vm3"], "vm3", {})}
        live.annotate(result, found)
        assert [h.get("time_us") for h in result["hops"]][:2] == [0.45, 0.5]
        assert result["verdict"]["reason"].endswith(f"the VM answered it with {name} ({how})")
        found["answer_ms"] = 1
        _show_live(result)
        table = capsys.readouterr().out
        cells = [c.strip() for line in table.splitlines() for c in line.split("│")]
        assert cells.count("SYN") == 5 + 3 and cells.count(name) == 2 + 2, table
        assert "request" not in table and "reply" not in table
        texts = ["".join(t.itertext()) for t in ET.fromstring(svg.render(result)).iter("{http://www.w3.org/2000/svg}text")]
        assert sum(t.endswith(" (SYN)") for t in texts) == 5 + 3 and sum(t.endswith(f" ({name})") for t in texts) == 4
        assert not any("request" in t or "reply" in t for t in texts if "µs" in t)


def test_the_api_takes_a_sighting_of_an_icmp_echo_or_of_a_tcp_segment():
    from pydantic import ValidationError

    from fathom.api.agent_traces import Seen
    icmp = SIGHTINGS["compute1"][0]
    assert Seen(**icmp).icmp_type == 8 and Seen(**_tcp(icmp, SYN_ACK)).tcp_flags == SYN_ACK
    for bad in ({**icmp, "tcp_flags": SYN}, {k: v for k, v in icmp.items() if k != "icmp_type"},
                {**icmp, "icmp_type": 3}, _tcp(icmp, 256)):
        with pytest.raises(ValidationError):
            Seen(**bad)


def test_dropped_after_the_last_sighting_and_unknown_when_a_node_is_not_watched(monkeypatch):
    monkeypatch.setattr(live, "SETTLE", 0)
    walk, ports = _walk()
    seen = {"compute1": SIGHTINGS["compute1"][:3], "compute2": SIGHTINGS["compute2"][:1]}
    found = live.run(walk, ports["vm1"], ports["vm3"], 64, 84, _agents(seen)[0])
    v = live.verdict(found, ports["vm3"], "vm3", {"compute2": "no flow matched at ingress-acl"})
    assert v["result"] == "dropped" and v["node"] == "compute2"
    assert v["reason"].startswith("last seen at ul0 ingress on compute2") and v["reason"].endswith("at ingress-acl")
    found = live.run(walk, ports["vm1"], ports["vm3"], 64, 84, _agents(seen, down={"compute2"})[0])
    v = live.verdict(found, ports["vm3"], "vm3", {})
    assert v["result"] == "unknown" and "compute2's agent is down" in v["reason"]
    # the source's agent down: nothing is injected
    ask, asked = _agents(SIGHTINGS, down={"compute1"})
    found = live.run(walk, ports["vm1"], ports["vm3"], 64, 84, ask)
    assert not found["injected"] and "compute1" not in asked[-1]
    assert live.verdict(found, ports["vm3"], "vm3", {})["result"] == "unknown"


def test_out_of_the_cloud_the_probe_is_watched_where_the_walk_leaves(monkeypatch):
    monkeypatch.setattr(live, "SETTLE", 0)
    snapshot, states = cloud(LAB / "external.yaml")
    ports = {p.name: p for p in snapshot.ports}
    walk = run(snapshot, states, "vm1", "203.0.113.1")        # the upstream host: no port owns it
    assert walk["verdict"]["result"] == "uplink" and live.exits(walk) == [("gw", "ext0")]
    assert "ext0" in live.watch_points(walk, ports["vm1"], None)["gw"]
    out = {"compute1": [_seen("vm1", "injected", 1000), _seen("vm1", "ingress", 1050), _seen("ul0", "egress", 1400)],
           "gw": [_seen("ul0", "ingress", 1700), _seen("ext0", "egress", 2000, src="203.0.113.4")]}
    found = live.run(walk, ports["vm1"], None, 64, 84, _agents(out)[0])
    v = live.verdict(found, None, None, {}, live.exits(walk))
    assert v["result"] == "uplink" and v["node"] == "gw" and "no answer seen" in v["reason"], v
    out["gw"].append(_seen("ext0", "ingress", 2600, 0))
    found = live.run(walk, ports["vm1"], None, 64, 84, _agents(out)[0])
    assert "an answer came back" in live.verdict(found, None, None, {}, live.exits(walk))["reason"]
    del out["gw"]                                           # never left compute1: dropped there
    found = live.run(walk, ports["vm1"], None, 64, 84, _agents(out)[0])
    assert live.verdict(found, None, None, {}, live.exits(walk))["result"] == "dropped"


def test_each_vnf_of_a_chain_gets_its_time():
    from .test_trace import _three_vnf_chain
    snapshot, states = cloud(LAB / "sfc.yaml", more=_three_vnf_chain)
    walk = run(snapshot, states, "other", "198.19.20.21", proto="tcp", dport=8080)
    # the chain's three VNFs (fwd, nat, proxy) are on compute3 with the server
    c1 = [_seen("other", "ingress", 1000), _seen("ul0", "egress", 1100)]
    c3 = [_seen("ul0", "ingress", 1300)]
    t = 1400
    for vnf in ("fwd", "nat", "proxy"):
        c3 += [_seen(f"{vnf}i", "egress", t), _seen(f"{vnf}o", "ingress", t + 50)]
        t += 100
    c3.append(_seen("server", "egress", t))
    found = {"points": [{"node": n, **s, "packet": live.packet(s), "t_ns": s["ktime_ns"]}
                        for n, seen in (("compute1", c1), ("compute3", c3))
                        for s in seen]}
    found["segments"] = live._segments(found["points"], live._between(walk))
    assert [s["where"] for s in found["segments"] if s["where"].startswith("vnf")] == \
        ["vnf fwd on compute3", "vnf nat on compute3", "vnf proxy on compute3"]
    live.annotate(walk, found)
    assert [h.get("time_us") for h in walk["hops"] if h["bridge"] == "vnf"] == [0.05, 0.05, 0.05]
    # every crossing of compute3's br-int is timed from the interface it came in by
    assert [h.get("time_us") for h in walk["hops"] if h["name"] == "compute3"] == [0.1, 0.05, 0.05, 0.05]


def test_the_agent_refuses_what_it_does_not_run(tmp_path):
    agent = LiveTraces(LocalOvs(f"unix:{tmp_path}/db.sock"))      # no OVS there: no port is its own
    probe = Probe(1, 2, 3).to_json()
    arm = {"kind": "live-arm", "trace": "ab12", "probe": probe, "devs": ["vm1"], "timeout_ms": 1000}
    for bad in ({**arm, "trace": "../x"}, {**arm, "kind": "reboot"}, {**arm, "devs": ["vm1; rm"]},
                {**arm, "timeout_ms": 10 ** 6}, {**arm, "probe": {**probe, "dscp": 64}}, {**arm, "devs": []},
                {**arm, "drop_reply": "vm9"}, {**arm, "collect_after_ms": 1001}, {**arm, "collect_after_ms": "1"}):
        assert "error" in agent.run(bad), bad
    # not a port of its bridges: not watched, nothing started
    assert agent.run(arm) == {"live": {"watched": [], "not_watched": ["vm1"]}} and agent.watcher is None
    assert "not a trace request" in agent.run({"kind": "live-inject", "trace": "ab12", "dev": "vm1",
                                               "frame": "00" * 60})["error"]
    assert "not armed" in agent.run({"kind": "live-collect", "trace": "ab12"})["error"]


def test_the_desk_takes_live_requests_only_of_known_kinds():
    desk = TraceDesk()
    with pytest.raises(ValueError):
        desk.ask_live("c1", {"kind": "exec"})
    a = desk.ask_live("c1", {"kind": "live-collect", "trace": "ab"})
    assert desk.take("c1") == [{"id": a.id, "kind": "live-collect", "trace": "ab"}]
    assert desk.answer("c1", a.id, None, None, {"seen": []}) and a.answer == {"seen": []}


@pytest.fixture(scope="module")
def api():
    snapshot, states = cloud(LAB / "tenants.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(f"sqlite:///{tmp}/fathom.db", agent_max_wait=5)
        app.include_router(traces_router(lambda: (snapshot, states)))
        with TestClient(app) as client:
            ids = {p.name: p.id for p in ports_by_id(snapshot).values()}
            alpha = next(p.project_id for p in snapshot.ports if p.name == "vm1")
            yield app, client, ids, headers_for(app, alpha, ("member",)), headers_for(app)
        app.state.engine.dispose()


def test_bad_live_traces_are_refused_before_anything_is_injected(api):
    app, client, ids, member, admin = api
    asked = []
    desk = app.state.trace_desk
    real = desk.ask_live
    desk.ask_live = lambda node, req: asked.append(req) or real(node, req)
    try:
        for body, status, what in (
                ({"to_ip": "198.19.1.99"}, 422, "no port owns 198.19.1.99"),
                ({"to_port_id": ids["vm3"], "size": 1451}, 422, "larger than network blue's MTU (1450)"),
                ({"to_port_id": ids["vm3"], "proto": "udp", "dport": 53}, 422, "an ICMP echo or a TCP SYN"),
                ({"to_port_id": ids["vm3"], "proto": "tcp", "dport": 80, "size": 100}, 422, "a bare SYN"),
                ({"to_port_id": ids["vm3"], "ttl": 0}, 422, "greater than or equal to 1"),
                ({"to_port_id": ids["vm3"], "size": 27}, 422, "greater than or equal to 28"),
                ({"to_port_id": ids["red3"]}, 404, "does not exist")):
            r = client.post("/v1/traces", headers=member, json={"port_id": ids["vm1"], "live": True, **body})
            assert r.status_code == status and what in r.text, (body, r.text)
        r = client.post("/v1/traces", headers=member, json={"port_id": ids["red1"], "to_ip": "198.19.1.13",
                                                            "live": True})
        assert r.status_code == 404, r.text
        # a good one with no agent heard from: nothing injected, said why
        r = client.post("/v1/traces", headers=admin, json={"port_id": ids["vm1"], "to_port_id": ids["vm3"],
                                                           "live": True, "timeout": 1})
        assert r.status_code == 200, r.text
        assert r.json()["verdict"]["result"] == "unknown" and "no probe was injected" in r.json()["verdict"]["reason"]
    finally:
        desk.ask_live = real
    assert asked == []


def test_the_bench_pairs_interleaved_runs_and_reports_the_noise_floor():
    from fathom.bench.trace_live import interleaved
    order = ["on", "off", "off", "on", "on", "off", "off", "on", "on", "off", "off", "on"]
    runs = [0.98, 1.00, 1.02, 1.00, 0.99, 1.00, 0.96, 0.96, 1.00, 1.01, 1.00, 0.99]
    got = interleaved(runs, order, 0.99)
    assert got["pair_ratios"] == pytest.approx([0.98, 1.00 / 1.02, 0.99, 1.0, 1.00 / 1.01, 0.99])
    assert got["gbps"]["off"] == [1.00, 1.02, 1.00, 0.96, 1.01, 1.00]
    # consecutive off runs, nothing changed between them: 2 %, 2 %, 4 %, 5 %, 1 %
    assert got["noise_floor"]["off_off_change"] == pytest.approx([0.02, 0.02 / 1.02, 0.04, 0.05 / 0.96, 0.01 / 1.01])
    assert got["noise_floor"]["median"] == pytest.approx(0.02)
    assert got["resolves_target"] is False and got["verdict"] == "not resolved" and "not below the 1%" in got["note"]
    quiet = interleaved([1.0, 1.0] * 6, ["on", "off"] * 6, 0.99)
    assert quiet["pair_ratio_median"] == 1.0 and quiet["resolves_target"] is True and quiet["verdict"] == "shown"
    assert interleaved([0.9, 1.0] * 6, ["on", "off"] * 6, 0.99)["verdict"] == "refuted"


def test_the_bench_compares_like_stamps_with_like():
    from fathom.bench.trace_live import compare
    probe = {"icmp_id": 0xBEEF, "icmp_seq": 7}
    key = (0xBEEF, 7)

    def point(node, dev, direction, t, icmp_type=8):
        return {"node": node, "dev": dev, "dir": direction, "icmp_type": icmp_type, "t_ns": t}
    # tcpdump's receive stamps come 30 µs before TC ingress (the backlog); its send stamps 1 µs after TC egress
    points = [point("compute1", "vm1", "injected", 0), point("compute1", "vm1", "ingress", 100_000),
              point("compute1", "ul0", "egress", 200_000), point("compute2", "ul0", "ingress", 300_000),
              point("compute2", "vm3", "egress", 400_000), point("compute2", "vm3", "ingress", 500_000, 0),
              point("compute2", "ul0", "egress", 600_000, 0), point("compute1", "vm1", "egress", 700_000, 0)]
    seen = {("compute1", "vm1", 8): {key: 70_000}, ("compute1", "ul0", 8): {key: 201_000},
            ("compute2", "ul0", 8): {key: 270_000}, ("compute2", "vm3", 8): {key: 401_000},
            ("compute2", "vm3", 0): {key: 470_000}, ("compute2", "ul0", 0): {key: 601_000}}
    got = compare([{"live": {"probe": probe, "points": points}}], seen)
    assert got["points_us"]["vm1@compute1 ingress (request)"]["p50"] == 30.0
    assert got["points_us"]["ul0@compute1 egress (request)"]["p50"] == -1.0
    assert "vm1@compute1 egress (reply)" not in got["points_us"]       # dropped at TC egress: tcpdump never sees it
    like = got["egress_segments"]
    assert list(like) == ["ul0@compute1 egress (request) → vm3@compute2 egress (request)",
                          "vm3@compute2 egress (request) → ul0@compute2 egress (reply)"]
    assert all(s["difference_us"]["p50"] == 0.0 for s in like.values())
    hops = got["hop_segments"]
    assert hops["vm1@compute1 ingress (request) → ul0@compute1 egress (request)"]["difference_us"]["p50"] == -31.0
    assert hops["ul0@compute1 egress (request) → ul0@compute2 ingress (request)"]["abs_difference_us"]["p50"] == 31.0


def test_the_bench_splits_cpu_per_trace_by_role():
    from fathom.bench.trace_live import per_trace
    tick = 1000 / os.sysconf("SC_CLK_TCK")
    before = {1: ("controller", 100, 0), 2: ("agent", 10, 50), 3: ("watcher", 5, 0), 4: ("ovs-vswitchd", 0, 0)}
    after = {1: ("controller", 140, 0), 2: ("agent", 30, 70), 3: ("watcher", 7, 0), 4: ("ovs-vswitchd", 10, 0),
             5: ("watcher", 99, 0)}          # a watcher started in between: not counted
    got = per_trace(before, after, 2)
    assert got["controller"] == pytest.approx(20 * tick) and got["agent"] == pytest.approx(10 * tick)
    assert got["agent's commands"] == pytest.approx(10 * tick) and got["watcher"] == pytest.approx(1 * tick)
    assert got["hosts"] == pytest.approx(26 * tick, abs=0.02) and got["total"] == pytest.approx(46 * tick, abs=0.02)


def test_the_watcher_refuses_bad_commands_and_arms_nothing_it_cannot_watch():
    """livetrace-watch on its own: malformed or out-of-bounds commands and an interface that does
    not exist are refused with nothing armed (every fallible step comes before the mark); it ends,
    detached, on its idle time."""
    import json
    import subprocess
    assert WATCH.exists(), f"{WATCH} is missing: run `make native`"
    proc = subprocess.Popen([str(WATCH), "--idle-ms=300"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert json.loads(proc.stdout.readline())["type"] == "ready"
        for bad in ("arm 1 64 1 2 3 icmp - 1000 lo", "arm 1 59 1 2 3 udp - 1000 lo", "arm 1 59 1 2 3 icmp - 0 lo",
                    "arm 1 59 1 2 3 icmp - 1000", "arm x 59 1 2 3 icmp - 1000 lo", "arm 1 59 70000 2 3 icmp - 1000 lo",
                    "arm 1 59 1 2 3 icmp - 1000 nosuchdev0", "arm 1 59 1 2 3 icmp nosuchdev0 1000 lo",
                    "arm 1 59 1 2 3 icmp - 1000 " + "a" * 40, "disarm 1", "reboot", "x" * 3000):
            proc.stdin.write(bad + "\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline())["type"] == "error", bad
        out, _ = proc.communicate(timeout=10)      # stdin closed
    finally:
        proc.kill()
    assert [json.loads(line)["type"] for line in out.splitlines()] == ["detached"] and proc.returncode == 0
    idle = subprocess.run([str(WATCH), "--idle-ms=200"], stdin=subprocess.PIPE, capture_output=True, text=True,
                          timeout=10, input=None)
    assert idle.returncode == 0 and idle.stdout.splitlines()[-1] == '{"type":"detached"}'


def test_the_bench_sets_the_traces_own_work_apart_from_the_off_runs_background():
    from fathom.bench.trace_live import ROLES, own_work

    def roles(**ms):
        return {r: ms.get(r.replace("'", "").replace(" ", "_"), 0.0) for r in ROLES}
    runs = [{"mode": "on", "wall_s": 10.0, "alongside": {"traces": 40}, "roles_ms": roles(controller=2100, agent=300)},
            {"mode": "off", "wall_s": 10.0, "roles_ms": roles(controller=100, agent=100)},
            {"mode": "off", "wall_s": 10.0, "roles_ms": roles(controller=100, agent=100)},
            {"mode": "on", "wall_s": 10.0, "alongside": {"traces": 60}, "roles_ms": roles(controller=2100, agent=300,
                                                                                         ovs_vswitchd=999)}]
    got = own_work(runs)
    # 4200 ms of the controller less 10 ms/s over 20 s, over 100 traces; ovs-vswitchd is the CPU per GB's, not here
    assert got["cpu_ms_per_trace"]["controller"] == pytest.approx(40.0)
    assert got["cpu_ms_per_trace"]["agent"] == pytest.approx(4.0) and "ovs-vswitchd" not in got["cpu_ms_per_trace"]
    assert got["total"] == pytest.approx(44.0) and got["hosts"] == pytest.approx(4.0)
    assert got["traces"] == 100 and got["traces_per_s"] == pytest.approx(5.0)


def test_the_bench_counts_processes_started_in_a_window_when_asked():
    from fathom.bench.trace_live import per_trace
    tick = 1000 / os.sysconf("SC_CLK_TCK")
    got = per_trace({1: ("agent", 10, 0)}, {1: ("agent", 20, 5), 5: ("watcher", 30, 0)}, 1, count_new=True)
    assert got["watcher"] == pytest.approx(30 * tick) and got["agent's commands"] == pytest.approx(5 * tick)
