"""`fathom trace --actual` and `--svg`: ofproto/trace's output read into hops and stages (outputs of
OVS 3.1 recorded from the default lab: vm1 → vm3, compute1's br-int and compute2's), the trace
requests the controller hands the agents and the answers it takes (POST /v1/traces with `actual`
over a real store, the agent's own Follower and Tracer running ovs-appctl), and the picture.
The whole path on real switches: tests/lab/test_trace_actual.py."""
from __future__ import annotations

import re
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fathom.agent.follow import Follower
from fathom.agent.local import LocalOvs
from fathom.agent.trace import FLOW_RE, Tracer
from fathom.api.agent_traces import MAX_PENDING, TooManyTraces, TraceDesk
from fathom.api.app import create_app
from fathom.api.traces import traces_router
from fathom.trace import ofproto, svg

from .agent_loop import agent_polling
from .auth import headers_for
from .test_trace import LAB, cloud, run

DATA = Path(__file__).parent / "data"


def test_ofproto_trace_output_read_as_a_pass():
    p = ofproto.parse((DATA / "ofproto-trace-compute1.txt").read_text(), "br-int")
    # every table met, in both passes of the packet (before and after conntrack); br-phy's (the
    # native tunnel's underlay bridge) left out
    assert [s.table for s in p.steps] == [0, 10, 20, 30, 32, 35, 40, 50, 60, 65, 70, 72, 80]
    assert [(s.flow.priority, s.flow.cookie) for s in p.steps][:2] == [(100, 0x205000000000001),
                                                                       (0, 0x10100000000000a)]
    assert p.steps[0].flow.actions_text == "set_field:0x1->reg6,set_field:0x1->reg5,goto_table:10"
    assert p.steps[5].flow.match == "conj_id=1,ip"
    # one output, to the tunnel: the VNI and remote the flow set (the final flow omits tun_id)
    assert [(e.port, e.packet["tunnel_id"], e.packet["tun_ipv4_dst"], e.step) for e in p.out] == \
        [(4, 1001, "198.18.0.11", 12)]
    assert p.out[0].packet["eth_dst"] == "02:fa:00:00:01:03" and p.out[0].packet["ttl"] == 64 and not p.ends
    phy = ofproto.parse((DATA / "ofproto-trace-compute1.txt").read_text(), "br-phy")
    assert [s.table for s in phy.steps] == [0] and [e.port for e in phy.out] == [ofproto.OFPP_NORMAL]
    # the receiving side: the packet came in from the tunnel, delivered out of port 2
    remote = ofproto.parse((DATA / "ofproto-trace-compute2.txt").read_text(), "br-int")
    assert [s.table for s in remote.steps] == [0, 60, 65, 70, 72, 75, 80]
    assert [(e.port, e.packet["reg9"]) for e in remote.out] == [(2, 3)]
    assert not remote.ends


def test_the_flow_asked_for_is_what_the_agent_accepts():
    pkt = {"in_port": 4, "tunnel_id": 1001, "tun_ipv4_src": "198.18.0.10", "tun_ipv4_dst": "198.18.0.11",
           "eth_src": "02:fa:00:00:01:01", "eth_dst": "02:fa:00:00:01:03", "eth_type": 0x0800, "ip_proto": 6,
           "ipv4_src": "198.19.1.11", "ipv4_dst": "198.19.1.13", "ttl": 64, "tcp_src": 49152, "tcp_dst": 80,
           "vlan": None}
    flow = ofproto.br_flow(pkt)
    assert flow == ("in_port=4,tun_id=0x3e9,tun_src=198.18.0.10,tun_dst=198.18.0.11,tcp,dl_src=02:fa:00:00:01:01,"
                    "dl_dst=02:fa:00:00:01:03,nw_src=198.19.1.11,nw_dst=198.19.1.13,nw_ttl=64,tp_src=49152,tp_dst=80")
    assert FLOW_RE.match(flow)
    back = ofproto.packet(flow)
    assert {k: back[k] for k in ("tunnel_id", "tcp_src", "tcp_dst", "ip_proto", "eth_dst")} == \
        {"tunnel_id": 1001, "tcp_src": 49152, "tcp_dst": 80, "ip_proto": 6, "eth_dst": "02:fa:00:00:01:03"}


def test_the_desk_is_bounded():
    desk = TraceDesk()
    for bad in (("br-ex", "in_port=1", []), ("br-int", "in_port=1;reboot", []), ("br-int", "in_port=1", ["rel"]),
                ("br-int", "in_port=1", ["trk,new"] * 9), ("br-int", "in_port=1" + ",ip" * 600, [])):
        with pytest.raises(ValueError):
            desk.ask("c1", *bad)
    asks = [desk.ask("c1", "br-int", "in_port=1", []) for _ in range(MAX_PENDING)]
    with pytest.raises(TooManyTraces):
        desk.ask("c1", "br-int", "in_port=1", [])
    desk.ask("c2", "br-int", "in_port=1", [])      # another node's are counted apart
    assert not desk.answer("c1", asks[0].id, "x", None)      # not handed out yet
    assert [t["id"] for t in desk.take("c1")] == [a.id for a in asks] and desk.take("c1") == []
    assert not desk.answer("c2", asks[0].id, "x", None)      # not c2's
    assert desk.answer("c1", asks[0].id, "out", None) and asks[0].done.is_set() and asks[0].output == "out"
    assert not desk.wait(asks[1], 0.01) and not desk.answer("c1", asks[1].id, "late", None)   # forgotten


# ---------------------------------------------------------------------------------------------- the protocol


@pytest.fixture(scope="module")
def api():
    snapshot, states = cloud(LAB / "tenants.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(f"sqlite:///{tmp}/fathom.db", agent_max_wait=5)
        app.include_router(traces_router(lambda: (snapshot, states)))
        with TestClient(app) as client:
            admin = headers_for(app)
            for node in snapshot.nodes:     # the agents' nodes exist in the store
                r = client.post("/v1/nodes", headers=admin, json={"name": node.name, "tunnel_ip": node.tunnel_ip})
                assert r.status_code == 201, r.text
            yield app, client, {p.name: p.id for p in snapshot.ports}, admin
        app.state.engine.dispose()


def _actual(client, admin, ports, timeout=2.0) -> dict:
    r = client.post("/v1/traces", headers=admin, json={"port_id": ports["vm1"], "to_port_id": ports["vm3"],
                                                       "actual": True, "timeout": timeout})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_node_whose_agent_was_never_heard_is_named(api):
    _, client, ports, admin = api
    t = _actual(client, admin, ports)
    assert t["verdict"]["result"] == "unknown" and "compute1's agent has not been heard from" in t["verdict"]["reason"]
    assert t["hops"][0]["tables"] == "unknown" and t["desired"]["verdict"]["result"] == "delivered"
    assert t["difference"]["hop"] == 0 and t["difference"]["switch"] == "br-int compute1"


def test_the_agent_answers_with_what_ovs_said(api, tmp_path):
    app, client, ports, admin = api
    agent = TestClient(app, headers=headers_for(app, "admin", ("agent",), node="compute1"))
    # the agent's own loop and tracer; its OVS is not there (no database socket): ovs-appctl fails
    follower = Follower(agent, "compute1", [], lambda: {}, tracer=Tracer(LocalOvs(f"unix:{tmp_path}/db.sock")))
    with agent_polling(follower):
        r = _actual(client, admin, ports)
    reason = r["verdict"]["reason"]
    assert r["verdict"]["result"] == "unknown" and "compute1's agent could not trace: ovs-appctl" in reason, reason


def test_an_agent_that_does_not_answer_in_time(api):
    app, client, ports, admin = api
    agent = TestClient(app, headers=headers_for(app, "admin", ("agent",), node="compute1"))
    taken = []

    def poll():   # takes the request with its long-poll, and never answers it
        rev = agent.get("/v1/agents/compute1/desired").json()["revision"]
        taken.extend(agent.get("/v1/agents/compute1/desired", params={"after": rev, "timeout": 5}).json()["traces"])
    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.3)
    r = _actual(client, admin, ports, timeout=1.0)
    t.join()
    assert r["verdict"]["result"] == "unknown"
    assert "compute1's agent did not answer within the trace's 1 s" in r["verdict"]["reason"]
    assert [(a["bridge"], a["ct_next"][0]) for a in taken] == [("br-int", "trk,new")]
    assert re.match(r"^in_port=\d+,icmp,dl_src=", taken[0]["flow"])
    # too late: forgotten; and only the node's own agent may answer
    late = agent.post(f"/v1/agents/compute1/traces/{taken[0]['id']}", json={"output": "x"})
    assert late.status_code == 404, late.text
    for who in (admin, headers_for(app, "admin", ("agent",), node="compute2")):
        r = client.post(f"/v1/agents/compute1/traces/{taken[0]['id']}", headers=who, json={"output": "x"})
        assert r.status_code == 403, r.text
    r = agent.post(f"/v1/agents/compute1/traces/{taken[0]['id']}", json={"output": "x" * (256 * 1024 + 1)})
    assert r.status_code == 422


# ---------------------------------------------------------------------------------------------- the picture


def _hostile(call, ids):
    project = call("GET", f"/ports/{ids['ports']['vm3']}")["project_id"]
    g = call("POST", "/security-groups", json={"name": '<script>alert("x")</script>&', "project_id": project})
    call("POST", "/security-group-rules", json={"security_group_id": g["id"], "direction": "ingress",
                                                 "protocol": "tcp", "port_range_min": 80, "port_range_max": 80})
    call("PATCH", f"/ports/{ids['ports']['vm3']}", json={"security_groups": [g["id"]]})


def test_svg_draws_the_hops_and_escapes_names():
    result = run(*cloud(LAB / "default.yaml", more=_hostile), "vm1", "198.19.1.13")
    assert result["verdict"]["result"] == "dropped"
    text = svg.render(result)
    root = ET.fromstring(text)           # well-formed XML
    ns = {"s": "http://www.w3.org/2000/svg"}
    texts = ["".join(t.itertext()) for t in root.iterfind(".//s:text", ns)]
    assert [t for t in texts if t.startswith("#")] == ["#0 br-int compute1 (in vm1)",
                                                       "#1 br-int compute2 (in vxlan0)"]
    assert any('(<script>alert("x")</script>&)' in t for t in texts), texts
    assert "<script" not in text and root.find(".//s:script", ns) is None
    assert any(t.startswith("verdict: dropped") for t in texts)
    # the stage where it was dropped, marked
    assert sum(1 for r in root.iterfind(".//s:rect", ns) if r.get("fill") == svg.CHIP_DROP) == 1


def test_api_answers_svg(api):
    _, client, ports, admin = api
    body = {"port_id": ports["vm1"], "to_port_id": ports["vm3"]}
    for r in (client.post("/v1/traces?format=svg", headers=admin, json=body),
              client.post("/v1/traces", headers={**admin, "Accept": "image/svg+xml"}, json=body)):
        assert r.status_code == 200 and r.headers["content-type"] == "image/svg+xml"
        assert ET.fromstring(r.text).tag == "{http://www.w3.org/2000/svg}svg"
    assert client.post("/v1/traces?format=png", headers=admin, json=body).status_code == 422
