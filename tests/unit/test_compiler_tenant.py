"""The tenant compiler: expected specs for small topologies, and properties of every compiled switch.

Isolation and connectivity are checked by walking frames through the compiled tables of all nodes
with tests/unit/flowsim.py.
"""
from __future__ import annotations

import ipaddress
import itertools
import random
from dataclasses import replace

import pytest

from fathom.openflow.spec import (
    OFPP_IN_PORT, DecTtl, FlowSpec, GotoTable, Group, GroupSpec, Output, PopVlan, PushVlan,
    SetField,
)
from fathom.pipeline import stages as st
from fathom.apps.tenant.compiler import flood_group_id
from .flowsim import compile_tenant
from fathom.model import (
    FixedIp, Network, Node, Port, Router, RouterInterface, Snapshot, Subnet,
)

from .flowsim import Fabric

BCAST = "ff:ff:ff:ff:ff:ff"
T = st.APP_TENANT


def tc(kind, oid):
    return st.cookie(T, kind, oid)


# ---------------------------------------------------------------------------------------------- topologies


def two_nodes_one_network() -> Snapshot:
    return Snapshot(
        nodes=(Node(1, "c1", "compute", "198.18.0.1", None, "complete",
                    {"vxlan0": 1, "patch-phy": 2, "tap-a": 10}),
               Node(2, "c2", "compute", "198.18.0.2", None, "complete",
                    {"vxlan0": 1, "patch-phy": 2, "tap-b": 10})),
        networks=(Network(7, "blue", "p1", "vxlan", 1001),),
        subnets=(Subnet(3, "blue-v4", "p1", 7, "10.0.0.0/24", "10.0.0.1"),),
        ports=(Port(21, "a", "p1", 7, "02:00:00:00:00:0a", (FixedIp(3, "10.0.0.10"),), "c1", "tap-a"),
               Port(22, "b", "p1", 7, "02:00:00:00:00:0b", (FixedIp(3, "10.0.0.11"),), "c2", "tap-b")),
    )


def cloud() -> Snapshot:
    """Three nodes; blue and red share 10.0.0.0/24; routers blue<->green and red<->flat."""
    nets = (Network(1, "blue", "p1", "vxlan", 1001), Network(2, "red", "p2", "vxlan", 1002),
            Network(3, "green", "p1", "vlan", 100), Network(4, "plain", "p2", "flat", None))
    subnets = (Subnet(11, "blue4", "p1", 1, "10.0.0.0/24", "10.0.0.1"),
               Subnet(12, "red4", "p2", 2, "10.0.0.0/24", "10.0.0.1"),
               Subnet(13, "green4", "p1", 3, "10.1.0.0/24", "10.1.0.1"),
               Subnet(14, "plain4", "p2", 4, "10.2.0.0/24", "10.2.0.1"))

    def port(pid, net, subnet, ip, node, mac_suffix):
        return Port(pid, f"p{pid}", "p1", net, f"02:00:00:00:{net:02x}:{mac_suffix:02x}",
                    (FixedIp(subnet, ip),), node, f"tap{pid}")

    ports = (
        port(101, 1, 11, "10.0.0.11", "c1", 1), port(102, 1, 11, "10.0.0.12", "c2", 2),
        port(103, 1, 11, "10.0.0.13", "c1", 3),
        port(201, 2, 12, "10.0.0.11", "c1", 1), port(202, 2, 12, "10.0.0.12", "c2", 2),
        port(301, 3, 13, "10.1.0.11", "c1", 1), port(302, 3, 13, "10.1.0.12", "c3", 2),
        port(401, 4, 14, "10.2.0.11", "c2", 1), port(402, 4, 14, "10.2.0.12", "c3", 2),
        # Unbound, and bound but not plugged yet: neither takes part in forwarding.
        port(104, 1, 11, "10.0.0.14", None, 4), port(105, 1, 11, "10.0.0.15", "c2", 5),
    )
    # The same MAC in two networks is allowed (the store only forbids it inside one network).
    ports += (replace(port(203, 2, 12, "10.0.0.13", "c2", 3), mac_address=ports[2].mac_address),)
    routers = (Router(1, "r-blue-green", "p1"), Router(2, "r-red-plain", "p2"))
    interfaces = (RouterInterface(501, 1, 11, 1, "10.0.0.1", "02:00:00:00:ff:01"),
            RouterInterface(502, 1, 13, 3, "10.1.0.1", "02:00:00:00:ff:02"),
            RouterInterface(503, 2, 12, 2, "10.0.0.1", "02:00:00:00:ff:03"),
            RouterInterface(504, 2, 14, 4, "10.2.0.1", "02:00:00:00:ff:04"))

    def node(nid, name, ip):
        taps = {f"tap{p.id}": 20 + i for i, p in enumerate(ports) if p.node == name and p.id != 105}
        return Node(nid, name, "compute", ip, None, "complete", {"vxlan0": 1, "patch-phy": 2, **taps})

    nodes = (node(1, "c1", "198.18.0.1"), node(2, "c2", "198.18.0.2"), node(3, "c3", "198.18.0.3"),
             Node(4, "gw", "gateway", "198.18.0.4", None, "init", {}))
    return Snapshot(nodes, nets, subnets, ports, routers, interfaces)


# ---------------------------------------------------------------------------------------------- expected specs


def test_two_nodes_expected_flows_and_group():
    states = compile_tenant(two_nodes_one_network())
    c1 = states["c1"]
    expected = {
        FlowSpec(st.CLASSIFY, 100, {"in_port": 10},
                 (SetField("reg6", 7), SetField("reg5", 21), GotoTable(st.TAP_INGRESS)), tc(st.KIND_PORT, 21)),
        FlowSpec(st.CLASSIFY, 100, {"in_port": 1, "tunnel_id": 1001},
                 (SetField("reg6", 7), GotoTable(st.L2)), tc(st.KIND_NETWORK, 7)),
        FlowSpec(st.SECURITY, 100, {"reg5": 21, "eth_src": "02:00:00:00:00:0a", "eth_type": 0x0800,
                                    "ipv4_src": "10.0.0.10"}, (GotoTable(st.ARP),), tc(st.KIND_PORT, 21)),
        FlowSpec(st.L2, 100, {"reg6": 7, "eth_dst": "02:00:00:00:00:0a"},
                 (SetField("reg7", 10), GotoTable(st.TAP_EGRESS)), tc(st.KIND_PORT, 21)),
        FlowSpec(st.L2, 100, {"reg6": 7, "eth_dst": "02:00:00:00:00:0b"},
                 (SetField("tunnel_id", 1001), SetField("tun_ipv4_dst", "198.18.0.2"),
                  SetField("reg7", 1), GotoTable(st.TAP_EGRESS)), tc(st.KIND_PORT, 22)),
        FlowSpec(st.L2, 10, {"reg6": 7}, (Group(flood_group_id(7)),), tc(st.KIND_NETWORK, 7)),
        FlowSpec(st.OUTPUT, 100, {"reg7": 10}, (Output(10),), tc(st.KIND_PORT, 21)),
        FlowSpec(st.OUTPUT, 100, {"reg7": 1}, (Output(1),), tc(st.KIND_NODE, 1)),
    }
    assert expected <= c1.flows
    assert c1.groups == {GroupSpec(
        flood_group_id(7), "all",
        ((Output(10),),
         (SetField("tunnel_id", 1001), SetField("tun_ipv4_dst", "198.18.0.2"), Output(1))),
        tc(st.KIND_NETWORK, 7))}
    assert st.skeleton_flows() <= c1.flows
    # ARP for the remote port is answered on c1, ARP by `a` for its own address is not.
    arp = {f.match_dict.get("arp_tpa"): f for f in c1.flows if f.table == st.ARP and f.priority == 100}
    assert set(arp) == {"10.0.0.10", "10.0.0.11"}
    assert arp["10.0.0.11"].actions[-1] == Output(OFPP_IN_PORT)
    assert any(f.table == st.ARP and f.priority == 110 and f.match_dict["reg5"] == 21 for f in c1.flows)


def test_vlan_and_flat_use_the_uplink():
    snap = two_nodes_one_network()
    vlan = replace(snap, networks=(Network(7, "blue", "p1", "vlan", 42),))
    c1 = compile_tenant(vlan)["c1"]
    assert FlowSpec(st.CLASSIFY, 100, {"in_port": 2, "vlan_vid": 0x1000 | 42},
                    (PopVlan(), SetField("reg6", 7), GotoTable(st.L2)),
                    tc(st.KIND_NETWORK, 7)) in c1.flows
    assert FlowSpec(st.L2, 100, {"reg6": 7, "eth_dst": "02:00:00:00:00:0b"},
                    (PushVlan(0x8100), SetField("vlan_vid", 0x1000 | 42), SetField("reg7", 2),
                     GotoTable(st.TAP_EGRESS)), tc(st.KIND_PORT, 22)) in c1.flows
    (group,) = c1.groups
    assert group.buckets == ((Output(10),), (PushVlan(0x8100), SetField("vlan_vid", 0x1000 | 42), Output(2)))
    assert not any(f.match_dict.get("tunnel_id") for f in c1.flows)

    flat = replace(snap, networks=(Network(7, "blue", "p1", "flat", None),))
    c1 = compile_tenant(flat)["c1"]
    assert FlowSpec(st.CLASSIFY, 100, {"in_port": 2, "vlan_vid": 0},
                    (SetField("reg6", 7), GotoTable(st.L2)), tc(st.KIND_NETWORK, 7)) in c1.flows
    (group,) = c1.groups
    assert group.buckets == ((Output(10),), (Output(2),))


def test_routing_flows():
    c1 = compile_tenant(cloud())["c1"]
    route = FlowSpec(st.L3, 124, {"reg6": 1, "eth_dst": "02:00:00:00:ff:01", "eth_type": 0x0800,
                                  "ipv4_dst": ("10.1.0.0", "255.255.255.0")},
                     (SetField("eth_src", "02:00:00:00:ff:02"), DecTtl(), SetField("reg6", 3),
                      GotoTable(st.L3_NEIGHBOR)), tc(st.KIND_ROUTER_INTERFACE, 502))
    neighbor = FlowSpec(st.L3_NEIGHBOR, 100, {"reg6": 3, "eth_type": 0x0800, "ipv4_dst": "10.1.0.12"},
                        (SetField("eth_dst", "02:00:00:00:03:02"), GotoTable(st.L2)),
                        tc(st.KIND_PORT, 302))
    assert route in c1.flows and neighbor in c1.flows
    # c1 has no port on `plain`, but routes to it from red: it needs plain's neighbours and l2.
    assert any(f.table == st.L3_NEIGHBOR and f.match_dict.get("reg6") == 4 for f in c1.flows)
    assert any(f.table == st.L2 and f.match_dict.get("reg6") == 4 for f in c1.flows)
    # ...but no flood group and no classification for it.
    assert flood_group_id(4) not in {g.group_id for g in c1.groups}


def test_node_without_ofports_gets_only_the_skeleton():
    states = compile_tenant(cloud())
    assert states["gw"].flows == st.skeleton_flows()
    assert not states["gw"].groups
    assert set(states) == {"c1", "c2", "c3", "gw"}


def test_unplugged_port_is_not_local_and_unbound_port_is_nowhere():
    states = compile_tenant(cloud())
    for state in states.values():
        for f in state.flows:
            assert f.cookie not in (tc(st.KIND_PORT, 104),)
    # Port 105 is bound to c2 but has no ofport: c2 neither classifies nor delivers it (ARP for it
    # is still answered); c1 still tunnels to c2.
    assert not any(f.cookie == tc(st.KIND_PORT, 105) and f.table in (st.CLASSIFY, st.SECURITY, st.L2, st.OUTPUT)
                   for f in states["c2"].flows)
    assert any(f.cookie == tc(st.KIND_PORT, 105) and f.table == st.L2 for f in states["c1"].flows)


# ---------------------------------------------------------------------------------------------- properties


@pytest.mark.parametrize("snapshot", [two_nodes_one_network(), cloud()], ids=["two-nodes", "cloud"])
def test_every_flow_has_a_stage_and_a_cookie_and_no_duplicates(snapshot):
    for name, state in compile_tenant(snapshot).items():
        keys = [f.key for f in state.flows]
        assert len(keys) == len(set(keys)), f"{name}: two flows with the same table/priority/match"
        node = next(n for n in snapshot.nodes if n.name == name)
        ports = set(node.ofports.values())
        groups = {g.group_id for g in state.groups}
        for f in state.flows:
            assert f.table in st.TABLE_STAGE
            app, kind, _ = st.parse_cookie(f.cookie)
            assert app in st.APPS and kind in st.KINDS
            assert f.goto_table() is None or f.goto_table() in st.TABLE_STAGE
            for a in f.actions:
                if isinstance(a, Output) and a.port != OFPP_IN_PORT:
                    assert a.port in ports
                if isinstance(a, Group):
                    assert a.group_id in groups
        for g in state.groups:
            assert st.parse_group_id(g.group_id)[0] == st.APP_TENANT
            assert all(a.port in ports for b in g.buckets for a in b if isinstance(a, Output))
        # The ofctl rendering works for every spec.
        assert len(state.to_ofctl()) == len(state.flows) + len(state.groups)


def test_compile_is_deterministic_and_order_independent():
    snap = cloud()
    rng = random.Random(4)
    shuffled = Snapshot(*(tuple(rng.sample(list(t), len(t))) for t in
                          (snap.nodes, snap.networks, snap.subnets, snap.ports, snap.routers,
                           snap.router_interfaces)))
    assert compile_tenant(snap) == compile_tenant(shuffled)


# ---------------------------------------------------------------------------------------------- walks


def _frames_from(port, snapshot: Snapshot):
    """Frames a well-behaved `port` might send: to every MAC and IP the cloud knows, and floods."""
    macs = {p.mac_address for p in snapshot.ports} | {r.mac_address for r in snapshot.router_interfaces}
    ips = {f.ip_address for p in snapshot.ports for f in p.fixed_ips}
    ips |= {r.ip_address for r in snapshot.router_interfaces} | {"10.9.9.9"}
    src = {"eth_src": port.mac_address}
    my_ip = port.fixed_ips[0].ip_address
    for ip in sorted(ips):
        yield {**src, "eth_dst": BCAST, "eth_type": 0x0806, "arp_op": 1, "arp_spa": my_ip,
               "arp_sha": port.mac_address, "arp_tpa": ip, "arp_tha": "00:00:00:00:00:00"}
        for mac in sorted(macs | {BCAST, "02:99:99:99:99:99"}):
            yield {**src, "eth_dst": mac, "eth_type": 0x0800, "ipv4_src": my_ip, "ipv4_dst": ip,
                   "ttl": 64}


def _routers_between(snapshot: Snapshot, a: int, b: int) -> set[str]:
    """MACs a frame routed from network a into network b may carry as source."""
    interfaces = snapshot.router_interfaces
    return {d.mac_address for s, d in itertools.product(interfaces, interfaces)
            if s.router_id == d.router_id and s.network_id == a and d.network_id == b}


def test_isolation_holds_for_every_pair_of_networks():
    snap = cloud()
    fabric = Fabric(snap, compile_tenant(snap))
    plugged = {(p.node, p.interface): p for p in snap.ports
               if p.node and p.interface in next(n for n in snap.nodes if n.name == p.node).ofports}
    checked = 0
    for sender in plugged.values():
        for frame in _frames_from(sender, snap):
            for d in fabric.send(sender.node, sender.interface, frame):
                receiver = plugged[(d.node, d.interface)]
                checked += 1
                if receiver.network_id == sender.network_id:
                    continue
                # Crossing networks only through a router joining them, as a routed frame.
                assert d.frame["eth_src"] in _routers_between(snap, sender.network_id,
                                                              receiver.network_id), (sender, d)
                assert d.frame["ttl"] == 63
                # (A routed frame for an unplugged port is flooded as unknown unicast in its network.)
                assert d.frame["eth_dst"] in {p.mac_address for p in snap.ports
                                              if p.network_id == receiver.network_id}
    assert checked > 1000


def test_connectivity_l2_l3_arp():
    snap = cloud()
    fabric = Fabric(snap, compile_tenant(snap))
    ip = {"eth_type": 0x0800, "ttl": 64}

    # Same network, across nodes over VXLAN: exactly the destination.
    got = fabric.send("c1", "tap101", {**ip, "eth_src": "02:00:00:00:01:01", "eth_dst": "02:00:00:00:01:02",
                                       "ipv4_src": "10.0.0.11", "ipv4_dst": "10.0.0.12"})
    assert [(d.node, d.interface) for d in got] == [("c2", "tap102")]

    # Broadcast: every other plugged port of blue, nothing else (105 is not plugged).
    got = fabric.send("c1", "tap101", {**ip, "eth_src": "02:00:00:00:01:01", "eth_dst": BCAST,
                                       "ipv4_src": "10.0.0.11", "ipv4_dst": "10.0.0.255"})
    assert sorted((d.node, d.interface) for d in got) == [("c1", "tap103"), ("c2", "tap102")]

    # ARP for a remote port is answered by the local switch, back to the asker only.
    got = fabric.send("c1", "tap101", {"eth_src": "02:00:00:00:01:01", "eth_dst": BCAST, "eth_type": 0x0806,
                                       "arp_op": 1, "arp_spa": "10.0.0.11", "arp_sha": "02:00:00:00:01:01",
                                       "arp_tpa": "10.0.0.12", "arp_tha": "00:00:00:00:00:00"})
    (reply,) = got
    assert (reply.node, reply.interface) == ("c1", "tap101")
    f = reply.frame
    assert (f["arp_op"], f["eth_src"], f["eth_dst"], f["arp_sha"], f["arp_spa"], f["arp_tha"], f["arp_tpa"]) == (
        2, "02:00:00:00:01:02", "02:00:00:00:01:01", "02:00:00:00:01:02", "10.0.0.12",
        "02:00:00:00:01:01", "10.0.0.11")

    # The same question on red (same addresses) gets red's answer.
    (reply,) = fabric.send("c1", "tap201", {"eth_src": "02:00:00:00:02:01", "eth_dst": BCAST,
                                            "eth_type": 0x0806, "arp_op": 1, "arp_spa": "10.0.0.11",
                                            "arp_sha": "02:00:00:00:02:01", "arp_tpa": "10.0.0.12"})
    assert reply.frame["arp_sha"] == "02:00:00:00:02:02"

    # Routed, blue (VXLAN, c1) -> green (VLAN, c3): via the uplink with VLAN, TTL - 1.
    (d,) = fabric.send("c1", "tap101", {**ip, "eth_src": "02:00:00:00:01:01", "eth_dst": "02:00:00:00:ff:01",
                                        "ipv4_src": "10.0.0.11", "ipv4_dst": "10.1.0.12"})
    assert (d.node, d.interface) == ("c3", "tap302")
    assert (d.frame["eth_src"], d.frame["eth_dst"], d.frame["ttl"], d.frame.get("vlan")) == (
        "02:00:00:00:ff:02", "02:00:00:00:03:02", 63, None)

    # Routed back, green (c3) -> blue (c2): over the tunnel with blue's VNI.
    (d,) = fabric.send("c3", "tap302", {**ip, "eth_src": "02:00:00:00:03:02", "eth_dst": "02:00:00:00:ff:02",
                                        "ipv4_src": "10.1.0.12", "ipv4_dst": "10.0.0.12"})
    assert (d.node, d.interface, d.frame["eth_src"], d.frame["ttl"]) == ("c2", "tap102", "02:00:00:00:ff:01", 63)

    # Red -> plain (flat) through the other router; red's 10.0.0.11 is not blue's 10.0.0.11.
    (d,) = fabric.send("c1", "tap201", {**ip, "eth_src": "02:00:00:00:02:01", "eth_dst": "02:00:00:00:ff:03",
                                        "ipv4_src": "10.0.0.11", "ipv4_dst": "10.2.0.12"})
    assert (d.node, d.interface) == ("c3", "tap402")

    # No route: blue cannot reach plain through blue's router.
    assert fabric.send("c1", "tap101", {**ip, "eth_src": "02:00:00:00:01:01", "eth_dst": "02:00:00:00:ff:01",
                                        "ipv4_src": "10.0.0.11", "ipv4_dst": "10.2.0.12"}) == []


def test_port_security_drops_spoofed_sources():
    snap = cloud()
    fabric = Fabric(snap, compile_tenant(snap))
    frame = {"eth_type": 0x0800, "ttl": 64, "eth_dst": "02:00:00:00:01:02", "ipv4_dst": "10.0.0.12"}
    ok = fabric.send("c1", "tap101", {**frame, "eth_src": "02:00:00:00:01:01", "ipv4_src": "10.0.0.11"})
    assert len(ok) == 1
    assert fabric.send("c1", "tap101", {**frame, "eth_src": "02:00:00:00:01:03", "ipv4_src": "10.0.0.11"}) == []
    assert fabric.send("c1", "tap101", {**frame, "eth_src": "02:00:00:00:01:01", "ipv4_src": "10.0.0.13"}) == []
    # With port security off, the same spoofed frame goes through.
    ports = tuple(replace(p, port_security=False) if p.id == 101 else p for p in snap.ports)
    snap = replace(snap, ports=ports)
    fabric = Fabric(snap, compile_tenant(snap))
    assert len(fabric.send("c1", "tap101", {**frame, "eth_src": "02:00:00:00:01:03", "ipv4_src": "10.0.0.13"})) == 1


def test_own_address_arp_is_not_answered_by_the_switch():
    snap = cloud()
    fabric = Fabric(snap, compile_tenant(snap))
    got = fabric.send("c1", "tap101", {"eth_src": "02:00:00:00:01:01", "eth_dst": BCAST, "eth_type": 0x0806,
                                       "arp_op": 1, "arp_spa": "10.0.0.11", "arp_sha": "02:00:00:00:01:01",
                                       "arp_tpa": "10.0.0.11"})
    # Flooded as a gratuitous ARP to the rest of blue, never answered back to tap101.
    assert sorted((d.node, d.interface) for d in got) == [("c1", "tap103"), ("c2", "tap102")]


# ---------------------------------------------------------------------------------------------- random clouds


def random_cloud(seed: int) -> Snapshot:
    """A random cloud that respects what the API enforces (unique addresses per network, one flat
    network, no overlapping subnets on a router), with overlapping address space across networks,
    shared MACs across networks, unbound ports and a node that is not bootstrapped."""
    rng = random.Random(seed)
    n_nodes = rng.randint(2, 4)
    nodes = [Node(i + 1, f"n{i + 1}", "compute", f"198.18.0.{i + 1}", None, "complete", {})
             for i in range(n_nodes)]
    types = ["vxlan", "vlan", "flat"]
    networks, subnets, ports = [], [], []
    seg = {"vxlan": 1000, "vlan": 100}
    has_flat = False
    for nid in range(1, rng.randint(2, 5) + 1):
        t = rng.choice(types[:2] if has_flat else types)
        has_flat |= t == "flat"
        seg_id = None if t == "flat" else seg[t] + nid
        networks.append(Network(nid, f"net{nid}", "p", t, seg_id))
        for k in rng.sample(range(4), rng.randint(1, 2)):
            sid = nid * 10 + k
            subnets.append(Subnet(sid, f"s{sid}", "p", nid, f"10.0.{k}.0/24", f"10.0.{k}.1"))
    for net in networks:
        mine = [s for s in subnets if s.network_id == net.id]
        for j in range(rng.randint(1, 6)):
            s = rng.choice(mine)
            host = 10 + j
            node = None if rng.random() < 0.1 else rng.choice(nodes).name
            ports.append(Port(net.id * 100 + j, f"p{net.id}-{j}", "p", net.id,
                              f"02:00:00:00:00:{10 + j:02x}",   # the same MACs in every network
                              (FixedIp(s.id, f"{s.cidr.split('.0/')[0]}.{host}"),), node,
                              f"t{net.id}x{j}"))
    routers, interfaces = [], []
    for rid in range(1, rng.randint(0, 2) + 1):
        routers.append(Router(rid, f"r{rid}", "p"))
        taken: list = []
        for s in rng.sample(subnets, min(len(subnets), rng.randint(2, 3))):
            prefix = s.prefix
            if any(prefix.overlaps(t) for t in taken):
                continue
            taken.append(prefix)
            ip = s.gateway_ip if rid == 1 else f"{s.cidr.split('.0/')[0]}.{250 + rid}"
            interfaces.append(RouterInterface(1000 + rid * 100 + s.id, rid, s.id, s.network_id, ip,
                                        f"02:00:00:00:{rid:02x}:{s.id:02x}"))
    # Plug ports: every node but the last is bootstrapped and has every bound port's interface.
    plugged = []
    for i, n in enumerate(nodes):
        if i == len(nodes) - 1 and n_nodes > 2:
            continue
        taps = {p.interface: 20 + k for k, p in enumerate(ports) if p.node == n.name}
        plugged.append(replace(n, ofports={"vxlan0": 1, "patch-phy": 2, **taps}))
    nodes = plugged + nodes[len(plugged):]
    return Snapshot(tuple(nodes), tuple(networks), tuple(subnets), tuple(ports), tuple(routers),
                    tuple(interfaces))


@pytest.mark.parametrize("seed", range(40))
def test_random_clouds_keep_properties_isolation_and_connectivity(seed):
    snap = random_cloud(seed)
    states = compile_tenant(snap)
    for name, state in states.items():
        keys = [f.key for f in state.flows]
        assert len(keys) == len(set(keys)), name
        assert all(f.table in st.TABLE_STAGE and st.parse_cookie(f.cookie)[0] in st.APPS
                   for f in state.flows)
    fabric = Fabric(snap, states)
    nodes = {n.name: n for n in snap.nodes}
    plugged = [p for p in snap.ports if p.node and p.interface in nodes[p.node].ofports]
    by_place = {(p.node, p.interface): p for p in plugged}
    interfaces = snap.router_interfaces
    subnet_of = {s.id: s for s in snap.subnets}

    def send(p, frame):
        return fabric.send(p.node, p.interface, {"eth_src": p.mac_address, "eth_type": 0x0800,
                                                 "ipv4_src": p.fixed_ips[0].ip_address, "ttl": 64,
                                                 **frame})

    for p in plugged:
        # Isolation: broadcast, every port MAC, every router MAC with every address.
        frames = [{"eth_dst": BCAST, "ipv4_dst": "10.0.0.255"}]
        frames += [{"eth_dst": q.mac_address, "ipv4_dst": q.fixed_ips[0].ip_address} for q in snap.ports]
        frames += [{"eth_dst": interface.mac_address, "ipv4_dst": q.fixed_ips[0].ip_address}
                   for interface in interfaces for q in snap.ports]
        for frame in frames:
            for d in send(p, frame):
                q = by_place[(d.node, d.interface)]
                if q.network_id != p.network_id:
                    assert d.frame["eth_src"] in _routers_between(snap, p.network_id, q.network_id)
                    assert d.frame["ttl"] == 63
        # Connectivity inside the network: unicast reaches exactly its port.
        for q in plugged:
            if q.network_id == p.network_id and q is not p:
                got = send(p, {"eth_dst": q.mac_address, "ipv4_dst": q.fixed_ips[0].ip_address})
                assert [(d.node, d.interface) for d in got] == [(q.node, q.interface)]
        # Routed connectivity: through any interface on p's subnet to any port on another interface's subnet.
        for a in interfaces:
            if a.subnet_id != p.fixed_ips[0].subnet_id:
                continue
            for b in interfaces:
                if b.router_id != a.router_id or b.subnet_id == a.subnet_id:
                    continue
                for q in plugged:
                    ip = q.fixed_ips[0].ip_address
                    if q.network_id != b.network_id or ipaddress.ip_address(ip) not in subnet_of[b.subnet_id].prefix:
                        continue
                    got = send(p, {"eth_dst": a.mac_address, "ipv4_dst": ip})
                    assert [(d.node, d.interface, d.frame["ttl"], d.frame["eth_src"]) for d in got] == \
                        [(q.node, q.interface, 63, b.mac_address)]
