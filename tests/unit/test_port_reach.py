"""A port's write reaches only the switches the apps say (fathom.apps.port_write_reach): over random
clouds and random walks of port writes (created, deleted, rebound, regrouped, readdressed; between
them, interfaces plugged and unplugged, which are no port writes), every switch whose desired
state a write changed is on a node the apps' reach named from the model before it. A replica of a
cluster defers its pass for a write whose reach holds none of its switches
(fathom.controller.cluster.ClusterMember.wakes_for), so a node missing here is a switch left
behind for up to a DEFER."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from fathom.apps import PortWrite, compile_all, port_write_reach
from fathom.apps.fabric.compiler import PHY_PATCH, PHY_UNDERLAY
from fathom.model import (
    TUNNEL_INTERFACE, UPLINK_INTERFACE, FabricState, FabricSwitch, FixedIp, Link, Network, Node, Port, Router,
    RouterInterface, SecurityGroup, SecurityGroupRule, Snapshot, Subnet, TapPolicy,
)

NODES = tuple(f"c{i}" for i in range(1, 7))
STEPS = 120


def cloud(rng: random.Random) -> Snapshot:
    """Six nodes, four networks (two or three of them routed by one router, now and then a second
    router), one of them a VLAN network or not, two groups whose rules name a remote group or not,
    a tap policy or not, a fabric switch linked to every node or not."""
    fabric = rng.random() < 0.5
    nodes = tuple(Node(i + 1, name, "compute", f"10.99.0.{i + 1}", f"198.18.0.{i + 1}", "complete",
                       ofports={TUNNEL_INTERFACE: 1, UPLINK_INTERFACE: 2},
                       phy_ofports={PHY_PATCH: 1, PHY_UNDERLAY: 2} if fabric else {})
                  for i, name in enumerate(NODES))
    networks = tuple(Network(i, name, "p", "vxlan", 100 + i) for i, name in enumerate(("blue", "green", "red"), 1))
    networks += (Network(4, "grey", "p", "vlan", 204) if rng.random() < 0.5 else Network(4, "grey", "p", "vxlan", 104),)
    subnets = tuple(Subnet(i, f"s{i}", "p", i, f"10.0.{i}.0/28", f"10.0.{i}.1") for i in range(1, 5))
    interfaces = [RouterInterface(900, 1, 1, 1, "10.0.1.1", "fa:16:3e:00:09:01"),
                  RouterInterface(901, 1, 2, 2, "10.0.2.1", "fa:16:3e:00:09:02")]
    routers = [Router(1, "r", "p")]
    if rng.random() < 0.5:
        interfaces.append(RouterInterface(902, 1, 3, 3, "10.0.3.1", "fa:16:3e:00:09:03"))
    if rng.random() < 0.3:
        routers.append(Router(2, "r2", "p"))
        interfaces.append(RouterInterface(903, 2, 4, 4, "10.0.4.1", "fa:16:3e:00:09:04"))
    groups = (SecurityGroup(1, "default", "p"), SecurityGroup(2, "web", "p"))
    rules = [SecurityGroupRule(1, 1, "egress", "IPv4"),
             SecurityGroupRule(3, 2, "ingress", "IPv4", 6, 80, 80, remote_prefix="0.0.0.0/0")]
    if rng.random() < 0.75:
        rules.append(SecurityGroupRule(2, rng.choice((1, 2)), "ingress", "IPv4", remote_group_id=rng.choice((1, 2))))
    # a tap policy (vtap) now and then: between two of the first ports
    taps = (TapPolicy(1, "t", "p", 2, 3, True, "", "", ()),) if rng.random() < 0.5 else ()
    state = FabricState((FabricSwitch(1, "tor1", "10.98.0.1", "br-tor", 100, 300),),
                        tuple(Link(1, f"eth{i}", 10 + i, name, "declared") for i, name in enumerate(NODES)),
                        ofports={"tor1": {f"eth{i}": 10 + i for i in range(len(NODES))}}) if fabric else None
    return Snapshot(nodes, networks, subnets, (), tuple(routers), tuple(interfaces), taps,
                    security_groups=groups, security_group_rules=tuple(rules), fabric=state)


class Walk:
    def __init__(self, rng: random.Random):
        self.rng, self.next_id = rng, 1

    def port(self) -> Port:
        rng, pid = self.rng, self.next_id
        self.next_id += 1
        net = rng.choice((1, 2, 3, 4))
        return Port(pid, f"p{pid}", "p", net, f"fa:16:3e:00:00:{pid:02x}", (self.address(net),),
                    rng.choice(NODES + (None,)), f"tap{pid}", rng.random() > 0.2, self.groups())

    def address(self, net: int) -> FixedIp:
        return FixedIp(net, f"10.0.{net}.{self.rng.randint(2, 14)}")

    def groups(self) -> tuple:
        return self.rng.choice(((), (1,), (2,), (1, 2)))

    def plugged(self, s: Snapshot, node: str | None, interface: str, on: bool) -> Snapshot:
        if node is None:
            return s
        nodes = []
        for n in s.nodes:
            ofports = dict(n.ofports)
            if n.name == node and on:
                ofports[interface] = 10 + int(interface[3:])
            elif n.name == node:
                ofports.pop(interface, None)
            nodes.append(replace(n, ofports=ofports))
        return replace(s, nodes=tuple(nodes))

    def interfaces(self, s: Snapshot) -> Snapshot:
        """Not a port write: an interface plugged (a port's, or the next port's, as a VM's VIF comes
        before its API call) or unplugged."""
        ports = list(s.ports)
        if ports and self.rng.random() < 0.7:
            p = self.rng.choice(ports)
            return self.plugged(s, p.node, p.interface, self.rng.random() < 0.8)
        return self.plugged(s, self.rng.choice(NODES), f"tap{self.next_id}", True)

    def write(self, s: Snapshot) -> tuple[Snapshot, PortWrite]:
        """A port's write: the model after it and the write as the change feed tells it."""
        rng, ports = self.rng, list(s.ports)
        what = rng.choice(("add", "add", "delete", "rebind", "regroup", "readdress"))
        if what == "add" or not ports:
            p = self.port()
            ports.append(p)
            before, after = None, p
        else:
            i = rng.randrange(len(ports))
            before = ports[i]
            if what == "delete":
                after = None
                del ports[i]
            else:
                after = (replace(before, node=rng.choice(NODES + (None,))) if what == "rebind" else
                         replace(before, security_groups=self.groups(), port_security=rng.random() > 0.3)
                         if what == "regroup" else replace(before, fixed_ips=(self.address(before.network_id),)))
                ports[i] = after
        p = after or before
        nodes = frozenset(x.node for x in (before, after) if x is not None and x.node is not None)
        return replace(s, ports=tuple(sorted(ports, key=lambda p: p.id))), PortWrite(p.id, nodes, p.network_id)


def changed_nodes(before: dict, after: dict) -> set[str]:
    return {key.name for key in set(before) | set(after) if before.get(key) != after.get(key)}


@pytest.mark.parametrize("seed", range(8))
def test_a_port_write_changes_only_switches_of_the_nodes_its_reach_names(seed):
    rng = random.Random(seed)
    model = cloud(rng)
    walk = Walk(rng)
    compiled = compile_all(model)
    narrower = beyond_own = nones = 0
    for step in range(STEPS):
        if rng.random() < 0.4:
            model = walk.interfaces(model)
            compiled = compile_all(model)
            continue
        after, write = walk.write(model)
        reach = port_write_reach(model, [write])
        now = compile_all(after)
        changed = changed_nodes(compiled, now)
        if reach is None:     # a port a tap policy names, or a fabric switch that may follow a VLAN network
            nones += 1
            model, compiled = after, now
            continue
        assert changed <= reach, f"step {step}: {write} changed {sorted(changed - reach)} beyond {sorted(reach)}"
        narrower += len(reach) < len(NODES)
        beyond_own += bool(changed - write.nodes)
        model, compiled = after, now
    # not vacuous: the reach often leaves nodes out, and a write often changes more than its own nodes
    assert narrower > STEPS // 6 and beyond_own >= 2 and nones < STEPS // 3, (narrower, beyond_own, nones)


def test_an_app_that_cannot_tell_reaches_every_switch():
    """A tap policy naming the port: the vtap app cannot tell the write's reach (any switch); one
    that does not name it: none of its switches."""
    model = replace(cloud(random.Random(1)), tap_policies=(TapPolicy(1, "t", "p", 1, 2, True, "", "", ()),))
    write = PortWrite(3, frozenset({"c1"}), 1)
    assert port_write_reach(model, [write]) == frozenset({"c1"})
    assert port_write_reach(model, [write, PortWrite(1, frozenset({"c2"}), 1)]) is None
