"""The node agents' API and the host-local desired state, over a real store (SQLite and PostgreSQL).

What is checked: the pure host-local function (router namespaces of network-node routers, PPTMon
attachments, per node, with owners); the revision moves on exactly when a node's desired state
changes and the long-poll answers on a change or at its timeout; an agent token reads and reports
for its own node only; reports are bounded; the status model turns reports into statuses (agent
down, pending, error, active); a node's datapath type follows the override, else the agent's facts.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from fathom.model.hostlocal_desired import desired
from fathom.controller import status
from fathom.model.hostlocal import Digests, PptmonAttach, RouterLeg, RouterNamespace, digest, from_json, to_json
from fathom.store import agents as ag
from fathom.store.snapshot import load_snapshot

from .test_api import Client  # noqa: F401 - the api fixture's client
from .test_api import api  # noqa: F401 - fixture

GW_AGENT = ("admin", "agent", "gw")
C1_AGENT = ("admin", "agent", "c1")


def report(api, node: str, body: dict, status: int = 204, headers=None) -> None:
    r = api.http.post(f"/v1/agents/{node}/report", json=body, headers=api.who(headers or ("admin", "agent", node)))
    assert r.status_code == status, r.text


def _cloud(api):
    api.post("/nodes", {"name": "c1", "tunnel_ip": "198.18.0.1"})
    api.post("/nodes", {"name": "gw", "role": "gateway", "tunnel_ip": "198.18.0.9"})
    _, s1 = api.network("blue", "198.19.1.0/24")
    _, s2 = api.network("red", "198.19.2.0/24")
    r = api.post("/routers", {"name": "r"})
    api.post(f"/routers/{r['id']}/interfaces", {"subnet_id": s1["id"]})
    api.post(f"/routers/{r['id']}/interfaces", {"subnet_id": s2["id"]})
    return r


def _snapshot(api):
    from sqlalchemy.orm import Session
    with Session(api.app.state.engine) as s:
        return load_snapshot(s), ag.attachments(s)


def test_host_local_state_is_a_pure_function_of_the_model(api):
    r = _cloud(api)
    snap, atts = _snapshot(api)
    assert desired(snap, atts) == {"c1": [], "gw": []}          # distributed: nothing on a host
    api.patch(f"/routers/{r['id']}", {"mode": "network-node", "gateway_node": "gw"})
    snap, atts = _snapshot(api)
    got = desired(snap, atts)
    assert got["c1"] == [] and len(got["gw"]) == 1
    ns = got["gw"][0]
    assert isinstance(ns, RouterNamespace) and ns.owner == ("router", r["id"])
    assert [leg.address for leg in ns.legs] == ["198.19.1.1/24", "198.19.2.1/24"]
    assert all(leg.outer == f"qrp{leg.id}" and leg.inner == f"qr{leg.id}" for leg in ns.legs)
    # the wire form round-trips, and the digest is order-independent
    assert [from_json(to_json(o)) for o in got["gw"]] == got["gw"]
    a = PptmonAttach(7, "ch", 1, "source-sink", "qrp1:egress", "qrp2:ingress", 0)
    assert digest([ns, a]) == digest([a, ns]) != digest([ns])
    with pytest.raises(ValueError):
        from_json({"kind": "teleporter", "owner": ["x", 1]})


def test_the_revision_moves_on_a_change_only_and_the_long_poll_answers_it(api):
    r = _cloud(api)
    d = api.get("/agents/gw/desired", headers=GW_AGENT)
    rev = d["revision"]
    assert d["objects"] == [] and api.get("/agents/gw/desired", headers=GW_AGENT)["revision"] == rev
    # nothing changes: the long-poll waits for its timeout and gives the same revision
    t0 = time.monotonic()
    assert api.get("/agents/gw/desired", headers=GW_AGENT, after=rev, timeout=0.6)["revision"] == rev
    assert time.monotonic() - t0 >= 0.5
    # a change of the model wakes a waiting long-poll at once
    got = {}

    def poll():
        t = time.monotonic()
        got["answer"] = api.get("/agents/gw/desired", headers=GW_AGENT, after=rev, timeout=20)
        got["took"] = time.monotonic() - t
    th = threading.Thread(target=poll)
    th.start()
    time.sleep(0.5)
    api.patch(f"/routers/{r['id']}", {"mode": "network-node", "gateway_node": "gw"})
    th.join(20)
    assert got["answer"]["revision"] == rev + 1 and got["took"] < 5
    assert [o["kind"] for o in got["answer"]["objects"]] == ["router_namespace"]
    assert got["answer"]["objects"][0]["owner"] == ["router", r["id"]]
    # another node's state did not move
    c1 = api.get("/agents/c1/desired", headers=C1_AGENT)
    assert c1["objects"] == [] and api.get("/agents/c1/desired", headers=C1_AGENT)["revision"] == c1["revision"]


def test_a_long_poll_with_keepalive_streams_a_space_each_period_then_the_answer(api):
    """`keepalive=1`: an answer at once is JSON with the keepalive header (the agent learns this
    controller sends them); a poll still waiting after a second starts its answer, a space each
    second, then the new revision's JSON once a change moves it; one whose timeout ends gets its
    revision again after its spaces. The hub counts the agent as holding a poll until the stream ends."""
    r = _cloud(api)
    hub = api.app.state.agent_hub
    at_once = api.http.get("/v1/agents/gw/desired", params={"keepalive": 1}, headers=api.who(GW_AGENT))
    assert at_once.status_code == 200 and at_once.headers["x-fathom-keepalive"] == "1"
    rev = at_once.json()["revision"]
    arrived: list[tuple[float, bytes]] = []

    def poll(timeout):
        arrived.clear()
        t = time.monotonic()
        with api.http.stream("GET", "/v1/agents/gw/desired", params={"after": rev, "timeout": timeout, "keepalive": 1},
                             headers=api.who(GW_AGENT)) as stream:
            assert stream.status_code == 200 and stream.headers["x-fathom-keepalive"] == "1"
            for chunk in stream.iter_raw():
                arrived.append((time.monotonic() - t, chunk))
    th = threading.Thread(target=poll, args=(20,))
    th.start()
    time.sleep(3.4)
    assert hub.present().get("gw") == 0.0                            # held: the agent is here
    api.patch(f"/routers/{r['id']}", {"mode": "network-node", "gateway_node": "gw"})
    th.join(20)
    body = b"".join(c for _, c in arrived)
    spaces = [t for t, c in arrived if c == b" "]
    assert len(spaces) >= 2 and 0.9 < spaces[0] < 2 and all(0.8 < b - a < 1.5 for a, b in zip(spaces, spaces[1:]))
    answer = json.loads(body)
    assert answer["revision"] == rev + 1 and [o["kind"] for o in answer["objects"]] == ["router_namespace"]
    deadline = time.monotonic() + 2                                  # released once the stream ended
    while hub.present().get("gw") == 0.0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hub.present().get("gw") != 0.0
    # nothing moves: spaces until the timeout, then the same revision
    rev += 1
    poll(2.5)
    assert body.strip() and json.loads(b"".join(c for _, c in arrived))["revision"] == rev
    assert [c for _, c in arrived][:2] == [b" ", b" "] and arrived[-1][0] >= 2.4


def test_a_change_wakes_only_the_long_polls_of_the_nodes_it_moves(api):
    """One refresh works the state out; only the moved node's long-poll is woken (the other
    sleeps on to its timeout), and a change between a long-poll's look and its wait is not lost."""
    r = _cloud(api)
    hub = api.app.state.agent_hub
    agents = {"gw": GW_AGENT, "c1": C1_AGENT}
    revs = {n: api.get(f"/agents/{n}/desired", headers=h)["revision"] for n, h in agents.items()}
    got = {}

    def poll(node, timeout):
        t = time.monotonic()
        answer = api.get(f"/agents/{node}/desired", headers=agents[node], after=revs[node], timeout=timeout)
        got[node] = (answer["revision"], time.monotonic() - t)
    threads = {n: threading.Thread(target=poll, args=(n, t)) for n, t in (("gw", 20), ("c1", 3))}
    for th in threads.values():
        th.start()
    time.sleep(0.5)
    woken, refreshes = hub.woken, hub.refreshes
    api.patch(f"/routers/{r['id']}", {"mode": "network-node", "gateway_node": "gw"})
    threads["gw"].join(20)
    assert got["gw"][0] == revs["gw"] + 1 and got["gw"][1] < 2.5
    assert threads["c1"].is_alive()                        # not woken: its state did not move
    assert hub.woken - woken == 1 and hub.refreshes > refreshes
    threads["c1"].join(10)
    assert got["c1"][0] == revs["c1"] and got["c1"][1] >= 2.9
    # a refresh that ends after a long-poll looked and before it waits: it looks again at once
    seen = hub.refreshes
    hub.changed()
    deadline = time.monotonic() + 5
    while hub.refreshes == seen and time.monotonic() < deadline:
        time.sleep(0.01)

    async def late():
        t = time.monotonic()
        await hub.wait("c1", 5, seen)
        return time.monotonic() - t
    assert asyncio.run(late()) < 0.5


def test_an_agent_token_speaks_for_its_own_node_only(api):
    _cloud(api)
    api.get("/agents/c1/desired", status=403, headers=GW_AGENT)
    report(api, "c1", {}, 403, headers=GW_AGENT)
    report(api, "gw", {}, 403, headers=api.admin)                          # an admin reports for no one
    api.get("/agents/gw/desired", status=403, headers=("p1", "member"))
    api.get("/agents", status=403, headers=GW_AGENT)
    api.get("/agents/nosuch/desired", status=404)
    api.post("/pptmon/attachments", {"name": "a", "node": "gw", "chain": "c", "in_interface": "x",
                                     "out_interface": "y"}, status=403, headers=GW_AGENT)
    # its node's agent token does not deliver records for another node either (unchanged rule)
    assert api.http.post("/v1/pptmon/records", json={"node": "c1", "records": []},
                         headers=api.who(GW_AGENT)).status_code == 403


def test_reports_are_kept_bounded_and_listed(api):
    _cloud(api)
    before = api.changes
    body = {"agent_started": time.time(), "applied_revision": 1,
            "facts": {"ovs_version": "3.1.0", "datapath_types": ["netdev", "system"], "ovs_kernel_module": False,
                      "kernel": "Linux 6.1", "ebpf": {"btf": True}, "interfaces": [{"name": "ul0", "up": True}]},
            "objects": {"router:1": {"status": "active", "reason": None, "applied": "0" * 64}}}
    report(api, "gw", body)
    assert api.changes == before + 1                       # news: the reconciler is woken
    report(api, "gw", body)
    assert api.changes == before + 1                       # a heartbeat wakes nothing
    listed = {a["node"]: a for a in api.get("/agents")}
    assert listed["gw"]["state"] == "up" and listed["gw"]["facts"]["ovs_version"] == "3.1.0"
    assert listed["c1"]["state"] == "never reported"
    assert api.get("/agents/gw", headers=GW_AGENT)["objects"]["router:1"]["status"] == "active"
    for bad in ({"objects": {"router": {"status": "active"}}}, {"objects": {"router:1": {"status": "fine"}}},
                {"facts": {"interfaces": [{"name": "x" * 16}]}}, {"surprise": 1},
                {"objects": {"router:1": {"status": "error", "reason": "x" * 2000}}}):
        report(api, "gw", bad, 422)


def test_pptmon_attachments_are_an_admin_resource_in_the_nodes_desired_state(api):
    _cloud(api)
    body = {"name": "a1", "node": "gw", "chain": "rt", "mode": "source-sink", "in_interface": "qrp3",
            "in_direction": "egress", "out_interface": "qrp4", "out_direction": "ingress", "period_ns": 0}
    rev = api.get("/agents/gw/desired", headers=GW_AGENT)["revision"]
    a = api.post("/pptmon/attachments", body)
    assert a["status"] == "pending" and a["node"] == "gw"
    d = api.get("/agents/gw/desired", headers=GW_AGENT)
    assert d["revision"] == rev + 1
    assert d["objects"] == [{"kind": "pptmon_attach", "owner": ["pptmon_attachment", a["id"]],
                             "attachment_id": a["id"], "chain": "rt", "vnf_id": 1, "mode": "source-sink",
                             "in_point": "qrp3:egress", "out_point": "qrp4:ingress", "period_ns": 0,
                             "owner_kind": "pptmon_attachment", "path": ""}]
    api.post("/pptmon/attachments", {**body, "name": "a2"}, status=409)                 # the same hook
    api.post("/pptmon/attachments", {**body, "name": "a3", "node": "nosuch"}, status=404)
    api.post("/pptmon/attachments", {**body, "name": "a4", "in_interface": "x" * 16}, status=422)
    api.post("/pptmon/attachments", {**body, "name": "a5", "mode": "teleport"}, status=422)
    api.post("/pptmon/attachments", {**body, "name": "a6"}, status=403, headers=("p1", "member"))
    assert api.patch(f"/pptmon/attachments/{a['id']}", {"period_ns": 10**6})["period_ns"] == 10**6
    assert api.get("/agents/gw/desired", headers=GW_AGENT)["revision"] == rev + 2
    assert [x["name"] for x in api.get("/pptmon/attachments")] == ["a1"]
    api.delete(f"/pptmon/attachments/{a['id']}")
    assert api.get("/agents/gw/desired", headers=GW_AGENT)["objects"] == []


def test_the_datapath_type_is_the_override_else_the_agents_facts(api):
    api.post("/nodes", {"name": "gw", "role": "gateway"})
    n2 = api.post("/nodes", {"name": "k", "datapath_type": "netdev"})
    api.post("/nodes", {"name": "u"})
    facts = {"datapath_types": ["netdev", "system"], "ovs_kernel_module": True}
    report(api, "gw", {"facts": facts})
    report(api, "k", {"facts": facts})
    snap, _ = _snapshot(api)
    assert {n.name: n.datapath_type for n in snap.nodes} == {"gw": "system", "k": "netdev", "u": None}
    api.patch(f"/nodes/{n2['id']}", {"datapath_type": None})
    report(api, "gw", {"facts": {**facts, "ovs_kernel_module": False}})
    snap, _ = _snapshot(api)
    assert {n.name: n.datapath_type for n in snap.nodes} == {"gw": "netdev", "k": "system", "u": None}
    api.patch(f"/nodes/{n2['id']}", {"datapath_type": "vhost"}, status=422)


def test_statuses_of_what_agents_hold():
    ns = RouterNamespace(5, (RouterLeg(11, "02:00:00:00:00:01", "10.0.0.1/24"),))
    att = PptmonAttach(3, "ch", 1, "source-sink", "a:ingress", "b:egress", 0)
    want = {"gw": [ns, att], "c1": []}
    now = 1000.0

    def view(objects, reported=now - 1):
        return ag.AgentView("gw", 2, 2, {}, objects, reported, now - 100)
    ok = {"router:5": {"status": "active", "applied": digest([ns])},
          "pptmon_attachment:3": {"status": "active", "applied": digest([att])}}
    assert status.hostlocal(want, {}, now, 15)[("router", 5)][0] == "error"             # never reported
    assert status.hostlocal(want, {"gw": view(ok)}, now, 15) == {("router", 5): ("active", None),
                                                                  ("pptmon_attachment", 3): ("active", None)}
    down = status.hostlocal(want, {"gw": view(ok, reported=now - 60)}, now, 15)
    assert down[("router", 5)][0] == "error" and "not reporting since" in down[("router", 5)][1]
    stale = {**ok, "router:5": {"status": "active", "applied": digest([att])}}        # an older version
    assert status.hostlocal(want, {"gw": view(stale)}, now, 15)[("router", 5)][0] == "pending"
    bad = {**ok, "pptmon_attachment:3": {"status": "error", "reason": "no interface 'a'"}}
    assert status.hostlocal(want, {"gw": view(bad)}, now, 15)[("pptmon_attachment", 3)] == \
        ("error", "node gw: no interface 'a'")


def test_remembered_digests_decide_as_fresh_ones_across_passes():
    """The controller keeps host-local objects' digests from pass to pass (Digests): an object
    rebuilt equal is served from the last pass, a changed one is digested again, and an agent
    still holding the old version stays pending."""
    now = 1000.0
    digests = Digests()
    old = RouterNamespace(5, (RouterLeg(11, "02:00:00:00:00:01", "10.0.0.1/24"),))
    same = RouterNamespace(5, (RouterLeg(11, "02:00:00:00:00:01", "10.0.0.1/24"),))    # the next pass's copy
    new = RouterNamespace(5, (RouterLeg(11, "02:00:00:00:00:01", "10.0.0.2/24"),))
    reported = ag.AgentView("gw", 2, 2, {}, {"router:5": {"status": "active", "applied": digest([old])}},
                            now - 1, now - 100)
    for obj, want in ((old, "active"), (same, "active"), (new, "pending"), (same, "active")):
        assert digests(obj) == digest([obj])
        assert status.hostlocal({"gw": [obj]}, {"gw": reported}, now, 15, digests)[("router", 5)][0] == want
        digests.next_round()
    # two rounds kept at most: what the last two rounds did not ask is gone
    digests.next_round()
    digests.next_round()
    assert not digests._now and not digests._before


def test_the_desired_state_read_part_by_part_equals_one_from_a_whole_read(api):
    """The long-polls' desired state follows the store through reads of its written parts only
    (ports patched by row): after every kind of change it equals the state from a whole read."""
    r = _cloud(api)
    net = api.get("/networks", name="blue")[0]
    cache = api.app.state.agent_desired

    def same() -> None:
        snap, atts = _snapshot(api)
        want = desired(snap, atts)
        for node in ("c1", "gw"):
            got = api.get(f"/agents/{node}/desired", headers=("admin", "agent", node))["objects"]
            assert got == json.loads(json.dumps([to_json(o) for o in want[node]])), node

    same()
    whole = dict(cache._reader.reads)
    p1 = api.post("/ports", {"network_id": net["id"], "name": "vm1", "node": "c1", "interface_name": "tap1"})
    same()                                                         # a DHCP server on c1 with its host
    p2 = api.post("/ports", {"network_id": net["id"], "name": "vm2", "node": "c1", "interface_name": "tap2"})
    same()
    assert cache._reader.reads.get("ports") == whole.get("ports") and cache._reader.patches.get("ports")
    api.patch(f"/ports/{p1['id']}", {"node": None})                  # unbound: no host of c1's server
    same()
    api.patch(f"/ports/{p1['id']}", {"node": "c1"})
    same()
    api.patch(f"/ports/{p2['id']}", {"node": "gw"})                 # moves to gw: a server there too
    same()
    api.delete(f"/ports/{p1['id']}")
    same()
    api.patch(f"/subnets/{api.get('/subnets', network_id=net['id'])[0]['id']}", {"enable_dhcp": False})
    same()
    api.patch(f"/routers/{r['id']}", {"mode": "network-node", "gateway_node": "gw"})
    same()
    api.post("/pptmon/attachments", {"name": "a", "node": "gw", "chain": "c", "in_interface": "x",
                                     "out_interface": "y"})
    same()


def test_the_attachments_list_names_their_nodes_in_as_many_statements_however_many(api):
    """Each attachment's node is named from one read of the listed attachments' nodes, not one
    read per node."""
    from .test_api import lists_in_fixed_statements

    def grow(i):
        api.post("/nodes", {"name": f"pn{i}", "tunnel_ip": f"198.18.0.{50 + i}"})
        api.post("/pptmon/attachments", {"name": f"a{i}", "node": f"pn{i}", "chain": "c", "in_interface": "x",
                                         "in_direction": "ingress", "out_interface": "y",
                                         "out_direction": "egress"})
    listed = lists_in_fixed_statements(api, ["/pptmon/attachments"], grow)["/pptmon/attachments"]
    assert [a["node"] for a in listed] == [f"pn{i}" for i in range(6)]
