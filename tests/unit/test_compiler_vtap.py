"""The vTAP compiler: frames walked through the merged tenant + vTAP tables (tests/unit/flowsim.py).

The central property (the vTAP paper, Fig. 5): the monitor receives exactly the frame the receiver
receives, and the receiver receives exactly what it would without the tap.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from fathom.openflow.spec import DecTtl, Group, SetField, SwitchState
from fathom.pipeline import stages as st
from fathom.apps.vtap import compiler as vtap
from fathom.model import taps as filters
from .flowsim import compile_tenant
from fathom.model import (  # noqa: I001
    TUNNEL_INTERFACE,
    FixedIp, Network, Node, Port, Router, RouterInterface, Snapshot, Subnet, TapPolicy,
)

from .flowsim import Fabric, matches


def base() -> Snapshot:
    """c1: a (sender), b (receiver), m1 (monitor); c2: r (receiver), m2 (monitor), g (green)."""
    nodes = (Node(1, "c1", "compute", "198.18.0.1", None, "complete",
                  {"vxlan0": 1, "patch-phy": 2, "ta": 10, "tb": 11, "tm1": 12}),
             Node(2, "c2", "compute", "198.18.0.2", None, "complete",
                  {"vxlan0": 1, "patch-phy": 2, "tr": 10, "tm2": 11, "tg": 12}))
    nets = (Network(1, "blue", "p1", "vxlan", 1001), Network(2, "green", "p1", "vxlan", 1002))
    subnets = (Subnet(11, "blue4", "p1", 1, "198.19.1.0/24", "198.19.1.1"),
               Subnet(12, "green4", "p1", 2, "198.19.2.0/24", "198.19.2.1"))

    def port(pid, name, net, subnet, ip, node, iface):
        return Port(pid, name, "p1", net, f"02:00:00:00:{net:02x}:{pid:02x}", (FixedIp(subnet, ip),), node, iface)

    ports = (port(1, "a", 1, 11, "198.19.1.10", "c1", "ta"), port(2, "b", 1, 11, "198.19.1.11", "c1", "tb"),
             port(3, "m1", 1, 11, "198.19.1.12", "c1", "tm1"), port(4, "r", 1, 11, "198.19.1.13", "c2", "tr"),
             port(5, "m2", 1, 11, "198.19.1.14", "c2", "tm2"), port(6, "g", 2, 12, "198.19.2.10", "c2", "tg"))
    return Snapshot(nodes=nodes, networks=nets, subnets=subnets, ports=ports,
                    routers=(Router(9, "r1", "p1"),),
                    router_interfaces=(RouterInterface(90, 9, 11, 1, "198.19.1.1", "02:00:00:00:99:01"),
                                       RouterInterface(91, 9, 12, 2, "198.19.2.1", "02:00:00:00:99:02")))


def policy(pid=1, sender=1, receiver=2, monitors=(3,), **kw) -> TapPolicy:
    snap = base()
    rport = next(p for p in snap.ports if p.id == receiver)
    filters = kw.pop("filters", {})
    return TapPolicy(pid, f"t{pid}", "p1", sender, receiver, True, rport.mac_address,
                     rport.fixed_ips[0].ip_address, tuple(monitors),
                     filters=tuple(sorted(filters.items())), **kw)


def compiled(snap: Snapshot) -> dict[str, SwitchState]:
    states = compile_tenant(snap)
    for name, state in vtap.compile_vtap(snap).items():
        states[name] = states.get(name, SwitchState()) | state
    return states


def fabric(*policies) -> tuple[Fabric, Fabric]:
    snap = base()
    tapped = replace(snap, tap_policies=tuple(policies))
    return Fabric(tapped, compiled(tapped)), Fabric(snap, compile_tenant(snap))


def frame(src, dst, **kw) -> dict:
    return {"eth_type": 0x0800, "ttl": 64, "eth_src": f"02:00:00:00:01:{src:02x}",
            "eth_dst": f"02:00:00:00:01:{dst:02x}", "ipv4_src": f"198.19.1.{9 + src}",
            "ipv4_dst": f"198.19.1.{9 + dst}", **kw}


def where(deliveries) -> dict:
    return {d.interface: d.frame for d in deliveries}


TCP80 = {"ip_proto": 6, "tcp_dst": 80, "tcp_src": 40000}


def test_same_node_monitor_sees_exactly_what_the_receiver_sees():
    tapped, plain = fabric(policy())
    f = frame(1, 2, **TCP80)
    got, ref = where(tapped.send("c1", "ta", f)), where(plain.send("c1", "ta", f))
    assert set(got) == {"tb", "tm1"}
    assert got["tb"] == ref["tb"] == {**f}
    assert got["tm1"] == got["tb"]


def test_cross_node_copy_travels_with_its_marker_and_is_restored():
    p = policy(receiver=4, monitors=(5,))
    tapped, plain = fabric(p)
    f = frame(1, 4, **TCP80)
    got, ref = where(tapped.send("c1", "ta", f)), where(plain.send("c1", "ta", f))
    assert set(got) == {"tr", "tm2"}
    assert got["tr"] == ref["tr"] and got["tm2"] == got["tr"]
    states = vtap.compile_vtap(replace(base(), tap_policies=(p,)))
    mk = filters.marker(1, 0, 0)
    send = [f for f in states["c1"].flows if f.table == st.TAP_RECOVERY]
    assert [a for a in send[0].actions if isinstance(a, SetField) and a.field == "tunnel_id"] == [SetField("tunnel_id", mk)]
    assert any(f.table == st.CLASSIFY and f.match_dict == {"in_port": 1, "tunnel_id": mk} for f in states["c2"].flows)
    assert filters.parse_marker(mk) == (1, 0, 0)


def test_monitor_on_the_receivers_node_and_a_second_monitor():
    tapped, _ = fabric(policy(receiver=2, monitors=(5, 3)))
    got = where(tapped.send("c1", "ta", frame(1, 2)))
    assert set(got) == {"tb", "tm1", "tm2"}
    assert got["tm1"] == got["tm2"] == got["tb"]


def test_routed_traffic_is_copied_as_the_receiver_gets_it():
    snap = base()
    g = next(p for p in snap.ports if p.id == 6)
    p = TapPolicy(1, "t", "p1", 1, 6, True, g.mac_address, "198.19.2.10", (3,))
    fab = Fabric(replace(snap, tap_policies=(p,)), compiled(replace(snap, tap_policies=(p,))))
    f = {"eth_type": 0x0800, "ttl": 64, "eth_src": "02:00:00:00:01:01", "eth_dst": "02:00:00:00:99:01",
         "ipv4_src": "198.19.1.10", "ipv4_dst": "198.19.2.10"}
    got = where(fab.send("c1", "ta", f))
    assert set(got) == {"tg", "tm1"}
    assert got["tg"]["ttl"] == 63 and got["tg"]["eth_src"] == "02:00:00:00:99:02"
    assert got["tm1"] == got["tg"]


def test_only_matching_traffic_is_copied():
    tapped, _ = fabric(policy(filters={"ip_proto": 6, "tp_dst": "80"}))
    assert "tm1" in where(tapped.send("c1", "ta", frame(1, 2, **TCP80)))
    assert "tm1" not in where(tapped.send("c1", "ta", frame(1, 2, ip_proto=6, tcp_dst=81, tcp_src=1)))
    assert "tm1" not in where(tapped.send("c1", "ta", frame(1, 2, ip_proto=17, udp_dst=80, udp_src=1)))
    # the other direction and other pairs are not copied
    assert "tm1" not in where(tapped.send("c1", "tb", frame(2, 1, **TCP80)))
    assert "tm1" not in where(tapped.send("c1", "ta", frame(1, 4, **TCP80)))


def test_port_range_is_exact_and_wildcard_protocol_covers_tcp_and_udp():
    tapped, _ = fabric(policy(filters={"tp_dst": "1000-2000"}))
    for port, want in ((999, False), (1000, True), (1023, True), (1500, True), (2000, True), (2001, False)):
        for proto, name in ((6, "tcp"), (17, "udp")):
            f = frame(1, 2, ip_proto=proto, **{f"{name}_dst": port, f"{name}_src": 5})
            assert ("tm1" in where(tapped.send("c1", "ta", f))) is want, (proto, port)


@pytest.mark.parametrize("low,high", [(0, 65535), (1, 1), (1000, 2000), (80, 443), (1023, 1025)])
def test_range_to_masks_covers_exactly(low, high):
    parts = filters.range_to_masks(low, high)
    covered = {v for v in range(max(0, low - 40), min(65535, high + 40) + 1)
               if any(v & mk == val for val, mk in parts)}
    assert covered == set(range(max(0, low - 40), min(65535, high + 40) + 1)) & set(range(low, high + 1))


def test_both_directions():
    tapped, _ = fabric(policy(direction="both"))
    assert "tm1" in where(tapped.send("c1", "ta", frame(1, 2)))
    back = where(tapped.send("c1", "tb", frame(2, 1)))
    assert back["tm1"] == back["ta"]


def test_both_directions_swap_ports_so_replies_are_copied():
    tapped, _ = fabric(policy(direction="both", filters={"ip_proto": 6, "tp_dst": "80"}))
    assert "tm1" in where(tapped.send("c1", "ta", frame(1, 2, ip_proto=6, tcp_src=40000, tcp_dst=80)))
    assert "tm1" in where(tapped.send("c1", "tb", frame(2, 1, ip_proto=6, tcp_src=80, tcp_dst=40000)))
    assert "tm1" not in where(tapped.send("c1", "tb", frame(2, 1, ip_proto=6, tcp_src=81, tcp_dst=80)))


def test_overlap_the_higher_priority_copies():
    wide = policy(1, monitors=(3,), priority=10)
    narrow = policy(2, monitors=(5,), priority=20, filters={"ip_proto": 6, "tp_dst": "80"})
    tapped, _ = fabric(wide, narrow)
    got = where(tapped.send("c1", "ta", frame(1, 2, **TCP80)))
    assert "tm2" in got and "tm1" not in got   # narrow (20) wins, one copy
    got = where(tapped.send("c1", "ta", frame(1, 2, ip_proto=17, udp_dst=53, udp_src=5)))
    assert "tm1" in got and "tm2" not in got
    snap = replace(base(), tap_policies=(wide, replace(narrow, priority=10)))
    assert filters.conflicting_policies(snap, 2) == [1]
    snap = replace(base(), tap_policies=(wide, narrow))
    assert filters.conflicting_policies(snap, 2) == []
    # disjoint traffic at one priority is no conflict
    udp = policy(3, monitors=(5,), priority=10, filters={"ip_proto": 17})
    tcp = policy(4, monitors=(5,), priority=10, filters={"ip_proto": 6})
    assert filters.conflicting_policies(replace(base(), tap_policies=(udp, tcp)), 4) == []


def test_deleted_port_installs_nothing_and_says_why():
    p = replace(policy(), monitor_port_ids=(None,))
    states, plans = vtap.compile_vtap_plans(replace(base(), tap_policies=(p,)))
    assert states == {}
    assert plans[1].problems == ["monitor port was deleted"]
    p = replace(policy(), sender_port_id=None)
    states, plans = vtap.compile_vtap_plans(replace(base(), tap_policies=(p,)))
    assert states == {} and "sender port was deleted" in plans[1].problems


def test_unbound_monitor_leaves_traffic_alone():
    snap = base()
    ports = tuple(replace(p, node=None) if p.id == 3 else p for p in snap.ports)
    states, plans = vtap.compile_vtap_plans(replace(snap, ports=ports, tap_policies=(policy(),)))
    assert states == {} and "not on a node" in plans[1].problems[0]


def test_flows_and_groups_are_keyed_by_policy_and_prerequisites_hold():
    snap = replace(base(), tap_policies=(policy(1), policy(2, receiver=4, monitors=(5, 3), priority=7)))
    states = vtap.compile_vtap(snap)
    tenant = compile_tenant(snap)
    for name, state in states.items():
        keys = {f.key for f in tenant[name].flows}
        for f in state.flows:
            assert st.parse_cookie(f.cookie)[:2] == (st.APP_VTAP, st.KIND_TAP_POLICY)
            assert f.key not in keys
            if any(isinstance(a, DecTtl) or (isinstance(a, SetField) and a.field.startswith("ipv4"))
                   for a in f.actions):
                assert f.match_dict.get("eth_type") == 0x0800, f.to_ofctl()
        for g in state.groups:
            assert st.parse_group_id(g.group_id)[0] == st.APP_VTAP and g.type == "all"
    gids = {g.group_id for s in states.values() for g in s.groups}
    assert gids == {vtap.tap_group_id(1, 0), vtap.tap_group_id(2, 0)}
    ingress = [f for f in states["c1"].flows if f.table == st.TAP_INGRESS]
    assert sorted(f.priority for f in ingress) == [vtap.PRIO_TAP_BASE + 7, vtap.PRIO_TAP_BASE + 100]
    assert all(isinstance(f.actions[0], Group) for f in ingress)


def test_update_keeps_group_ids():
    a = vtap.compile_vtap(replace(base(), tap_policies=(policy(),)))
    b = vtap.compile_vtap(replace(base(), tap_policies=(policy(monitors=(5,)),)))
    assert {g.group_id for g in a["c1"].groups} == {g.group_id for g in b["c1"].groups}
    assert a["c1"].groups != b["c1"].groups


@pytest.mark.parametrize("kwargs,field", [
    ({"match": {"foo": 1}}, "match.foo"),
    ({"match": {"eth_src": "02:00:00:00:00:01"}}, "match.eth_src"),
    ({"match": {"ip_dscp": 64}}, "match.ip_dscp"),
    ({"match": {"icmpv4_type": 8}}, "match.icmpv4_type"),
    ({"ip_proto": 1, "tp_dst": "80"}, "tp_dst"),
    ({"tp_dst": "2000-1000"}, "tp_dst"),
    ({"tp_src": "http"}, "tp_src"),
    ({"vlan": 4095}, "vlan"),
    ({"match": {"mpls_label": 10, "arp_op": 1}}, "match"),
    ({"match": {"mpls_label": 10}, "ip_proto": 6}, "ip_proto"),
])
def test_bad_filters_name_their_field(kwargs, field):
    with pytest.raises(filters.FilterError) as e:
        filters.normalise_filters(**kwargs)
    assert e.value.field == field


def test_filters_normalised():
    assert filters.normalise_filters(ip_proto="*", vlan=None, tp_dst="*") == {}
    assert filters.normalise_filters(ip_proto="udp", vlan=100, match={"ip_dscp": "46", "ip_ecn": 3}) == \
        {"ip_proto": 17, "vlan": 100, "ip_dscp": 46, "ip_ecn": 3}
    f = filters.normalise_filters(match={"mpls_label": 10})
    assert filters.effective_eth_type(f) == 0x8847
    assert filters.normalise_filters(ip_proto=1, match={"icmpv4_type": 8}) == {"ip_proto": 1, "icmpv4_type": 8}


def test_mpls_policy_matches_without_ip_identifiers():
    p = policy(filters={"mpls_label": 10})
    states = vtap.compile_vtap(replace(base(), tap_policies=(p,)))
    (flow,) = [f for f in states["c1"].flows if f.table == st.TAP_INGRESS]
    m = flow.match_dict
    assert m["eth_type"] == 0x8847 and m["mpls_label"] == 10 and "ipv4_dst" not in m
    assert matches(flow, {"reg5": 1, "eth_src": "02:00:00:00:01:01", "eth_dst": "02:00:00:00:01:02",
                          "eth_type": 0x8847, "mpls_label": 10})


def test_vlan_filter_means_the_vlan_network_or_the_vms_own_tag():
    snap = base()
    nets = (Network(1, "blue", "p1", "vlan", 100), snap.networks[1])
    for vlan, expect in ((100, None), (200, 0x1000 | 200)):
        p = policy(filters={"vlan": vlan})
        states = vtap.compile_vtap(replace(snap, networks=nets, tap_policies=(p,)))
        (flow,) = [f for f in states["c1"].flows if f.table == st.TAP_INGRESS]
        assert flow.match_dict.get("vlan_vid") == expect


def test_truncation_cuts_copies_after_recovery_where_they_are_delivered():
    from fathom.openflow.spec import Output, OutputTrunc
    p = policy(receiver=4, monitors=(5, 3), truncate=128)
    states = vtap.compile_vtap(replace(base(), tap_policies=(p,)))
    outs = {f.actions[-1] for n in ("c1", "c2") for f in states[n].flows if f.table == st.TAP_RECOVERY}
    assert outs == {Output(1), OutputTrunc(12, 128), OutputTrunc(11, 128)}


def test_rate_limit_meters_the_copies_only_at_the_senders_switch():
    from fathom.openflow.spec import Meter, MeterSpec
    p = policy(receiver=4, monitors=(5, 3), rate_pps=1000)
    states = vtap.compile_vtap(replace(base(), tap_policies=(p,)))
    mid = vtap.tap_meter_id(1)
    assert states["c1"].meters == {MeterSpec(mid, 1000, 100, "pktps", vtap.tap_cookie(1))}
    assert states["c2"].meters == frozenset()
    metered = [f for f in states["c1"].flows if f.meter_id() is not None]
    assert len(metered) == 2 and all(f.table == st.TAP_RECOVERY and f.actions[0] == Meter(mid) for f in metered)
    # the original's path (tap-ingress, group bucket 1) is never metered
    assert not any(f.meter_id() for f in states["c1"].flows if f.table == st.TAP_INGRESS)
    tapped = Fabric(replace(base(), tap_policies=(p,)), compiled(replace(base(), tap_policies=(p,))))
    assert set(where(tapped.send("c1", "ta", frame(1, 4)))) == {"tr", "tm1", "tm2"}


def _problems_through_the_compiler(snap: Snapshot) -> dict[int, list[str]]:
    """The compiler's plans on a model where every bound interface is on its node's br-int."""
    fake = {n.name: {TUNNEL_INTERFACE: 1, **{p.interface: 10 + p.id for p in snap.ports
                                             if p.node == n.name and p.interface}} for n in snap.nodes}
    return {pid: plan.problems for pid, plan in vtap.compile_vtap_plans(snap.with_ofports(fake))[1].items()}


@pytest.mark.parametrize("change", [
    {}, {"monitor_port_ids": (None,)}, {"sender_port_id": None}, {"receiver_port_id": None},
    {"monitor_port_ids": (3, None)}, {"direction": "both"}, {"direction": "both", "receiver_is_port": False},
    {"monitor_port_ids": (3, 5)}, {"id": filters.MAX_POLICY_ID + 1},
])
@pytest.mark.parametrize("unbind", [(), (1,), (2,), (3,), (5,), (1, 3)])
@pytest.mark.parametrize("no_interface", [(), (2,), (5,)])
def test_problems_from_the_model_are_the_compilers(change, unbind, no_interface):
    snap = base()
    ports = tuple(replace(p, node=None if p.id in unbind else p.node,
                          interface=None if p.id in no_interface else p.interface) for p in snap.ports)
    snap = replace(snap, ports=ports, tap_policies=(replace(policy(), **change),))
    assert filters.static_problems(snap) == _problems_through_the_compiler(snap)


def test_a_marker_used_by_a_tenant_network_is_a_problem():
    snap = base()
    vni = filters.marker(1, 0, 0)
    snap = replace(snap, networks=snap.networks + (Network(7, "x", "p1", "vxlan", vni),),
                   tap_policies=(policy(),))
    assert filters.static_problems(snap) == _problems_through_the_compiler(snap) == {
        1: [f"tap marker VNI {vni} is used by a tenant network"]}


def any_receiver(pid=1, sender=1, monitors=(3,), **kw) -> TapPolicy:
    """A policy of receiver "*": everything the sender sends, whoever it is for (TaaS direction OUT)."""
    filters_ = kw.pop("filters", {})
    return TapPolicy(pid, f"t{pid}", "p1", sender, None, False, filters.ANY, filters.ANY, tuple(monitors),
                     filters=tuple(sorted(filters_.items())), **kw)


@pytest.mark.parametrize("dst, monitor, mon_if", [(2, 3, "tm1"), (4, 3, "tm1"), (2, 5, "tm2"), (4, 5, "tm2")])
def test_any_receiver_copies_every_frame_the_sender_sends_unchanged(dst, monitor, mon_if):
    """Same node or across the tunnel, receiver local or remote: the monitor gets the frame as the
    sender sent it (no identifier to rewrite or restore), and the receiver what it gets untapped."""
    tapped, plain = fabric(any_receiver(monitors=(monitor,)))
    f = frame(1, dst, **TCP80)
    got, ref = where(tapped.send("c1", "ta", f)), where(plain.send("c1", "ta", f))
    rx = {2: "tb", 4: "tr"}[dst]
    assert set(got) == {rx, mon_if}
    assert got[rx] == ref[rx]
    assert got[mon_if] == f


def test_any_receiver_routed_and_filtered():
    tapped, plain = fabric(any_receiver(monitors=(5,), filters=filters.normalise_filters(ip_proto="tcp", tp_dst=80)))
    routed = {"eth_type": 0x0800, "ttl": 64, "eth_src": "02:00:00:00:01:01", "eth_dst": "02:00:00:00:99:01",
              "ipv4_src": "198.19.1.10", "ipv4_dst": "198.19.2.10", **TCP80}
    got = where(tapped.send("c1", "ta", routed))
    assert got["tm2"] == routed and got["tg"] == where(plain.send("c1", "ta", routed))["tg"]
    udp = {**frame(1, 2), "ip_proto": 17, "udp_dst": 80, "udp_src": 4000}
    assert set(where(tapped.send("c1", "ta", udp))) == {"tb"}          # filtered out: no copy
    # two any-receiver policies of one sender overlap: equal priorities are refused
    snap = replace(base(), tap_policies=(any_receiver(1), any_receiver(2, monitors=(5,))))
    assert filters.conflicting_policies(snap, 2) == [1]


# ---------------------------------------------------------------------------------------------- sender "*"


def tap_in(pid=1, receiver=2, monitors=(3,), **kw) -> TapPolicy:
    """What port `receiver` receives, from anyone (sender "*": TaaS direction IN)."""
    return replace(policy(pid, None, receiver, monitors, **kw), sender_is_port=False)


def tap_out(pid=1, sender=1, monitors=(3,), **kw) -> TapPolicy:
    """Everything port `sender` sends (receiver "*": TaaS direction OUT; with direction both, BOTH)."""
    return replace(policy(pid, sender, 2, monitors, **kw), receiver_port_id=None, receiver_is_port=False,
                   receiver_mac=filters.ANY, receiver_ip=filters.ANY)


GREEN_TO_A = {"eth_type": 0x0800, "ttl": 64, "eth_src": "02:00:00:00:02:06", "eth_dst": "02:00:00:00:99:02",
              "ipv4_src": "198.19.2.10", "ipv4_dst": "198.19.1.10", **TCP80}


@pytest.mark.parametrize("monitor,iface", [(3, "tm1"), (5, "tm2")])
def test_any_sender_copies_what_the_port_receives_from_every_sender(monitor, iface):
    """b (c1) tapped at its egress: frames from a (same node), r (another node: from the tunnel, so the
    copy to a remote monitor leaves by IN_PORT) and g (routed from green) each reach the monitor
    exactly as b gets them; what b sends and what others receive is not copied."""
    tapped, plain = fabric(tap_in(receiver=2, monitors=(monitor,)))
    for node, src, f in (("c1", "ta", frame(1, 2, **TCP80)), ("c2", "tr", frame(4, 2, **TCP80)),
                         ("c2", "tg", {**GREEN_TO_A, "ipv4_dst": "198.19.1.11"})):
        got, ref = tapped.send(node, src, f), plain.send(node, src, f)
        assert sorted(d.interface for d in got) == sorted(["tb", iface]), src
        assert where(got)["tb"] == where(ref)["tb"] == where(got)[iface], src
    assert {d.interface for d in tapped.send("c1", "tb", frame(2, 1))} == {"ta"}
    assert {d.interface for d in tapped.send("c1", "ta", frame(1, 4))} == {"tr"}


def test_receiver_edge_flows_and_marker():
    p = tap_in(receiver=2, monitors=(5,), filters={"ip_proto": 17})
    states = vtap.compile_vtap(replace(base(), tap_policies=(p,)))
    egress = [f for f in states["c1"].flows if f.table == st.TAP_EGRESS]
    assert [f.match_dict for f in egress] == [{"reg7": 11, "eth_dst": "02:00:00:00:01:02", "eth_type": 0x0800,
                                               "ipv4_dst": "198.19.1.11", "ip_proto": 17}]
    (group,) = states["c1"].groups
    mk = filters.marker(1, 0, 0)
    # the original goes on as the table miss would take it; the copy is not rewritten
    assert group.buckets[0] == (vtap.Resubmit(st.TAP_RECOVERY),)
    assert group.buckets[1] == (vtap.LoadReg(st.REG_TAP, mk), vtap.Resubmit(st.TAP_RECOVERY))
    assert not any(f.table == st.TAP_INGRESS for s in states.values() for f in s.flows)
    plan = vtap.compile_vtap_plans(replace(base(), tap_policies=(p,)))[1][1]
    assert plan.nodes == {"c1": {"receiver edge"}, "c2": {"monitor edge"}} and plan.problems == []


def test_both_with_any_receiver_taps_a_port_both_ways():
    tapped, _ = fabric(tap_out(sender=2, monitors=(5,), direction="both"))
    sent = where(tapped.send("c1", "tb", frame(2, 4)))
    received = where(tapped.send("c2", "tr", frame(4, 2)))
    assert set(sent) == {"tr", "tm2"} and set(received) == {"tb", "tm2"}
    assert sent["tm2"] == sent["tr"] and received["tm2"] == received["tb"]
    assert {d.interface for d in tapped.send("c1", "ta", frame(1, 4))} == {"tr"}


def test_a_packet_tapped_at_both_ends_is_copied_once_per_policy():
    """a's OUT policy and b's IN policy, same monitor: the monitor gets one copy from each policy (two
    identical frames; on the underlay their markers tell them apart); copies are never tapped again."""
    tapped, _ = fabric(tap_out(pid=1, sender=1, monitors=(5,)), tap_in(pid=2, receiver=2, monitors=(5,)))
    got = tapped.send("c1", "ta", frame(1, 2, **TCP80))
    assert sorted(d.interface for d in got) == ["tb", "tm2", "tm2"]
    assert all(d.frame == where(got)["tb"] for d in got)
    # one BOTH policy on b: a packet to b and one from b are each copied once
    one, _ = fabric(tap_out(sender=2, monitors=(5,), direction="both"))
    assert sorted(d.interface for d in one.send("c1", "ta", frame(1, 2))) == ["tb", "tm2"]
    assert sorted(d.interface for d in one.send("c1", "tb", frame(2, 1))) == ["ta", "tm2"]


def test_a_monitor_tapped_at_its_egress_does_not_copy_copies():
    """m1 is the monitor of a's OUT policy and itself tapped IN (to m2): a's copies reach m1 only."""
    tapped, _ = fabric(tap_out(pid=1, sender=1, monitors=(3,)), tap_in(pid=2, receiver=3, monitors=(5,)))
    assert sorted(d.interface for d in tapped.send("c1", "ta", frame(1, 2))) == ["tb", "tm1"]
    assert sorted(d.interface for d in tapped.send("c1", "ta", frame(1, 3))) == ["tm1", "tm1", "tm2"]


def test_any_sender_status_and_problems():
    unbound = replace(base(), ports=tuple(replace(p, node=None) if p.id == 2 else p for p in base().ports),
                      tap_policies=(tap_in(receiver=2),))
    assert vtap.compile_vtap_plans(unbound)[1][1].problems == ["receiver port 2 is not bound to a node"]
    assert filters.static_problems(unbound)[1] == ["receiver port 2 is not bound to a node"]
    both = replace(base(), ports=tuple(replace(p, node=None) if p.id == 2 else p for p in base().ports),
                   tap_policies=(tap_out(sender=2, direction="both"),))
    assert filters.static_problems(both)[1] == ["sender port 2 is not bound to a node",
                                                "sender (direction both) port 2 is not bound to a node"]
    gone = replace(base(), tap_policies=(replace(tap_in(receiver=2), receiver_port_id=None),))
    assert filters.static_problems(gone)[1] == ["receiver port was deleted"]
    assert vtap.compile_vtap(gone) == {}
