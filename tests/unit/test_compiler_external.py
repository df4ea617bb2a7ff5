"""The external compiler (fathom/apps/external): router gateways, SNAT and floating IPs on the gateway
node, the default route towards it everywhere else; and its specs survive os-ken."""
from __future__ import annotations

from dataclasses import replace

from fathom.apps import compile_all
from fathom.apps.external.compiler import compile_external, unsupported_gateways
from fathom.apps.tenant.compiler import compile_tenant
from fathom.model import (
    FabricState, FixedIp, FloatingIp, Mode, Network, Node, Port, Router, RouterGateway, RouterInterface, Snapshot,
    Subnet,
)
from fathom.openflow.spec import Ct, Nat, PushVlan
from fathom.pipeline import stages as st
from fathom.pipeline.catalogue import BR_INT

from .test_spec_encode import FakeDatapath, _round_trip_flow

UPSTREAM = "02:fe:00:00:00:01"


def cloud(ext_type: str = "vlan", ext0: bool = True) -> Snapshot:
    """Two tenants with the same subnet, each behind a router with a gateway on one external network;
    p1's VM on c1 has a floating IP."""
    gw_ports = {"vxlan0": 1, "patch-phy": 2, **({"ext0": 3} if ext0 else {})}
    return Snapshot(
        nodes=(Node(1, "c1", "compute", "198.18.0.1", None, "complete", {"vxlan0": 1, "patch-phy": 2, "a": 10, "b": 11}),
               Node(2, "c2", "compute", "198.18.0.2", None, "complete", {"vxlan0": 1, "patch-phy": 2}),
               Node(3, "gw", "gateway", "198.18.0.9", None, "complete", gw_ports)),
        networks=(Network(1, "ext", "admin", ext_type, 300 if ext_type == "vlan" else None, True, UPSTREAM),
                  Network(2, "blue", "p1", "vxlan", 1001), Network(3, "red", "p2", "vxlan", 1002)),
        subnets=(Subnet(10, "ext4", "admin", 1, "203.0.113.0/24", "203.0.113.1"),
                 Subnet(11, "blue4", "p1", 2, "10.0.0.0/24", "10.0.0.1"),
                 Subnet(12, "red4", "p2", 3, "10.0.0.0/24", "10.0.0.1")),
        ports=(Port(21, "a", "p1", 2, "02:00:00:00:00:0a", (FixedIp(11, "10.0.0.5"),), "c1", "a"),
               Port(22, "b", "p2", 3, "02:00:00:00:00:0b", (FixedIp(12, "10.0.0.5"),), "c1", "b")),
        routers=(Router(1, "ra", "p1"), Router(2, "rb", "p2")),
        router_interfaces=(RouterInterface(31, 1, 11, 2, "10.0.0.1", "02:fd:00:00:00:31"),
                           RouterInterface(32, 2, 12, 3, "10.0.0.1", "02:fd:00:00:00:32")),
        router_gateways=(RouterGateway(1, 1, 10, "203.0.113.2", "02:fd:00:00:01:01", "gw", 0x8000),
                         RouterGateway(2, 1, 10, "203.0.113.3", "02:fd:00:00:01:02", "gw", 0x8001)),
        floating_ips=(FloatingIp(7, "p1", 1, "203.0.113.7", 0x8002, 21, "10.0.0.5", 1),),
    )


def flows_of(state, table: int):
    return [f for f in state.flows if f.table == table]


def test_only_the_gateway_node_is_on_the_external_network():
    out = compile_external(cloud())
    for node, state in out.items():
        nat = [f for f in state.flows if f.table in (st.NAT_IN, st.NAT_ROUTE, st.SNAT)]
        assert bool(nat) == (node == "gw"), node
    arp_for = {dict(f.match)["arp_tpa"] for f in flows_of(out["gw"], st.NAT_IN) if "arp_tpa" in dict(f.match)}
    # the routers' gateway IPs and the associated floating IP, nothing else (not the upstream's own)
    assert arp_for == {"203.0.113.2", "203.0.113.3", "203.0.113.7"}
    # c2 hosts no port of the routers: nothing at all
    assert "c2" not in out


def test_vms_reach_the_gateway_node_in_their_own_network():
    c1 = compile_external(cloud())["c1"]
    (to_gw,) = [f for f in flows_of(c1, st.L2) if dict(f.match) == {st.REG_NETWORK: 2, "eth_dst": "02:fd:00:00:00:31"}]
    assert ("tun_ipv4_dst", "198.18.0.9") in [(a.field, a.value) for a in to_gw.actions if hasattr(a, "field")]
    # the default route is below every internal route of the router
    (default,) = [f for f in flows_of(c1, st.L3) if dict(f.match).get(st.REG_NETWORK) == 2]
    internal = [f.priority for f in flows_of(compile_tenant(cloud())["c1"], st.L3) if f.priority > 10]
    assert all(default.priority < p for p in internal)


def test_each_router_and_floating_ip_has_its_own_zone():
    gw = compile_external(cloud())["gw"]
    cts = [a for f in gw.flows for a in f.actions if isinstance(a, Ct)]
    snat = {(a.zone, a.nat.ip) for a in cts if a.nat and a.nat.kind == "src"}
    assert snat == {(0x8000, "203.0.113.2"), (0x8001, "203.0.113.3"), (0x8002, "203.0.113.7")}
    assert Ct(0x8002, commit=True, table=st.NAT_ROUTE, nat=Nat("dst", "10.0.0.5")) in cts
    # both tenants route 10.0.0.0/24 back in: told apart by the zone alone, into their own network
    back = {(dict(f.match)["ct_zone"], dict(f.match)["ipv4_dst"]): f for f in flows_of(gw, st.NAT_ROUTE)}
    assert {k: next(a.value for a in f.actions if getattr(a, "field", None) == st.REG_NETWORK)
            for k, f in back.items()} == {(0x8000, ("10.0.0.0", "255.255.255.0")): 2,
                                          (0x8001, ("10.0.0.0", "255.255.255.0")): 3,
                                          (0x8002, "10.0.0.5"): 2}
    # a floating IP's port leaves with it, before its subnet's SNAT
    by_src = sorted((f.priority, dict(f.match)[st.REG_NETWORK], dict(f.match)["ipv4_src"]) for f in flows_of(gw, st.SNAT))
    assert by_src[-1] == (200, 2, "10.0.0.5")


def test_vlan_and_flat_external_networks():
    vlan, flat = compile_external(cloud("vlan"))["gw"], compile_external(cloud("flat"))["gw"]
    classify = lambda s: [dict(f.match) for f in flows_of(s, st.CLASSIFY) if dict(f.match).get("in_port") == 3]  # noqa: E731
    assert classify(vlan) == [{"in_port": 3, "vlan_vid": 0x1000 | 300}]
    assert classify(flat) == [{"in_port": 3, "vlan_vid": 0}]
    # ARP replies go back out tagged on a VLAN network
    arp_replies = [f for f in flows_of(vlan, st.NAT_IN) if "arp_tpa" in dict(f.match)]
    assert arp_replies and all(any(isinstance(a, PushVlan) for a in f.actions) for f in arp_replies)
    assert not any(isinstance(a, PushVlan) for f in flows_of(flat, st.NAT_IN) for a in f.actions)


def test_nothing_without_the_external_port_or_outside_mode_distributed():
    assert "gw" not in compile_external(cloud(ext0=False))
    moved = replace(cloud(), fabric=FabricState(modes=(Mode(2, "network-node", "gw"),)))
    moved = moved.with_ofports({"gw": {"vxlan0": 1, "patch-phy": 2, "ext0": 3, "qrp32": 40}})
    assert set(unsupported_gateways(moved)) == {2}
    zones = {a.zone for f in compile_external(moved)["gw"].flows for a in f.actions if isinstance(a, Ct)}
    assert 0x8001 not in zones and 0x8000 in zones


def test_the_gateway_node_routes_into_every_network_of_its_routers():
    gw = compile_tenant(cloud())["gw"]
    neighbours = {(dict(f.match)[st.REG_NETWORK], dict(f.match)["ipv4_dst"]) for f in flows_of(gw, st.L3_NEIGHBOR)}
    assert neighbours == {(2, "10.0.0.5"), (3, "10.0.0.5")}


def test_every_flow_keeps_to_the_pipeline_and_survives_os_ken():
    dp = FakeDatapath()
    for ext_type in ("vlan", "flat"):
        for key, state in compile_all(cloud(ext_type)).items():
            assert BR_INT.check(state.flows, state.groups) == [], key
            for flow in state.flows:
                if st.parse_cookie(flow.cookie)[0] == st.APP_EXTERNAL:
                    assert _round_trip_flow(dp, flow) == flow


def test_security_group_zones_and_external_zones_are_disjoint():
    """Security groups take 1..0x7FFF from the network id (every id, however large), the external app
    allocates from 0x8000: no network's zone is ever a router's or a floating IP's."""
    from fathom.apps.secgroups.compiler import network_zones
    from fathom.store.external_models import CT_ZONE_MAX, CT_ZONE_MIN
    ids = {1, 2, 0x7FFE, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x10000, 0x10001, 2**31 - 1}
    zones = network_zones(ids)
    assert all(1 <= z <= st.SECGROUP_ZONE_MAX < CT_ZONE_MIN for z in zones.values()), zones
    assert (CT_ZONE_MIN, CT_ZONE_MAX) == (0x8000, 0xFFFF)
    assert network_zones({0x7FFF, 0x8000}) == {0x7FFF: 0x7FFF, 0x8000: 1}   # the fold, as documented
