"""Routing and VLAN trunks, at the compiler level: the VLANs the fabric switch allows on each node's trunk, and
routed frames walked through the compiled br-ints *and* the compiled fabric switch (tests/unit/flowsim.py), for
every placement of one VM per network on three compute nodes and every router mode.

The rule (docs/fabric.md, "Routing and VLAN trunks"): a VLAN is allowed on a node's trunk while the
node hosts a port of the network or its br-int can send frames tagged with it - in `distributed`
mode, every node hosting a network of a router routes into all of the router's networks, so it gets
all of the router's VLANs.
"""
from __future__ import annotations

import itertools

import pytest

from fathom.apps import BR_INT, BR_PHY, FABRIC_SWITCH, compile_all, compile_bridge
from fathom.apps.fabric import compiler as fc
from fathom.model import (
    TUNNEL_INTERFACE, UPLINK_INTERFACE, FabricState, FixedIp, Link, Mode, Network, Node, Port, Router,
    RouterInterface, SecurityGroup, SecurityGroupRule, Snapshot, Subnet, FabricSwitch,
)
from fathom.model.routers import router_port_interface
from fathom.openflow.spec import OFPVID_PRESENT, FlowSpec, GroupSpec, Output, PushVlan, SetField, SwitchState
from fathom.pipeline.catalogue import PIPELINES

from .flowsim import Fabric

COMPUTE = ("c1", "c2", "c3")
TOR_PORTS = {"c1": 1, "c2": 2, "c3": 3, "gw": 4}
# name -> (id, type, segmentation id)
NETS = {"nx": (1, "vxlan", 1001), "nv": (2, "vlan", 110), "nw": (3, "vlan", 120)}
ROUTER_LEG = {name: 50 + nid for name, (nid, _, _) in NETS.items()}   # router interface (port) id per network


def _ip(net: str, host: int) -> str:
    return f"10.{NETS[net][0]}.0.{host}"


def _gw_mac(net: str) -> str:
    return f"02:fd:00:00:00:{NETS[net][0]:02x}"


def _vm(net: str, node: str) -> Port:
    n, i = NETS[net][0], COMPUTE.index(node) + 1
    return Port(100 + 10 * n + i, f"{net}-{node}", "p", n, f"02:00:00:00:{n:02x}:{i:02x}",
                (FixedIp(n, _ip(net, 10 + i)),), node, f"{net}{node}", security_groups=(1,))


# Every VM is in project p's default group (as through the API): what one sends another may answer.
DEFAULT_GROUP = (SecurityGroup(1, "default", "p"),)
DEFAULT_RULES = (SecurityGroupRule(1, 1, "egress", "IPv4"), SecurityGroupRule(2, 1, "ingress", "IPv4",
                                                                              remote_group_id=1))


def _net_of(port: Port) -> str:
    return next(n for n, (nid, _, _) in NETS.items() if nid == port.network_id)


def _echo(src: Port, dst: Port) -> dict:
    """An echo request from src to dst's address, sent to src's gateway."""
    return {"eth_src": src.mac_address, "eth_dst": _gw_mac(_net_of(src)), "eth_type": 0x0800,
            "ipv4_src": src.fixed_ips[0].ip_address, "ipv4_dst": dst.fixed_ips[0].ip_address, "ttl": 64}


def build(placement: dict[str, tuple[str, ...]], mode: str = "distributed",
          interfaces: tuple[str, ...] = ("nx", "nv", "nw")) -> Snapshot:
    """Three compute nodes and a gateway node behind one fabric switch; a VM of network `net` on every node of
    placement[net]; one router with an interface on each network of `interfaces`, in `mode`."""
    vms = [_vm(net, node) for net, nodes in placement.items() for node in nodes]
    nodes = []
    for i, name in enumerate(COMPUTE + ("gw",), start=1):
        ofports = {TUNNEL_INTERFACE: 1, UPLINK_INTERFACE: 2}
        ofports.update({p.interface: 10 + k for k, p in enumerate(vms) if p.node == name})
        if name == "gw":   # the router namespace's interfaces, wired: network-node mode is in effect
            ofports.update({router_port_interface(ROUTER_LEG[net]): 30 + k for k, net in enumerate(interfaces)})
        nodes.append(Node(i, name, "gateway" if name == "gw" else "compute", f"198.18.0.{i}", None, "complete",
                          ofports))
    networks = tuple(Network(nid, name, "p", kind, seg) for name, (nid, kind, seg) in NETS.items())
    subnets = tuple(Subnet(nid, name, "p", nid, f"10.{nid}.0.0/24", _ip(name, 1)) for name, (nid, _, _) in NETS.items())
    ris = tuple(RouterInterface(ROUTER_LEG[net], 1, NETS[net][0], NETS[net][0], _ip(net, 1), _gw_mac(net))
                for net in interfaces)
    modes = () if mode == "distributed" else (Mode(1, mode, "gw" if mode == "network-node" else None),)
    fab = FabricState((FabricSwitch(1, "tor", "198.18.1.9", "br-fabric", 100, 999),),
                      tuple(Link(1, n, None, n, "declared") for n in TOR_PORTS), modes, {"tor": dict(TOR_PORTS)})
    return Snapshot(tuple(nodes), networks, subnets, tuple(vms), (Router(1, "r", "p"),), ris,
                    security_groups=DEFAULT_GROUP, security_group_rules=DEFAULT_RULES, fabric=fab)


def compiled(snapshot: Snapshot) -> tuple[dict[str, SwitchState], SwitchState]:
    """Every node's desired br-int and the fabric switch's, as the reconciler compiles them (every app)."""
    states = compile_all(snapshot)
    brint = {k.name: state for k, state in states.items() if k.bridge == BR_INT}
    return brint, next(state for k, state in states.items() if k.bridge == FABRIC_SWITCH and k.name == "tor")


def allowed(snapshot: Snapshot) -> dict[str, set[int]]:
    return fc.fabric_vlans(snapshot, compiled(snapshot)[0])["tor"]


def expected_allowed(placement, mode, interfaces) -> dict[str, set[int]]:
    """The documented rule, written out independently of the compiler."""
    vlan = {net: seg for net, (_, kind, seg) in NETS.items() if kind == "vlan"}
    out = {node: {vlan[net] for net, nodes in placement.items() if node in nodes and net in vlan}
           for node in TOR_PORTS}
    routed = {vlan[net] for net in interfaces if net in vlan}
    for node in COMPUTE:
        if mode == "distributed" and any(node in placement[net] for net in interfaces):
            out[node] |= routed          # it routes into every network of the router
    if mode == "network-node":
        out["gw"] |= routed              # the router's interfaces are ports of the gateway node
    return out


# ---------------------------------------------------------------------------------------------- the case


def test_a_node_routing_into_a_vlan_network_gets_it_on_its_trunk():
    """Router between VXLAN A (nx) and VLAN B (nv); c2 hosts a port of A, none of B."""
    placement = {"nx": ("c1", "c2"), "nv": ("c1", "c3")}
    s = build(placement, interfaces=("nx", "nv"))
    assert allowed(s) == {"c1": {110}, "c2": {110}, "c3": {110}, "gw": set()}
    brint, tor = compiled(s)
    assert 110 in fc.vlans_sent(brint["c2"])           # c2 routes A -> B and tags with B's VLAN
    sim = Fabric(s, brint, tor, TOR_PORTS)
    a2, b3 = _vm("nx", "c2"), _vm("nv", "c3")
    got = sim.send("c2", a2.interface, _echo(a2, b3))
    assert [(d.node, d.interface, d.frame["ttl"]) for d in got] == [("c3", b3.interface, 63)]
    assert sim.fabric_drops == []
    # the same router run by a network node: c2 routes nothing, only the gateway node needs B
    assert allowed(build(placement, "network-node", interfaces=("nx", "nv"))) == {
        "c1": {110}, "c2": set(), "c3": {110}, "gw": {110}}


def test_before_the_rule_the_tor_dropped_it():
    """The walk is a real witness: with only the hosted VLANs on the trunks, the fabric switch drops c2's frame."""
    s = build({"nx": ("c2",), "nv": ("c3",)}, interfaces=("nx", "nv"))
    brint, _ = compiled(s)
    hosted_only = fc.compile_fabric_switches(s, {n: SwitchState() for n in brint})["tor"]
    sim = Fabric(s, brint, hosted_only, TOR_PORTS)
    a2, b3 = _vm("nx", "c2"), _vm("nv", "c3")
    assert sim.send("c2", a2.interface, _echo(a2, b3)) == []
    assert [(node, f["vlan"]) for node, f in sim.fabric_drops] == [("c2", 110)]


# ---------------------------------------------------------------------------------------------- every placement


PLACEMENTS = [dict(zip(NETS, nodes)) for nodes in itertools.product(*[[(n,) for n in COMPUTE]] * len(NETS))]
MODES = [("distributed", ("nx", "nv", "nw")), ("network-node", ("nx", "nv", "nw")), ("fabric", ("nv", "nw"))]


@pytest.mark.parametrize("mode,interfaces", MODES, ids=[m for m, _ in MODES])
def test_every_placement_routes_through_the_tor(mode, interfaces):
    """One VM per network, on any of the three compute nodes (27 placements, nodes hosting one side,
    both or neither): the trunks follow the rule, and every routed frame arrives, TTL - 1, with
    nothing dropped by the fabric switch - both directions, VXLAN->VLAN, VLAN->VXLAN and VLAN->VLAN."""
    problems = []
    for placement in PLACEMENTS:
        s = build(placement, mode, interfaces)
        brint, tor = compiled(s)
        want = expected_allowed(placement, mode, interfaces)
        if fc.fabric_vlans(s, brint)["tor"] != want:
            problems.append(f"{placement}: trunks {fc.fabric_vlans(s, brint)['tor']} != {want}")
        # every VLAN a node's br-int tags frames with is allowed on its trunk
        for node, state in brint.items():
            if not fc.vlans_sent(state) <= want[node]:
                problems.append(f"{placement}: {node} sends {fc.vlans_sent(state)}, allowed {want[node]}")
        sim = Fabric(s, brint, tor, TOR_PORTS)
        vms = [p for p in s.ports if _net_of(p) in interfaces]
        for src, dst in itertools.permutations(vms, 2):
            hops = _route(sim, mode, src, dst)
            if hops != [(dst.node, dst.interface, 63)]:
                problems.append(f"{placement}: {_net_of(src)}@{src.node} -> {_net_of(dst)}@{dst.node}: {hops}")
        if sim.fabric_drops:
            problems.append(f"{placement}: fabric switch dropped {sim.fabric_drops}")
    assert problems == []


def _route(sim: Fabric, mode: str, src: Port, dst: Port) -> list[tuple[str, str, int]]:
    """Where an echo from src to dst's address arrives (node, interface, TTL). In network-node mode
    the router is Linux on the gateway node: the frame must reach the interface of src's network there,
    and the interface of dst's network must reach dst (the namespace's forwarding step in between)."""
    out = sim.send(src.node, src.interface, _echo(src, dst))
    if mode != "network-node":
        return [(d.node, d.interface, d.frame["ttl"]) for d in out
                if d.frame["eth_dst"] == dst.mac_address and d.frame["eth_src"] == _gw_mac(_net_of(dst))]
    leg_in = router_port_interface(ROUTER_LEG[_net_of(src)])
    if [(d.node, d.interface) for d in out] != [("gw", leg_in)]:
        return [("not at the router", ",".join(f"{d.node}/{d.interface}" for d in out), 0)]
    leg_out = router_port_interface(ROUTER_LEG[_net_of(dst)])
    routed = {**_echo(src, dst), "eth_src": _gw_mac(_net_of(dst)), "eth_dst": dst.mac_address, "ttl": 63}
    return [(d.node, d.interface, d.frame["ttl"]) for d in sim.send("gw", leg_out, routed)]


# ---------------------------------------------------------------------------------------------- pieces


def test_vlans_sent_reads_flows_and_group_buckets():
    tag = lambda v: (PushVlan(), SetField("vlan_vid", OFPVID_PRESENT | v), Output(2))  # noqa: E731
    state = SwitchState(frozenset({FlowSpec(60, 100, {"reg6": 1}, tag(110), 1),
                                   FlowSpec(0, 100, {"in_port": 2, "vlan_vid": OFPVID_PRESENT | 130}, (), 1)}),
                        frozenset({GroupSpec(7, "all", (tag(120), (Output(3),)), 1)}))
    assert fc.vlans_sent(state) == {110, 120}      # a match on a VLAN is not a send
    assert fc.vlans_sent(None) == set()


def test_br_phy_trunk_is_a_fixed_pipe_once_its_ports_are_known():
    s = build({"nx": ("c1",), "nv": ("c2",), "nw": ("c3",)})
    bare = compile_bridge(s, BR_PHY)["c1"].flows
    assert bare == PIPELINES["br-phy"].skeleton()          # NORMAL, and LLDP to the controller
    assert {(f.priority, dict(f.match).get("eth_type")) for f in bare} == {(0, None), (1000, 0x88CC)}
    known = s.with_phy_ofports({"c1": {"patch-int": 5, "ul0": 1, "br-phy": 0xFFFFFFFE}})
    flows = compile_bridge(known, BR_PHY)["c1"].flows
    pipe = {(tuple(sorted(f.match)), f.actions) for f in flows if f.priority == fc.PRIO_PHY_TRUNK}
    assert pipe == {((("in_port", 5),), (Output(1),)),
                    ((("in_port", 1), ("vlan_vid", (OFPVID_PRESENT, OFPVID_PRESENT))), (Output(5),))}
    # nodes whose br-phy ports are not known yet keep NORMAL switching only
    assert compile_bridge(s.with_phy_ofports({"c1": {"patch-int": 5, "ul0": 1}}), BR_PHY)["c2"].flows == bare
