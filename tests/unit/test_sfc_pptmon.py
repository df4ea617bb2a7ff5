"""PPTMon on port chains: the pure derivation of the attachments (roles, instances, nodes, hooks),
the chain's status from the agents' word, the lost-across verdict, and the API (a chain's
`pptmon`, records filed under the chain from the model, stats per chain, group and port pair)."""
from __future__ import annotations

from dataclasses import replace

from sqlalchemy.orm import Session

from fathom.model.hostlocal_desired import desired
from fathom.model.chains import (
    OWNER_KIND, chain_attachments, chain_label, chain_pptmon, chain_warnings, lost_across, parse_chain_label,
)
from fathom.model.chains import chain_pptmon_status
from fathom.model import ChainPptmon, PortChain, PortPair, PortPairGroup
from fathom.model.hostlocal import digest, digest_json, from_json, to_json
from fathom.store import agents as ag
from fathom.store.snapshot import load_snapshot

from .pptmon_records import record
from .test_api_sfc import _chain, api  # noqa: F401 - fixture
from .test_compiler_sfc import model

PAIRS = (PortPair(1, "fwa", "p1", 20, 21), PortPair(2, "fwb", "p1", 22, 23), PortPair(3, "dpi", "p1", 24, 25),
         PortPair(4, "nat", "p1", 26, 27))
GROUPS = (PortPairGroup(1, "fw", "p1", (1, 2)), PortPairGroup(2, "nat", "p1", (4,)), PortPairGroup(3, "dpi", "p1", (3,)))


def measured(groups=(1, 2, 3), period=10**9, datapath="system", **kw):
    snap = model(chains=(PortChain(7, "c", "p1", groups, (1,), pptmon=ChainPptmon(period) if period is not None
                                   else None),), pairs=PAIRS, groups=GROUPS, **kw)
    return replace(snap, nodes=tuple(replace(n, datapath_type=datapath) for n in snap.nodes))


# ---------------------------------------------------------------------------------------------- derivation


def test_roles_follow_the_chain_order_and_every_instance_has_its_groups_role():
    vnfs = chain_pptmon(measured(), 7)
    assert [(v.group_id, v.pair_id, v.vnf_id, v.role, v.node) for v in vnfs] == [
        (1, 1, 1, "source", "c1"), (1, 2, 2, "source", "c2"), (2, 4, 3, "transit", "c2"), (3, 3, 4, "sink", "c3")]
    # the hooks are on the host side of the VNF's ports: into the VM on its ingress, out of it on its egress
    assert [(v.in_point, v.out_point) for v in vnfs] == [
        ("fwai:egress", "fwao:ingress"), ("fwbi:egress", "fwbo:ingress"), ("nati:egress", "nato:ingress"),
        ("dpii:egress", "dpio:ingress")]
    two = chain_pptmon(measured(groups=(3, 1)), 7)
    assert [(v.pair_id, v.role) for v in two] == [(3, "source"), (1, "sink"), (2, "sink")]
    assert [(v.pair_id, v.role) for v in chain_pptmon(measured(groups=(1,)), 7)] == \
        [(1, "source-sink"), (2, "source-sink")]


def test_attachments_land_on_the_nodes_of_the_instances_with_the_chains_period():
    out = desired(measured(period=5_000_000))
    got = {n: [(o.owner, o.chain, o.vnf_id, o.mode, o.period_ns) for o in objs if o.KIND == "pptmon_attach"]
           for n, objs in out.items()}
    label = chain_label(7)
    assert got == {"c1": [((OWNER_KIND, 1), label, 1, "source", 5_000_000)],
                   "c2": [((OWNER_KIND, 2), label, 2, "source", 5_000_000), ((OWNER_KIND, 4), label, 3, "transit",
                                                                             5_000_000)],
                   "c3": [((OWNER_KIND, 3), label, 4, "sink", 5_000_000)]}
    # the wire form round-trips, and the agent's local names never meet an operator attachment's (its id)
    for objs in out.values():
        for o in (o for o in objs if o.KIND == "pptmon_attach"):
            assert from_json(to_json(o)) == o and o.local_name == f"{OWNER_KIND}-{o.attachment_id}"
    assert parse_chain_label(label) == 7 and parse_chain_label("pa1") is None and parse_chain_label("port_chain:x") is None


def test_no_pptmon_no_attachment_and_an_unplaced_instance_is_a_problem():
    assert chain_attachments(measured(period=None)) == [] and chain_pptmon(measured(period=None), 7) == []
    snap = measured()
    snap = replace(snap, ports=tuple(replace(p, node=None) if p.name == "nati" else p for p in snap.ports))
    vnfs = chain_pptmon(snap, 7)
    nat = next(v for v in vnfs if v.pair_id == 4)
    assert nat.node is None and "not bound" in nat.problem
    assert sorted(a.attachment_id for _, a in chain_attachments(snap)) == [1, 2, 3]
    st = chain_pptmon_status(snap, 7, {(OWNER_KIND, i): ("active", None) for i in (1, 2, 3)})
    assert st[0] == "pending" and "port pair 4: not bound" in st[1]


def test_the_controller_derives_the_attachments_whatever_the_datapath():
    """Whether the programs can work depends on how each VIF is plugged, which only the node's agent
    sees (fathom.agent.plugging): the controller derives the same attachments on a netdev node, a
    kernel-datapath one and one whose datapath is not known yet, naming the br-int interfaces."""
    system = chain_attachments(measured(datapath="system"))
    assert chain_attachments(measured(datapath="netdev")) == system == chain_attachments(measured(datapath=None))
    assert sorted(a.attachment_id for _, a in system) == [1, 2, 3, 4]
    assert all(a.names_ports for _, a in system)
    assert chain_pptmon_status(measured(datapath="netdev"), 7, {})[0] == "pending"


def test_an_agents_pending_reason_reaches_the_status():
    """The agent says `pending` with a reason while a port's interface is missing (and `error`
    where the plugging cannot work): the status carries the reason for the object it applied."""
    from fathom.controller.status import hostlocal
    from fathom.model.hostlocal import digest
    (node, obj), *_ = chain_attachments(measured())
    def view(said):
        return {node: ag.AgentView(node, 1, 1, {}, {f"{OWNER_KIND}:{obj.attachment_id}": said}, 100.0, None)}
    waiting = {"status": "pending", "reason": "waiting for interface 'qvox' on node c1", "applied": digest([obj])}
    assert hostlocal({node: [obj]}, view(waiting), 100.0, 60)[obj.owner] == \
        ("pending", f"node {node}: waiting for interface 'qvox' on node c1")
    older = {**waiting, "applied": "0" * 16}     # about an older version: no word on this one yet
    assert hostlocal({node: [obj]}, view(older), 100.0, 60)[obj.owner] == \
        ("pending", f"waiting for the agent on node {node}")
    refused = {"status": "error", "reason": "runs OVS's netdev datapath", "applied": digest([obj])}
    assert hostlocal({node: [obj]}, view(refused), 100.0, 60)[obj.owner] == \
        ("error", f"node {node}: runs OVS's netdev datapath")


def test_the_chains_status_is_the_worst_of_its_instances_agents():
    snap = measured()
    every = {(OWNER_KIND, i): ("active", None) for i in (1, 2, 3, 4)}
    assert chain_pptmon_status(snap, 7, every) == ("active", None)
    st = chain_pptmon_status(snap, 7, {**every, (OWNER_KIND, 3): ("error", "node c3: no interface 'dpii'")})
    assert st == ("error", "PPTMon on port pair 3: node c3: no interface 'dpii'")
    missing = dict(every)
    del missing[(OWNER_KIND, 2)]
    assert chain_pptmon_status(snap, 7, missing) == ("pending", "PPTMon on port pair 2: waiting for the agent on "
                                                                "node c2")


def _view(node, objects):
    return ag.AgentView(node, 1, 1, {}, objects, 1.0, 1.0)


def _reports(snap, counters: dict[int, dict], applied_from=None) -> dict:
    """What the agents report: each instance's counters (as `pptmon-loader stats` prints them) with
    the digest of the attachment it runs (of `applied_from`'s when given: a loader not restarted yet)."""
    held = {a.attachment_id: (node, a) for node, a in chain_attachments(applied_from or snap)}
    views: dict[str, dict] = {}
    for pair, c in counters.items():
        node, a = held[pair]
        views.setdefault(node, {})[f"{OWNER_KIND}:{pair}"] = {"status": "active", "applied": digest([a]),
                                                             "counters": c}
    return {node: _view(node, objects) for node, objects in views.items()}


def _stats(sampled=0, reported=0):
    return {"in_pkts": sampled + reported, "out_pkts": sampled + reported, "sampled": sampled, "appended": 0,
            "finalized": sampled + reported, "reported": reported, "stripped": reported, "skip_gso": 0,
            "skip_mtu": 0, "skip_nospace": 0, "skip_other": 0, "skip_counted": 0, "not_ours": 0, "rb_drop": 0,
            "err": 0, "leaked": 0}


def test_lost_across_compares_what_the_sources_stamped_with_what_reached_the_sinks():
    snap = measured()
    def agents(sampled, reported):
        return _reports(snap, {1: _stats(sampled=sampled[0]), 2: _stats(sampled=sampled[1]), 4: _stats(),
                               3: _stats(reported=reported)})
    ok = lost_across(snap, 7, agents((10, 5), 14))
    assert ok == {"counted": True, "stamped": 15, "reached": 14, "lost_across": 1}
    assert chain_warnings(snap, agents((10, 5), 14)) == {}
    # a TCP-terminating VNF: the sink never sees the option
    cut = chain_warnings(snap, agents((10, 5), 0))
    assert "15 of 15 sampled packets reached the last group without the option" in cut[7]
    nothing = {"counted": False, "stamped": 0, "reached": 0, "lost_across": 0}
    assert lost_across(snap, 7, {}) == nothing
    # a source not reporting yet: no comparison (its packets would count as lost)
    assert lost_across(snap, 7, _reports(snap, {1: _stats(sampled=10), 3: _stats(reported=0)})) == nothing


def test_a_chain_update_restarts_the_comparison_on_every_instance():
    """fw -> dpi -> nat measured, then dpi removed: nat's VNF id changes (3 -> 2) and its loader
    starts again from zero. fw's must too (its attachment carries the chain's path), and until
    every source and sink reports counters of the new path nothing is compared: the old fw's
    count against the new nat's would read as thousands of packets lost."""
    groups = (PortPairGroup(1, "fw", "p1", (1,)), PortPairGroup(3, "dpi", "p1", (3,)),
              PortPairGroup(2, "nat", "p1", (4,)))
    before = replace(measured(groups=(1, 3, 2)), port_pair_groups=groups)
    after = replace(measured(groups=(1, 2)), port_pair_groups=groups)
    old, new = dict(chain_attachments(before)), dict(chain_attachments(after))
    assert {n: (a.vnf_id, a.mode) for n, a in new.items()} == {"c1": (1, "source"), "c2": (2, "sink")}
    assert old["c1"].vnf_id == new["c1"].vnf_id and old["c1"] != new["c1"], "fw's loader starts again too"
    assert lost_across(before, 7, _reports(before, {1: _stats(sampled=7536), 3: _stats(), 4: _stats(reported=7530)})
                       )["lost_across"] == 6
    # nat restarted under its new id, fw's agent has not applied the change yet
    stale_fw = {**_reports(before, {1: _stats(sampled=7536)}), **_reports(after, {4: _stats(reported=395)})}
    assert lost_across(after, 7, stale_fw) == {"counted": False, "stamped": 0, "reached": 0, "lost_across": 0}
    assert chain_warnings(after, stale_fw) == {}
    fresh = _reports(after, {1: _stats(sampled=400), 4: _stats(reported=395)})
    assert lost_across(after, 7, fresh) == {"counted": True, "stamped": 400, "reached": 395, "lost_across": 5}
    assert chain_warnings(after, fresh) == {}


# ---------------------------------------------------------------------------------------------- API


def _measured_api(api, **pptmon):  # noqa: F811
    for node in api.get("/nodes"):      # the kernel datapath: what PPTMon on chains needs
        api.patch(f"/nodes/{node['id']}", {"datapath_type": "system"})
    p1, p2, p3, g1, g2, fc, chain = _chain(api)
    c = api.patch(f"/sfc/port_chains/{chain['id']}", {"pptmon": pptmon or {"period_ns": 1_000_000}})
    return p1, p2, p3, g1, g2, c


def test_a_chains_pptmon_at_create_and_in_place(api):  # noqa: F811
    p1, p2, p3, g1, g2, fc, chain = _chain(api)
    assert chain["pptmon"] is None
    c = api.patch(f"/sfc/port_chains/{chain['id']}", {"pptmon": {"period_ns": 0}})
    assert c["pptmon"] == {"period_ns": 0} and c["status"] == "pending"
    assert api.patch(f"/sfc/port_chains/{chain['id']}", {"pptmon": {}})["pptmon"] == {"period_ns": 10**9}
    assert api.patch(f"/sfc/port_chains/{chain['id']}", {"name": "x"})["pptmon"] == {"period_ns": 10**9}
    with Session(api.app.state.engine) as s:
        assert load_snapshot(s).port_chains[0].pptmon == ChainPptmon(10**9)
    assert api.patch(f"/sfc/port_chains/{chain['id']}", {"pptmon": None})["pptmon"] is None
    for bad in ({"period_ns": -1}, {"period_ns": 10**20}, {"period_ns": "1s"}, {"every": 1}, 5):
        api.patch(f"/sfc/port_chains/{chain['id']}", {"pptmon": bad}, status=422)
    api.delete(f"/sfc/port_chains/{chain['id']}")
    made = api.post("/sfc/port_chains", {"port_pair_groups": [g1["id"], g2["id"]], "project_id": "p1",
                                         "pptmon": {"period_ns": 2_000_000}})
    assert made["pptmon"] == {"period_ns": 2_000_000}


def test_the_agents_get_the_chains_attachments(api):  # noqa: F811
    p1, p2, p3, g1, g2, c = _measured_api(api)
    def attachments(node):   # the nodes also run their networks' DHCP servers
        objects = api.get(f"/agents/{node}/desired", headers=("admin", "agent", node))["objects"]
        return [o for o in objects if o["kind"] == "pptmon_attach"]
    c1, c2 = attachments("c1"), attachments("c2")
    assert [(o["owner"], o["mode"], o["vnf_id"], o["in_point"], o["out_point"]) for o in c1] == [
        ([OWNER_KIND, p1["id"]], "source", 1, "fw1i:egress", "fw1o:ingress")]
    assert [(o["owner"], o["mode"], o["vnf_id"]) for o in c2] == [
        ([OWNER_KIND, p2["id"]], "source", 2), ([OWNER_KIND, p3["id"]], "sink", 3)]
    assert {o["chain"] for o in c1 + c2} == {chain_label(c["id"])}
    api.patch(f"/sfc/port_chains/{c['id']}", {"pptmon": None})
    assert attachments("c2") == []


def _deliver(api, node, records, status=200):
    r = api.http.post("/v1/pptmon/records", json={"node": node, "records": records},
                      headers=api.who(("admin", "agent", node)))
    assert r.status_code == status, r.text
    return r.json()


def test_records_are_filed_under_the_chain_from_the_model_and_stats_per_group_and_pair(api):  # noqa: F811
    p1, p2, p3, g1, g2, c = _measured_api(api)
    label = chain_label(c["id"])
    # the sink (dpi, vnf 3) is on c2; hops through fw1 (vnf 1) or fw2 (vnf 2), then the dpi
    via_fw1 = [dict(record(i, hops=(4, 6), chain=label, vnf_ns="c2"), sink_vnf=3) for i in range(6)]
    for r in via_fw1:
        r["hops"] = [{"vnf": 1, "ppt_us": 4}, {"vnf": 3, "ppt_us": 6}]
    via_fw2 = [dict(record(100 + i, hops=(8, 2), chain=label, vnf_ns="c2"), sink_vnf=3) for i in range(4)]
    for r in via_fw2:
        r["hops"] = [{"vnf": 2, "ppt_us": 8}, {"vnf": 3, "ppt_us": 2}]
    assert _deliver(api, "c2", via_fw1 + via_fw2)["accepted"] == 10
    # the same name from a node that holds no sink of the chain: stored, not filed under it
    forged = [dict(record(500, chain=label, vnf_ns="c1"), sink_vnf=3)]
    assert _deliver(api, "c1", forged)["accepted"] == 1
    stored = api.get("/pptmon/records", chain=label, limit=100)
    filed = [r for r in stored if r["port_chain_id"] == c["id"]]
    assert len(filed) == 10 and all(r["node"] == "c2" for r in filed)
    assert [r for r in stored if r["port_chain_id"] is None][0]["node"] == "c1"
    assert {(h["vnf"], h["group"], h["port_pair"], h["node"]) for r in filed for h in r["hops"]} == {
        (1, g1["id"], p1["id"], "c1"), (2, g1["id"], p2["id"], "c2"), (3, g2["id"], p3["id"], "c2")}

    st = api.get(f"/sfc/port_chains/{c['id']}/pptmon", window="10m")
    assert st["records"] == 10 and st["e2e"]["count"] == 10 and st["pptmon"] == {"period_ns": 1_000_000}
    assert [(g["id"], g["role"], g["processing"]["count"]) for g in st["groups"]] == [
        (g1["id"], "source", 10), (g2["id"], "sink", 10)]
    fw = st["groups"][0]["port_pairs"]
    assert [(p["id"], p["vnf_id"], p["node"], p["processing"]["count"], p["processing"]["p50_us"]) for p in fw] == [
        (p1["id"], 1, "c1", 6, 4.0), (p2["id"], 2, "c2", 4, 8.0)]
    assert st["lost_across"] == 0 and st["warnings"] == []
    # another project sees nothing of it; an unknown chain is a 404
    api.get(f"/sfc/port_chains/{c['id']}/pptmon", status=404, headers=("p2", "member"))
    api.get("/sfc/port_chains/999/pptmon", status=404)
    api.get(f"/sfc/port_chains/{c['id']}/pptmon", status=422, window="5m", since="1m")


def test_records_that_arrive_after_pptmon_is_turned_off_are_still_filed_under_the_chain(api):  # noqa: F811
    """The sink's last samples reach the controller a moment after they were taken (the agent
    batches for a second): turning `pptmon` off meanwhile must not orphan them."""
    p1, p2, p3, g1, g2, c = _measured_api(api)
    label = chain_label(c["id"])
    api.patch(f"/sfc/port_chains/{c['id']}", {"pptmon": None})
    late = dict(record(900, hops=(4, 6), chain=label, vnf_ns="c2"), sink_vnf=3)
    late["hops"] = [{"vnf": 1, "ppt_us": 4}, {"vnf": 3, "ppt_us": 6}]
    assert _deliver(api, "c2", [late])["accepted"] == 1
    [stored] = api.get("/pptmon/records", chain=label, limit=10)
    assert stored["port_chain_id"] == c["id"]
    assert [(h["vnf"], h["port_pair"], h["node"]) for h in stored["hops"]] == [(1, p1["id"], "c1"), (3, p3["id"], "c2")]
    st = api.get(f"/sfc/port_chains/{c['id']}/pptmon", window="10m")
    assert st["pptmon"] is None and st["records"] == 1
    assert [(p["id"], p["processing"]["count"]) for g in st["groups"] for p in g["port_pairs"]] == [
        (p1["id"], 1), (p2["id"], 0), (p3["id"], 1)]
    # still only from the node of the chain's sink
    forged = dict(record(901, chain=label, vnf_ns="c1"), sink_vnf=3)
    _deliver(api, "c1", [forged])
    stored = api.get("/pptmon/records", chain=label, limit=10)
    assert [r["port_chain_id"] for r in stored if r["node"] == "c1"] == [None]


def test_counters_in_reports_feed_lost_across_but_wake_nothing(api):  # noqa: F811
    p1, p2, p3, g1, g2, c = _measured_api(api)
    key = lambda p: f"{OWNER_KIND}:{p['id']}"  # noqa: E731

    def rep(node, objects):
        held = {f"{o['owner'][0]}:{o['owner'][1]}": digest_json([o]) for o in
                api.get(f"/agents/{node}/desired", headers=("admin", "agent", node))["objects"]}
        objects = {k: {**v, "applied": held[k]} for k, v in objects.items()}
        r = api.http.post(f"/v1/agents/{node}/report", json={"objects": objects},
                          headers=api.who(("admin", "agent", node)))
        assert r.status_code == 204, r.text
    rep("c1", {key(p1): {"status": "active", "counters": {"sampled": 20}}})
    rep("c2", {key(p2): {"status": "active", "counters": {"sampled": 0}},
               key(p3): {"status": "active", "counters": {"reported": 0, "appended": 20}}})
    st = api.get(f"/sfc/port_chains/{c['id']}/pptmon")
    assert (st["stamped"], st["reached"], st["lost_across"]) == (20, 0, 20)
    assert "without the option" in st["warnings"][0]
    before = api.changes
    rep("c1", {key(p1): {"status": "active", "counters": {"sampled": 25}}})
    assert api.changes == before, "a report whose statuses did not change wakes nothing"
    r = api.http.post("/v1/agents/c1/report", json={"objects": {key(p1): {"status": "active",
                                                                          "counters": {"sampled": -1}}}},
                      headers=api.who(("admin", "agent", "c1")))
    assert r.status_code == 422


def test_a_measured_chain_fits_the_option(api):  # noqa: F811
    p1, p2, p3, g1, g2, fc, chain = _chain(api)
    # nine groups: one entry each does not fit in the option's eight
    more = []
    for i in range(9 - 2):
        pi = api.post("/ports", {"network_id": api.get(f"/ports/{api.ports['fw1i']}")["network_id"],
                                 "name": f"x{i}i", "node": "c1", "interface_name": f"x{i}i", "project_id": "p1",
                                 "port_security": False})
        po = api.post("/ports", {"network_id": pi["network_id"], "name": f"x{i}o", "node": "c1",
                                 "interface_name": f"x{i}o", "project_id": "p1", "port_security": False})
        pair = api.post("/sfc/port_pairs", {"ingress": pi["id"], "egress": po["id"], "project_id": "p1"})
        more.append(api.post("/sfc/port_pair_groups", {"port_pairs": [pair["id"]], "project_id": "p1"})["id"])
    api.patch(f"/sfc/port_chains/{chain['id']}", {"port_pair_groups": [g1["id"], g2["id"], *more]})
    r = api.http.patch(f"/v1/sfc/port_chains/{chain['id']}", json={"pptmon": {"period_ns": 1}},
                       headers=api.who(None))
    assert r.status_code == 422 and "at most 8 port pair groups" in r.text
