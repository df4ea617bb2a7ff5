"""Flow records' sample actions in the security-group stages: where they go, that the pipeline still
holds and the filtering is unchanged, that a rate change compiles only its owners into what the
whole compile gives, that os-ken and OVS take the action as the spec renders it."""
from __future__ import annotations

import dataclasses

from fathom.apps import by_owner
from fathom.apps.secgroups import compile as whole_compile, compile_owners, touched
from fathom.model import flow_records as fr
from fathom.openflow.spec import Ct, FlowSpec, Sample
from fathom.pipeline import catalogue as cat
from fathom.pipeline import cookies as ck
from fathom.pipeline import stages as st

from .test_compiler_secgroups import TCP, cloud, connect, fabric
from .test_spec_encode import FakeDatapath, _round_trip_flow
from .test_spec_ovs import _dumped_flows, _install, ovs  # noqa: F401 - the real-OVS fixture

PROJECT = fr.FlowSampling(1, "p", None, ingress=1, admit=1, drop=1)
WEB1_OWN = fr.FlowSampling(2, "p", 11, ingress=100, admit=0, drop=0)   # web1: 1 in 100 sent, drops off


def sampled(**rows) -> object:
    return dataclasses.replace(cloud(), flow_sampling=tuple(rows.values()))


def samples(state) -> dict[tuple[int, int], list[FlowSpec]]:
    """(table, observation point) -> the flows sampling there."""
    out: dict = {}
    for f in state.flows:
        for a in f.actions:
            if isinstance(a, Sample):
                out.setdefault((f.table, a.obs_point_id), []).append(f)
    return out


def test_off_by_default_no_flow_samples():
    assert not any(samples(s) for s in whole_compile(cloud()).values())


def test_samples_name_the_rule_the_port_and_the_default_drop():
    states = {k.name: s for k, s in whole_compile(sampled(project=PROJECT, web1=WEB1_OWN)).items()}
    c1 = samples(states["c1"])
    # cli (port 14, default group: egress rule 1) on c1: what it sends, its admissions, its drops
    assert (st.EGRESS_CONNTRACK, fr.point_id(fr.PORT_INGRESS, 14)) in c1
    assert (st.EGRESS_ACL, fr.point_id(fr.ADMIT_EGRESS, 1)) in c1
    assert (st.INGRESS_ACL, fr.point_id(fr.ADMIT_INGRESS, 3)) in c1
    drop = c1[(st.INGRESS_ACL, fr.point_id(fr.DROP_INGRESS, 14))]
    assert [f.priority for f in drop] == [1] and drop[0].match_dict == {st.REG_DST_PORT: 14}
    assert drop[0].actions == (Sample(0xFFFF, fr.COLLECTOR_SET, fr.OBS_DOMAIN, fr.point_id(fr.DROP_INGRESS, 14)),)
    # web1's own row: 1 in 100 sent, no drops sampled; project q has none
    (sent,) = {a for f in c1[(st.EGRESS_CONNTRACK, fr.point_id(fr.PORT_INGRESS, 11))] for a in f.actions
               if isinstance(a, Sample)}
    assert sent.probability == 655
    assert not any(k[1] in (fr.point_id(fr.DROP_EGRESS, 11), fr.point_id(fr.DROP_INGRESS, 11)) for k in c1)
    assert not any(fr.parse_point(p)[1] in (15, 30, 31) for _, p in c1)
    for state in states.values():
        assert cat.BR_INT.check(state.flows, state.groups) == []


def test_sampling_changes_nothing_of_what_is_delivered():
    on = sampled(project=PROJECT)
    for snap in (cloud(), on):
        sim = fabric(snap)
        assert connect(sim, snap, "cli", "web1", TCP, 80) == (True, True)
        assert connect(sim, snap, "cli", "web1", TCP, 22) == (False, False)
        assert connect(sim, snap, "q1", "web1", TCP, 80) == (True, True)


def test_a_rate_change_compiles_only_its_owners_into_the_whole_compile():
    steps = [{}, {"project": PROJECT}, {"project": PROJECT, "web1": WEB1_OWN},
             {"project": dataclasses.replace(PROJECT, admit=0), "web1": WEB1_OWN}, {"web1": WEB1_OWN}, {}]
    for before_rows, after_rows in zip(steps, steps[1:]):
        before, after = sampled(**before_rows), sampled(**after_rows)
        owners = touched(before, after)
        assert owners and all(o.kind in (ck.KIND_PORT, ck.KIND_SECURITY_GROUP_RULE) for o in owners)
        old = {k: by_owner(s) for k, s in whole_compile(before).items()}
        new = {k: by_owner(s) for k, s in compile_owners(after, owners).items()}
        for key, state in whole_compile(after).items():
            kept = {o: s for o, s in old.get(key, {}).items() if o not in owners and o.on(key) not in owners}
            assert {**kept, **new.get(key, {})} == by_owner(state), (before_rows, after_rows, key)


def test_sample_flows_round_trip_through_os_ken():
    dp = FakeDatapath()
    for state in whole_compile(sampled(project=PROJECT)).values():
        for flow in state.flows:
            if any(isinstance(a, Sample) for a in flow.actions):
                assert _round_trip_flow(dp, flow) == flow


def test_ovs_takes_sample_actions_and_prints_them_as_we_do(ovs, tmp_path):  # noqa: F811
    target = ovs.bridge("brsample", {"tap1": 20})
    c = st.cookie(st.APP_SECGROUPS, st.KIND_PORT, 1)
    flows = {FlowSpec(35, 1, {"reg5": 1}, (Sample(1, 1, 1, fr.point_id(fr.DROP_EGRESS, 1)),), c),
             FlowSpec(32, 100, {"reg5": 1, "eth_type": 0x0800},
                      (Sample(0xFFFF, 1, 1, fr.point_id(fr.PORT_INGRESS, 1)), Ct(zone_field="reg11", table=35)), c)}
    _install(ovs, target, flows, (), tmp_path)
    assert _dumped_flows(ovs, target) == sorted(f.to_ofctl() for f in flows)


# ---------------------------------------------------------------------------------------------- chain hops


def test_chain_hops_sample_at_their_projects_ingress_rate_and_still_deliver():
    """Chain 1 (fw group of two instances, then dpi; symmetric) of project p1 sampled at p1's
    ingress rate: every sfc-select flow of a hop samples first (point chain-hop + the hop marker),
    on every node that sends into the hop; p2's project row changes nothing; frames still take the
    chain's path."""
    from fathom.apps.sfc import compile as sfc_compile
    from fathom.model.chains import hop_marker, parse_hop_marker

    from .test_compiler_sfc import VNF_OUT, fabric, model, tcp, walk
    off = model()
    on = dataclasses.replace(off, flow_sampling=(fr.FlowSampling(1, "p1", None, ingress=100),
                                                 fr.FlowSampling(2, "p2", None, ingress=1)))
    plain = {k.name: s for k, s in sfc_compile(off).items()}
    states = {k.name: s for k, s in sfc_compile(on).items()}
    assert set(states) == set(plain)
    hops = set()
    for name, state in states.items():
        select = {f.match_dict[st.REG_CHAIN_HOP]: f for f in state.flows if f.table == st.SFC_SELECT}
        assert select, name
        for marker, f in select.items():
            (s,) = [a for a in f.actions if isinstance(a, Sample)]
            assert f.actions[0] == s and s.probability == fr.probability(100)
            kind, oid = fr.parse_point(s.obs_point_id)
            assert kind == fr.CHAIN_HOP and oid == marker & fr.HOP_MASK
            hops.add(parse_hop_marker(marker))
        # the rest is the unsampled compile, untouched
        unsampled = {dataclasses.replace(f, actions=tuple(a for a in f.actions if not isinstance(a, Sample)))
                     for f in state.flows}
        assert unsampled == plain[name].flows and state.groups == plain[name].groups
        assert cat.BR_INT.check(state.flows, state.groups) == []
    assert hops == {(1, d, k) for d in (0, 1) for k in (0, 1)}
    assert fr.point_id(fr.CHAIN_HOP, hop_marker(1, 1, 1) & fr.HOP_MASK) > 0
    fab = fabric(on)
    path = walk(fab, "client", tcp("client", "server", 40000, 80), "server")
    assert path[0] in ("fwai", "fwbi") and path[1:] == ["dpii", "server"]
    assert walk(fab, "server", tcp("server", "client", 80, 40000), "client") == ["dpio", VNF_OUT[path[0]], "client"]


def test_a_hop_rate_change_compiles_the_chains_into_the_whole_compile():
    """A change of the chain's project's rate compiles the sfc app whole (its flows are few); a
    chain changing with sampling on compiles only its owner into what the whole compile gives."""
    from fathom.apps.sfc import APP, compile as sfc_compile, compile_owners as sfc_owners

    from .test_compiler_sfc import model
    from fathom.model import PortChain
    off = model()
    on = dataclasses.replace(off, flow_sampling=(fr.FlowSampling(1, "p1", None, ingress=100),))
    for before, after in ((off, on), (on, off)):
        assert isinstance(APP.touched(before, after), str)      # "flow_sampling changed": the app whole
    moved = dataclasses.replace(on, port_chains=(PortChain(1, "c", "p1", (2, 1), (1,), symmetric=True),))
    owners = APP.touched(on, moved)
    assert owners and all(o.kind == ck.KIND_PORT_CHAIN for o in owners)
    old = {k: by_owner(s) for k, s in sfc_compile(on).items()}
    new = {k: by_owner(s) for k, s in sfc_owners(moved, owners).items()}
    for key, state in sfc_compile(moved).items():
        kept = {o: s for o, s in old.get(key, {}).items() if o not in owners}
        assert {**kept, **new.get(key, {})} == by_owner(state), key


# ---------------------------------------------------------------------------------------------- the tunnel


def test_tunnel_egress_samples_at_the_remote_ports_project_rate_and_still_delivers():
    """blue (VXLAN): web1 and q1 (project q) on c1, web2 on c2; red is a VLAN. With p's rows
    (project: 1:1 sent, web1's own: 1:100) each node's l2 flow to a p port of blue on the other
    node samples first at p's rate (point tunnel-egress + the port); nothing else changes: not
    q's port, not a local port, not the VLAN uplink; frames are delivered as before."""
    from fathom.apps.tenant import compile as tenant_compile
    plain = {k.name: s for k, s in tenant_compile(cloud()).items()}
    on = sampled(project=PROJECT, web1=WEB1_OWN)
    states = {k.name: s for k, s in tenant_compile(on).items()}
    got = {name: {(f.table, f.match_dict.get("eth_dst"), a) for f in state.flows for a in f.actions
                  if isinstance(a, Sample)} for name, state in states.items()}
    ports = {p.name: p for p in on.ports}

    def to(name: str):
        return (st.L2, ports[name].mac_address,
                Sample(fr.probability(1), fr.COLLECTOR_SET, fr.OBS_DOMAIN, fr.point_id(fr.TUNNEL_EGRESS, ports[name].id)))
    assert got == {"c1": {to("web2")}, "c2": {to("web1")}}     # web1's own 1:100 is not the tunnel's rate
    for name, state in states.items():
        (flow,) = [f for f in state.flows if any(isinstance(a, Sample) for a in f.actions)]
        assert isinstance(flow.actions[0], Sample)
        unsampled = {dataclasses.replace(f, actions=tuple(a for a in f.actions if not isinstance(a, Sample)))
                     for f in state.flows}
        assert unsampled == plain[name].flows and state.groups == plain[name].groups
        assert cat.BR_INT.check(state.flows, state.groups) == []
    sim = fabric(on)
    assert connect(sim, on, "web2", "web1", TCP, 80) == (True, True)
    assert connect(sim, on, "cli", "web2", TCP, 80) == (True, True)       # routed, then the tunnel


def test_a_rate_change_compiles_the_tenant_ports_it_moves_into_the_whole_compile():
    from fathom.apps.tenant import compile as tenant_compile, compile_owners as tenant_owners, touched as tenant_touched
    steps = [{}, {"project": PROJECT}, {"project": PROJECT, "web1": WEB1_OWN},
             {"project": dataclasses.replace(PROJECT, admit=0), "web1": WEB1_OWN},
             {"project": dataclasses.replace(PROJECT, ingress=100)}, {}]
    for before_rows, after_rows in zip(steps, steps[1:]):
        before, after = sampled(**before_rows), sampled(**after_rows)
        owners = tenant_touched(before, after)
        moved = fr.ingress_rates(before.flow_sampling).get("p") != fr.ingress_rates(after.flow_sampling).get("p")
        assert bool(owners) == moved and all(o.kind == ck.KIND_PORT for o in owners), (before_rows, after_rows)
        old = {k: by_owner(s) for k, s in tenant_compile(before).items()}
        new = {k: by_owner(s) for k, s in tenant_owners(after, owners).items()}
        for key, state in tenant_compile(after).items():
            kept = {o: s for o, s in old.get(key, {}).items() if o not in owners and o.on(key) not in owners}
            assert {**kept, **new.get(key, {})} == by_owner(state), (before_rows, after_rows, key)


def test_the_trace_walks_the_sampled_pipelines_as_the_unsampled_ones():
    """The default lab with sampling on (the golden flows' `sampled` variant): vm1 -> vm3 crosses
    the tunnel; the trace sees the l2 flow's sample and ends where it ends without sampling."""
    from fathom.trace import trace
    from .golden_flows import SAMPLED, model, sampled as sample_rows
    results = []
    for more in (None, sample_rows):
        snapshot, states = model(SAMPLED, False, "distributed", more)
        vm1 = next(p for p in snapshot.ports if p.name == "vm1")
        results.append(trace(snapshot, states, vm1, "198.19.1.13", proto="udp", dport=5201))
    plain, on = results
    assert on["verdict"] == plain["verdict"] and on["verdict"]["port"] == "vm3"
    assert [h["switch"] for h in on["hops"]] == [h["switch"] for h in plain["hops"]]
    assert on["hops"][0]["outputs"] == plain["hops"][0]["outputs"]
    l2 = next(s for s in on["hops"][0]["steps"] if s["stage"] == "l2")
    vm3 = next(p for p in snapshot.ports if p.name == "vm3")
    assert any(f"observation point {fr.point_id(fr.TUNNEL_EGRESS, vm3.id):#x}" in n for n in l2.get("notes", ())), l2
