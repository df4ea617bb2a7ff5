"""The sfc compiler, checked by walking frames through every node's compiled br-int (flowsim):
classified traffic crosses each group in order on any node and reaches its destination; a flow stays
on one instance and a symmetric chain's replies come back through it; unclassified traffic, other
ports' and other projects' traffic are untouched; every flow keeps to the pipeline's declaration."""
from __future__ import annotations

from collections import Counter

import pytest

from fathom.apps import BR_INT, compile_all
from fathom.apps.sfc import compiler as sfc
from fathom.model.chains import chain_vnf_ports, hop_marker, parse_hop_marker
from fathom.model import (
    FixedIp, FlowClassifier, Network, Node, Port, PortChain, PortPair, PortPairGroup, SecurityGroup,
    SecurityGroupRule, Snapshot, Subnet,
)
from fathom.pipeline.catalogue import BR_INT as PIPE

from .flowsim import Fabric

NET, RED = 1, 2
# (id, name, node, ip, network, project, port security)
PORTS = [(10, "client", "c1", "10.0.0.10", NET, "p1", True), (11, "server", "c3", "10.0.0.11", NET, "p1", True),
         (12, "other", "c1", "10.0.0.12", NET, "p1", True),
         (20, "fwai", "c1", "10.0.0.20", NET, "p1", False), (21, "fwao", "c1", "10.0.0.21", NET, "p1", False),
         (22, "fwbi", "c2", "10.0.0.22", NET, "p1", False), (23, "fwbo", "c2", "10.0.0.23", NET, "p1", False),
         (24, "dpii", "c3", "10.0.0.24", NET, "p1", False), (25, "dpio", "c3", "10.0.0.25", NET, "p1", False),
         (26, "nati", "c2", "10.0.0.26", NET, "p1", False), (27, "nato", "c2", "10.0.0.27", NET, "p1", False),
         (30, "evil", "c1", "10.0.0.10", RED, "p2", True), (31, "evilsrv", "c3", "10.0.0.11", RED, "p2", True)]


OPEN = {"p1": 1, "p2": 2}
GROUPS = tuple(SecurityGroup(g, f"open-{p}", p) for p, g in OPEN.items())
RULES = tuple(SecurityGroupRule(10 * g + i, g, d, "IPv4") for g in OPEN.values()
              for i, d in enumerate(("ingress", "egress")))


def mac(pid: int) -> str:
    return f"02:fa:00:00:00:{pid:02x}"


def model(chains=None, pairs=None, groups=None, fcs=None) -> Snapshot:
    nodes = tuple(Node(i, f"c{i}", "compute", f"198.18.0.{i}", None, "complete",
                       ofports={"vxlan0": 1, "patch-phy": 2,
                                **{name: pid for pid, name, node, *_ in PORTS if node == f"c{i}"}})
                  for i in (1, 2, 3))
    # workload ports are in their project's open group (everything in and out): the chain, not the
    # security groups, is under test here
    ports = tuple(Port(pid, name, proj, net, mac(pid), (FixedIp(net, ip),), node, name, sec,
                       (OPEN[proj],) if sec else ())
                  for pid, name, node, ip, net, proj, sec in PORTS)
    pairs = pairs if pairs is not None else (PortPair(1, "fwa", "p1", 20, 21), PortPair(2, "fwb", "p1", 22, 23),
                                             PortPair(3, "dpi", "p1", 24, 25))
    groups = groups if groups is not None else (PortPairGroup(1, "fw", "p1", (1, 2)), PortPairGroup(2, "dpi", "p1", (3,)))
    fcs = fcs if fcs is not None else (FlowClassifier(1, "web", "p1", 10, 11, protocol=6,
                                                      destination_port_range=(80, 80)),)
    chains = chains if chains is not None else (PortChain(1, "c", "p1", (1, 2), (1,), symmetric=True),)
    return Snapshot(nodes, (Network(NET, "blue", "p1", "vxlan", 1001), Network(RED, "red", "p2", "vxlan", 1002)),
                    (Subnet(NET, "blue", "p1", NET, "10.0.0.0/24", None), Subnet(RED, "red", "p2", RED, "10.0.0.0/24", None)),
                    ports, security_groups=GROUPS, security_group_rules=RULES, port_pairs=pairs, port_pair_groups=groups, flow_classifiers=fcs, port_chains=chains)


BY_NAME = {name: (pid, node, ip) for pid, name, node, ip, *_ in PORTS}
# a VNF: what comes in on its first port leaves on its second and the other way round (a router)
VNF_OUT = {"fwai": "fwao", "fwbi": "fwbo", "dpii": "dpio", "nati": "nato"}
VNF_OUT.update({v: k for k, v in list(VNF_OUT.items())})


def fabric(snap: Snapshot) -> Fabric:
    states = {k.name: s for k, s in compile_all(snap).items() if k.bridge == BR_INT}
    return Fabric(snap, states)


def tcp(src: str, dst: str, sport: int, dport: int) -> dict:
    return {"eth_src": mac(BY_NAME[src][0]), "eth_dst": mac(BY_NAME[dst][0]), "eth_type": 0x0800, "ip_proto": 6,
            "ipv4_src": BY_NAME[src][2], "ipv4_dst": BY_NAME[dst][2], "tcp_src": sport, "tcp_dst": dport}


def walk(fab: Fabric, sender: str, frame: dict, dst: str) -> list[str]:
    """The interfaces a frame is delivered to from `sender` until it reaches a workload port: a VNF
    routes it out of its other port (source MAC := that port's, destination MAC := the destination's)."""
    path = []
    node, iface = BY_NAME[sender][1], sender
    for _ in range(10):
        got = fab.send(node, iface, frame)
        assert len(got) == 1, (path, got)
        d = got[0]
        path.append(d.interface)
        if d.interface not in VNF_OUT:
            return path
        assert d.frame["eth_dst"] == mac(BY_NAME[d.interface][0]), "a VNF gets frames sent to its own port"
        iface = VNF_OUT[d.interface]
        node = BY_NAME[iface][1]
        frame = {**d.frame, "eth_src": mac(BY_NAME[iface][0]), "eth_dst": mac(BY_NAME[dst][0])}
    raise AssertionError(f"no end: {path}")


def test_chain_across_three_nodes_in_order_and_symmetric():
    fab = fabric(model())
    seen = Counter()
    for sport in range(40000, 40064):
        path = walk(fab, "client", tcp("client", "server", sport, 80), "server")
        assert path[0] in ("fwai", "fwbi") and path[1:] == ["dpii", "server"], path
        seen[path[0]] += 1
        # the same flow again: the same instance; its reply: back through the same one, in reverse
        assert walk(fab, "client", tcp("client", "server", sport, 80), "server") == path
        back = walk(fab, "server", tcp("server", "client", 80, sport), "client")
        assert back == ["dpio", VNF_OUT[path[0]], "client"], (path, back)
    assert seen["fwai"] > 8 and seen["fwbi"] > 8, seen   # both instances carry flows


def test_unclassified_and_other_ports_untouched():
    fab = fabric(model())
    assert walk(fab, "client", tcp("client", "server", 40000, 22), "server") == ["server"]     # another port
    assert walk(fab, "other", tcp("other", "server", 40000, 80), "server") == ["server"]       # another source
    assert walk(fab, "server", tcp("server", "other", 80, 40000), "other") == ["other"]
    # replies of a forward-only chain go straight back
    fab = fabric(model(chains=(PortChain(1, "c", "p1", (1, 2), (1,), symmetric=False),)))
    assert walk(fab, "server", tcp("server", "client", 80, 40000), "client") == ["client"]


def test_another_projects_traffic_is_never_classified():
    """Same addresses, same ports, same node as the chain's source: the red network's port is not
    the classifier's logical source port, so nothing of it reaches a VNF."""
    fab = fabric(model())
    for sport in range(40000, 40016):
        got = fab.send("c1", "evil", tcp("client", "server", sport, 80) | {"eth_src": mac(30), "eth_dst": mac(31)})
        assert [d.interface for d in got] == ["evilsrv"]
        got = fab.send("c3", "evilsrv", tcp("server", "client", 80, sport) | {"eth_src": mac(31), "eth_dst": mac(30)})
        assert [d.interface for d in got] == ["evil"]
    # no sfc flow matches anything but the chain's own ports
    for key, state in compile_all(model()).items():
        for f in state.flows:
            if f.cookie >> 56 == 0x05 and f.table == sfc.st.SFC:
                assert dict(f.match)[sfc.st.REG_SRC_PORT] in (10, 11, 20, 21, 22, 23, 24, 25)


def test_one_two_three_nodes():
    one = model(pairs=(PortPair(1, "fwa", "p1", 20, 21),), groups=(PortPairGroup(1, "fw", "p1", (1,)),),
                chains=(PortChain(1, "c", "p1", (1,), (1,)),))
    assert walk(fabric(one), "client", tcp("client", "server", 1, 80), "server") == ["fwai", "server"]
    two = model(pairs=(PortPair(1, "fwb", "p1", 22, 23), PortPair(2, "nat", "p1", 26, 27)),
                groups=(PortPairGroup(1, "fw", "p1", (1,)), PortPairGroup(2, "nat", "p1", (2,))),
                chains=(PortChain(1, "c", "p1", (1, 2), (1,)),))
    assert walk(fabric(two), "client", tcp("client", "server", 1, 80), "server") == \
        ["fwbi", "nati", "server"]


def test_hop_travels_in_the_vni_between_nodes():
    """c1 (the source) sends hop (1, forward, 0) to fw b on c2 in the VNI; c2 turns it back into reg10.
    With two instances the choice is a select group, with one the flow itself carries the bucket."""
    marker = hop_marker(1, 0, 0)

    def carries(actions) -> bool:
        return any(getattr(a, "field", None) == "tunnel_id" and a.value == marker for a in actions)

    snap = model(pairs=(PortPair(1, "fwb", "p1", 22, 23), PortPair(3, "dpi", "p1", 24, 25)),
                 groups=(PortPairGroup(1, "fw", "p1", (1,)), PortPairGroup(2, "dpi", "p1", (3,))))
    states = {k.name: s for k, s in compile_all(snap).items() if k.bridge == BR_INT}
    one = [f for f in states["c1"].flows if f.table == sfc.st.SFC_SELECT and dict(f.match) == {"reg10": marker}]
    assert len(one) == 1 and carries(one[0].actions) and not [g for g in states["c1"].groups if g.type == "select"]
    assert any(f.table == 0 and dict(f.match).get("tunnel_id") == marker for f in states["c2"].flows)
    states = {k.name: s for k, s in compile_all(model()).items() if k.bridge == BR_INT}
    group = next(g for g in states["c1"].groups if g.group_id == sfc.hop_group_id(marker))
    assert group.type == "select" and [carries(b) for b in group.buckets] == [False, True]   # fw a here, fw b on c2
    assert parse_hop_marker(hop_marker(1, 1, 1)) == (1, 1, 1) and parse_hop_marker(1001) is None


def test_flows_keep_to_the_pipeline_declaration():
    for state in compile_all(model()).values():
        assert PIPE.check(state.flows, state.groups) == []


def test_plan_problems_and_vnf_ports():
    snap = model()
    unplugged = Snapshot(tuple(n if n.name != "c2" else Node(n.id, n.name, n.role, n.tunnel_ip, None, "complete",
                                                              ofports={"vxlan0": 1})
                               for n in snap.nodes), snap.networks, snap.subnets, snap.ports,
                         security_groups=snap.security_groups, security_group_rules=snap.security_group_rules,
                         port_pairs=snap.port_pairs, port_pair_groups=snap.port_pair_groups,
                         flow_classifiers=snap.flow_classifiers, port_chains=snap.port_chains)
    _, plans = sfc.compile_sfc_plans(unplugged)
    assert any("port pair 2" in p for p in plans[1].problems) and not plans[1].fatal
    # the missing instance is left out; flows still go through the one that is there
    fab = fabric(unplugged)
    for sport in range(1, 20):
        assert walk(fab, "client", tcp("client", "server", sport, 80), "server")[0] == "fwai"
    big = model(chains=(PortChain(sfc.MAX_CHAIN_ID + 1, "c", "p1", (1, 2), (1,)),))
    assert sfc.compile_sfc_plans(big)[1][sfc.MAX_CHAIN_ID + 1].fatal
    vnfs = chain_vnf_ports(snap, 1)
    assert [(v.position, v.pair_id, v.node, v.ingress_interface, v.egress_interface, v.role) for v in vnfs] == [
        (0, 1, "c1", "fwai", "fwao", "source"), (0, 2, "c2", "fwbi", "fwbo", "source"),
        (1, 3, "c3", "dpii", "dpio", "sink")]


@pytest.mark.parametrize("rng,count", [((80, 80), 1), ((1024, 2047), 1), ((1000, 1999), 7), ((0, 65535), 1)])
def test_port_ranges_expand(rng, count):
    from fathom.model.classifiers import matches
    assert len(matches(FlowClassifier(1, "", "p", 10, None, 6, None, None, None, rng))) == count
