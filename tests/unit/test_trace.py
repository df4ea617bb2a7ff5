"""The simulated trace (fathom.trace) over compiled models of the shipped topologies, registered as
the lab registers them (tests/unit/golden_flows.py), and POST /v1/traces's isolation."""
from __future__ import annotations

import functools
import tempfile

import pytest
from fastapi.testclient import TestClient

from fathom.api.app import create_app
from fathom.api.traces import traces_router
from fathom.apps import compile_all
from fathom.openflow.spec import OFPP_CONTROLLER, Controller, FlowSpec, GotoTable, Output, Resubmit, SwitchState
from fathom.trace import TraceError, trace
from fathom.trace import tables as tb

from .auth import headers_for
from .golden_flows import ROOT, model

LAB = ROOT / "fathom/lab/topologies"
BENCH = ROOT / "fathom/bench/topologies"


@functools.lru_cache(maxsize=None)
def cloud(path, fabric: bool = False, mode: str = "distributed", more=None):
    snapshot, states = model(path, fabric, mode, more)
    return snapshot, states


def run(snapshot, states, src: str, to: str, **kw) -> dict:
    ports = {p.name: p for p in snapshot.ports}
    return trace(snapshot, states, ports[src], to, **kw)


def switches(result: dict) -> list[str]:
    return [h["switch"] for h in result["hops"]]


def stages(result: dict, switch: str) -> list[str]:
    return [s["stage"] for h in result["hops"] if h["switch"] == switch for s in h["steps"]]


def _web_only(call, ids):
    project = call("GET", f"/ports/{ids['ports']['vm3']}")["project_id"]
    g = call("POST", "/security-groups", json={"name": "web", "project_id": project})
    call("POST", "/security-group-rules", json={"security_group_id": g["id"], "direction": "ingress",
                                                 "protocol": "tcp", "port_range_min": 80, "port_range_max": 80})
    call("POST", "/security-group-rules", json={"security_group_id": g["id"], "direction": "egress"})
    call("PATCH", f"/ports/{ids['ports']['vm3']}", json={"security_groups": [g["id"]]})


def test_same_node_with_tap_copies():
    r = run(*cloud(LAB / "default.yaml", more=_web_only), "vm1", "198.19.1.12")
    assert r["verdict"] == {"result": "delivered", "port": "vm2", "node": "compute1",
                            "reason": "delivered to port vm2 on compute1"}
    assert r["hops"][0]["switch"] == "br-int compute1" and r["hops"][0]["outputs"][0] == {"port": "vm2"}
    # the two-way tap policy "all" (vm2 <-> vm1) copies it to its monitors on compute2: each bucket followed
    assert sorted((lf["result"], lf["port"]) for lf in r["leaves"]) == [
        ("copy", "vm3"), ("copy", "vm4"), ("delivered", "vm2")]
    tap = next(s for s in r["hops"][0]["steps"] if s["stage"] == "tap-ingress")
    assert tap["owner"]["kind"] == "tap_policy" and tap["owner"]["name"] == "all"
    assert any("(all)" in n for n in tap["notes"])
    assert stages(r, "br-int compute1")[:3] == ["classify", "tap-ingress", "security"]
    l2 = next(s for s in r["hops"][0]["steps"] if s["stage"] == "l2")
    assert l2["owner"] == {"app": "tenant", "kind": "port", "id": l2["owner"]["id"], "name": "vm2"}


def test_cross_node_vxlan():
    r = run(*cloud(LAB / "default.yaml", more=_web_only), "vm1", "198.19.1.14", proto="tcp", dport=22)
    assert r["verdict"]["result"] == "delivered" and r["verdict"]["port"] == "vm4"
    assert switches(r) == ["br-int compute1", "br-int compute2"]
    assert r["hops"][0]["outputs"] == [{"port": "vxlan0", "tunnel": {"vni": 1001, "to": "compute2",
                                                                    "remote_ip": "198.18.0.2"}}]
    # the security groups named: the default group's rules admit it on both sides
    owners = [s["owner"].get("name", "") for h in r["hops"] for s in h["steps"] if s["owner"]]
    assert any("of security group default: egress" in o for o in owners)
    assert any("of security group default: ingress" in o for o in owners)
    assert all("+trk+new (assumed)" in n for h in r["hops"] for s in h["steps"] for n in s.get("notes", ())
               if "recirculated" in n)


def test_vlan_through_the_fabric_switch():
    r = run(*cloud(BENCH / "l3.yaml", True, "fabric"), "va", "198.19.10.12")
    assert r["verdict"]["port"] == "vc"
    assert switches(r) == ["br-int c1", "br-phy c1", "fabric-switch fabric", "br-phy c2", "br-int c2"]
    assert stages(r, "fabric-switch fabric")[0] == "trunk-in" and "l2" in stages(r, "fabric-switch fabric")


@pytest.mark.parametrize("fabric,mode,path,router_hop", [
    (False, "distributed", "tenants", "br-int compute1"),
    (True, "network-node", "tenants", "router-namespace r1 on gw"),
    (True, "fabric", "l3", "fabric-switch fabric"),
])
def test_routed(fabric, mode, path, router_hop):
    if path == "l3":
        r = run(*cloud(BENCH / "l3.yaml", fabric, mode), "va", "198.19.20.12")
        want, first = "vd", "br-int c1"
    else:
        r = run(*cloud(LAB / "tenants.yaml", fabric, mode), "vm1", "198.19.2.22")
        want, first = "grn2", "br-int compute1"
    assert r["verdict"]["result"] == "delivered" and r["verdict"]["port"] == want
    assert r["hops"][0]["switch"] == first
    routed_at = [h["switch"] for h in r["hops"] for s in h["steps"]
                 if s["stage"] in ("l3", "svi") and (s.get("priority") or 0) > 0 or s["stage"] == "linux routing"]
    assert routed_at == [router_hop]


def _three_vnf_chain(call, ids):
    project = call("GET", f"/ports/{ids['ports']['other']}")["project_id"]
    pgs = [call("POST", "/sfc/port_pair_groups", json={"port_pairs": [ids["pairs"][v]], "project_id": project})["id"]
           for v in ("fwd", "nat", "proxy")]
    fc = call("POST", "/sfc/flow_classifiers", json={
        "logical_source_port": ids["ports"]["other"], "logical_destination_port": ids["ports"]["server"],
        "protocol": "tcp", "destination_port_range_min": 8080, "destination_port_range_max": 8080,
        "project_id": project})
    call("POST", "/sfc/port_chains", json={"name": "three", "port_pair_groups": pgs, "flow_classifiers": [fc["id"]],
                                           "project_id": project})


def test_through_a_chain_of_three_vnfs():
    snapshot, states = cloud(LAB / "sfc.yaml", more=_three_vnf_chain)
    r = run(snapshot, states, "other", "198.19.20.21", proto="tcp", dport=8080)
    assert r["verdict"]["result"] == "delivered" and r["verdict"]["port"] == "server"
    assert [h["switch"] for h in r["hops"] if h["bridge"] == "vnf"] == ["vnf fwd", "vnf nat", "vnf proxy"]
    steered = [s for h in r["hops"] for s in h["steps"] if s["stage"] == "sfc" and s["priority"]]
    assert steered and all(s["owner"] == {"app": "sfc", "kind": "port_chain", "id": s["owner"]["id"], "name": "three"}
                           for s in steered)
    # another port: not classified, straight to the server
    r = run(snapshot, states, "client", "198.19.20.21", proto="tcp", dport=8080)
    assert r["verdict"]["port"] == "server" and not [h for h in r["hops"] if h["bridge"] == "vnf"]


def test_chain_hop_down():
    def unplug(snapshot):
        nodes = {n.name: dict(n.ofports) for n in snapshot.nodes}
        nodes["compute3"].pop("nato")
        return snapshot.with_ofports(nodes)
    snapshot, _ = cloud(LAB / "sfc.yaml", more=_three_vnf_chain)
    snapshot = unplug(snapshot)
    r = run(snapshot, compile_all(snapshot), "other", "198.19.20.21", proto="tcp", dport=8080)
    assert r["verdict"]["result"] == "dropped"
    assert "chain hop down" in r["verdict"]["reason"] and "nato" in r["verdict"]["reason"]


def test_to_a_floating_ip_and_out():
    snapshot, states = cloud(LAB / "external.yaml")
    fip = snapshot.floating_ips[0].ip_address
    # red1 (another tenant, through its router's SNAT) to vm1's floating IP: the upstream router sends
    # it back to the gateway node, DNAT, routed to vm1 - whose default group admits only its own group
    r = run(snapshot, states, "red1", fip, proto="tcp", dport=22)
    assert switches(r) == ["br-int compute1", "br-int gw", "upstream router of ext", "br-int gw", "br-int compute1"]
    notes = [n for h in r["hops"] for s in h["steps"] for n in s.get("notes", ())]
    assert any("src-NAT 198.19.1.11 -> 203.0.113." in n for n in notes)
    assert any(f"dst-NAT {fip} -> 198.19.1.11" in n for n in notes)
    assert r["verdict"]["result"] == "dropped"
    assert "no ingress rule of port vm1's security groups (default)" in r["verdict"]["reason"]
    # a tenant does not see the other project's port by name
    alpha = next(p.project_id for p in snapshot.ports if p.name == "vm1")
    hidden = run(snapshot, states, "red1", fip, proto="tcp", dport=22, visible=lambda p: p != alpha)
    assert "vm1" not in str(hidden) and "another project's port" in hidden["verdict"]["reason"]
    # vm1 to the upstream router: out of ext0 with its floating IP
    r = run(snapshot, states, "vm1", "203.0.113.1")
    assert r["verdict"] == {"result": "uplink", "reason": "sent out gw's external port (ext0) to the upstream router"}
    assert any(f"src-NAT 198.19.1.11 -> {fip}" in n for h in r["hops"] for s in h["steps"] for n in s.get("notes", ()))


def test_dropped_by_a_security_group():
    snapshot, states = cloud(LAB / "default.yaml", more=_web_only)
    r = run(snapshot, states, "vm1", "198.19.1.13", proto="tcp", dport=22)
    assert r["verdict"]["result"] == "dropped"
    assert r["verdict"]["reason"].startswith("no flow matched (table miss: drop) at ingress-acl: no ingress rule of "
                                             "port vm3's security groups (web) admits it (ct_state new)")
    r = run(snapshot, states, "vm1", "198.19.1.13", proto="tcp", dport=80)
    assert r["verdict"]["port"] == "vm3"
    acl = next(s for h in r["hops"] for s in h["steps"] if s["stage"] == "ingress-acl")
    assert acl["owner"]["kind"] == "security_group_rule"
    assert acl["owner"]["name"].endswith("of security group web: ingress tcp 80-80")
    # established: the same rules judge a connection whose admitting rule is unknown
    r = run(snapshot, states, "vm1", "198.19.1.13", proto="tcp", dport=22, ct_state="established")
    assert r["verdict"]["result"] == "dropped" and "ct_state established" in r["verdict"]["reason"]


def test_dropped_because_the_destination_port_is_down():
    snapshot, _ = cloud(LAB / "default.yaml", more=_web_only)
    ofports = {n.name: {i: p for i, p in n.ofports.items() if i != "vm3"} for n in snapshot.nodes}
    snapshot = snapshot.with_ofports(ofports)
    r = run(snapshot, compile_all(snapshot), "vm1", "198.19.1.13")
    assert r["verdict"]["result"] == "dropped"
    assert r["verdict"]["reason"].startswith("the destination port vm3 is down: its interface is not plugged on compute2")
    # the frame still crossed to compute2 (the other nodes keep its location) and was flooded there
    assert switches(r) == ["br-int compute1", "br-int compute2"]
    assert {lf["result"] for lf in r["leaves"]} == {"flooded"}


def test_no_route_and_no_neighbour():
    snapshot, states = cloud(LAB / "default.yaml", more=_web_only)
    r = run(snapshot, states, "vm1", "198.19.1.99")
    assert r["verdict"]["result"] == "dropped" and r["hops"] == []
    assert "ARP for 198.19.1.99 unanswered" in r["verdict"]["reason"]
    r = run(snapshot, states, "vm1", "198.19.9.9")
    assert "no route to 198.19.9.9: the gateway 198.19.1.1 is no router's interface" in r["verdict"]["reason"]


def test_bad_requests():
    snapshot, states = cloud(LAB / "default.yaml", more=_web_only)
    for kw, message in (({"proto": "tcp"}, "tcp needs a destination port"), ({"proto": "sctp"}, "proto is one of"),
                        ({"dport": 1}, "icmp has no ports"), ({"ct_state": "rel"}, "ct_state is one of")):
        with pytest.raises(TraceError, match=message):
            run(snapshot, states, "vm1", "198.19.1.13", **kw)
    with pytest.raises(TraceError, match="not an IPv4 address"):
        run(snapshot, states, "vm1", "vm3")


def test_interpreter_bounds_a_resubmit_loop():
    loop = SwitchState(frozenset({FlowSpec(0, 1, {}, (Resubmit(1),)), FlowSpec(1, 1, {}, (Resubmit(0),))}))
    with pytest.raises(tb.LoopError):
        tb.run(tb.Tables(loop), {"in_port": 1}, tb.CT_NEW)
    chain = SwitchState(frozenset({FlowSpec(0, 1, {"reg6": (2, 2)}, (GotoTable(5),)), FlowSpec(0, 0, {}, ())}))
    p = tb.run(tb.Tables(chain), {"in_port": 1, "reg6": 3}, tb.CT_NEW)
    assert [s.table for s in p.steps] == [0, 5] and p.ends[-1][1] == "no flow matched (table miss: drop)"


def test_interpreter_names_what_it_does_not_follow():
    class Learn:            # an action the interpreter does not know
        def to_ofctl(self):
            return "learn(table=9)"
    state = SwitchState(frozenset({FlowSpec(0, 1, {}, (Controller(), Learn(), Output(2)))}))
    p = tb.run(tb.Tables(state), {"in_port": 1}, tb.CT_NEW)
    assert [e.port for e in p.out] == [OFPP_CONTROLLER]
    assert p.ends[0][1] == "learn(table=9) is not interpreted by the simulation"


def test_cli_table_and_help(capsys):
    from click.testing import CliRunner

    from fathom.cli.main import cli
    from fathom.cli.trace import show
    help_text = CliRunner().invoke(cli, ["trace", "--help"]).output
    assert "--live" in help_text and "--actual" in help_text and "--svg" in help_text
    snapshot, states = cloud(LAB / "default.yaml", more=_web_only)
    show(run(snapshot, states, "vm1", "198.19.1.13", proto="tcp", dport=22))
    text = capsys.readouterr().out
    assert "#1 br-int compute2" in text and "ingress-acl" in text
    assert "tap-egress" not in text      # a stage its table-miss flow only passes on
    assert text.rstrip().endswith("admits it (ct_state new)")


# ---------------------------------------------------------------------------------------------- the API


@pytest.fixture(scope="module")
def api():
    snapshot, states = cloud(LAB / "tenants.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(f"sqlite:///{tmp}/fathom.db")
        compiled = [snapshot, states]     # what the router serves (None: no pass made yet)
        app.include_router(traces_router(lambda: tuple(compiled)))
        with TestClient(app) as client:
            ids = {p.name: p.id for p in snapshot.ports}
            alpha = next(p.project_id for p in snapshot.ports if p.name == "vm1")
            yield client, ids, headers_for(app, alpha, ("member",)), headers_for(app), compiled
        app.state.engine.dispose()


def test_api_traces_within_the_callers_project(api):
    client, ids, member, admin, _ = api
    r = client.post("/v1/traces", headers=member, json={"port_id": ids["vm1"], "to_port_id": ids["vm3"],
                                                        "proto": "tcp", "dport": 80})
    assert r.status_code == 200, r.text
    assert r.json()["verdict"]["port"] == "vm3" and r.json()["assumptions"]["ct_state"] == "new"
    # another project's port, as source or destination: as absent as a missing one
    for body in ({"port_id": ids["red1"], "to_ip": "198.19.1.13"},
                 {"port_id": ids["vm1"], "to_port_id": ids["red3"]},
                 {"port_id": 999999, "to_ip": "198.19.1.13"}):
        r = client.post("/v1/traces", headers=member, json=body)
        assert r.status_code == 404, r.text
    r = client.post("/v1/traces", headers=admin, json={"port_id": ids["red1"], "to_port_id": ids["red3"]})
    assert r.status_code == 200 and r.json()["verdict"]["port"] == "red3"


@pytest.mark.parametrize("body", [
    {"to_ip": "198.19.1.13"},
    {"port_id": 1},
    {"port_id": 1, "to_ip": "198.19.1.13", "to_port_id": 2},
    {"port_id": 1, "to_ip": "not-an-ip"},
    {"port_id": 1, "to_ip": "198.19.1.13", "proto": "tcp"},
    {"port_id": 1, "to_ip": "198.19.1.13", "proto": "tcp", "dport": 70000},
    {"port_id": 1, "to_ip": "198.19.1.13", "ttl": 0},
    {"port_id": 1, "to_ip": "198.19.1.13", "ct_state": "related"},
    {"port_id": 1, "to_ip": "198.19.1.13", "surprise": 1},
    {"port_id": 2 ** 40, "to_ip": "198.19.1.13"},
])
def test_api_refuses_bad_bodies(api, body):
    client, _, _, admin, _ = api
    r = client.post("/v1/traces", headers=admin, json=body)
    assert r.status_code == 422, r.text


def test_api_needs_a_token(api):
    client, ids, _, _, _ = api
    assert client.post("/v1/traces", json={"port_id": ids["vm1"], "to_ip": "198.19.1.13"}).status_code == 401


def test_api_before_the_first_pass(api):
    client, ids, _, admin, compiled = api
    kept = list(compiled)
    compiled[:] = [None, {}]
    try:
        r = client.post("/v1/traces", headers=admin, json={"port_id": ids["vm1"], "to_ip": "198.19.1.13"})
        assert r.status_code == 409 and "not compiled the model yet" in r.text
    finally:
        compiled[:] = kept

