"""Views patched from those of the snapshot before (fathom.model.views): over a random walk of
changes to a small cloud (ports created, deleted, rebound, readdressed, regrouped, plugged and
unplugged, created for an interface already plugged, bound to the fabric's own interfaces; now and then a subnet or a router changed, which
no patch covers), each view of the new snapshot equals the view made afresh, and so
do the apps' compiles and their `touched` answers."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from fathom.apps import compile_all, registry
from fathom.model.views import Views
from fathom.model.hostlocal_desired import dhcp_server_addresses
from fathom.apps.secgroups.compiler import index
from fathom.apps.tenant import tenant_ports
from fathom.apps.tenant.compiler import node_scopes, topology
from fathom.pipeline.infrastructure import refused_ports
from fathom.model import (
    TUNNEL_INTERFACE, FixedIp, Network, Node, Port, Router, RouterInterface, SecurityGroup,
    SecurityGroupRule, Snapshot, Subnet,
)

NODES = ("c1", "c2", "c3")
STEPS = 150


def cloud() -> Snapshot:
    nodes = tuple(Node(i + 1, name, "compute", f"10.99.0.{i + 1}", f"198.18.0.{i + 1}", "complete",
                       ofports={TUNNEL_INTERFACE: 1, "dhp1": 2, "dhp2": 3})
                  for i, name in enumerate(NODES))
    networks = (Network(1, "blue", "p", "vxlan", 101), Network(2, "green", "p", "vxlan", 102),
                Network(3, "red", "p", "vxlan", 103))
    subnets = (Subnet(1, "b", "p", 1, "10.0.1.0/28", "10.0.1.1"), Subnet(2, "g", "p", 2, "10.0.2.0/28", "10.0.2.1"),
               Subnet(3, "r", "p", 3, "10.0.3.0/28", "10.0.3.1"))
    interfaces = (RouterInterface(900, 1, 1, 1, "10.0.1.1", "fa:16:3e:00:09:01"),
                  RouterInterface(901, 1, 2, 2, "10.0.2.1", "fa:16:3e:00:09:02"))
    groups = (SecurityGroup(1, "default", "p"), SecurityGroup(2, "web", "p"))
    rules = (SecurityGroupRule(1, 1, "egress", "IPv4"), SecurityGroupRule(2, 1, "ingress", "IPv4", remote_group_id=1),
             SecurityGroupRule(3, 2, "ingress", "IPv4", 6, 80, 80, remote_prefix="0.0.0.0/0"),
             SecurityGroupRule(4, 2, "ingress", "IPv4", remote_group_id=2))
    return Snapshot(nodes, networks, subnets, (), (Router(1, "r", "p"),), interfaces,
                    security_groups=groups, security_group_rules=rules)


class Walk:
    def __init__(self, rng: random.Random):
        self.rng, self.next_id = rng, 1

    def port(self, base: Snapshot) -> Port:
        rng, pid = self.rng, self.next_id
        self.next_id += 1
        net = rng.choice((1, 2, 3))
        return Port(pid, f"p{pid}", "p", net, f"fa:16:3e:00:00:{pid:02x}", (self.address(net),),
                    rng.choice(NODES), f"tap{pid}", rng.random() > 0.2, self.groups())

    def address(self, net: int) -> FixedIp:
        return FixedIp(net, f"10.0.{net}.{self.rng.randint(2, 14)}")   # clashes and the top address too

    def groups(self) -> tuple:
        return self.rng.choice(((), (1,), (2,), (1, 2)))

    def step(self, s: Snapshot) -> Snapshot:
        rng, ports = self.rng, list(s.ports)
        what = rng.choice(("add", "add", "add", "delete", "rebind", "readdress", "regroup", "plug", "plug",
                           "unplug", "fabric", "many", "subnet", "router", "plug next"))
        if what == "plug next":   # the next port's interface, before the port: it joins its node plugged
            node = rng.choice(NODES)
            return replace(s, nodes=tuple(replace(n, ofports={**n.ofports, f"tap{self.next_id}": 10 + self.next_id})
                                          if n.name == node else n for n in s.nodes))
        if what == "add" or not ports:
            ports.append(self.port(s))
        elif what == "many":
            ports += [self.port(s) for _ in range(rng.randint(2, 6))]
            ports = [p for p in ports if rng.random() > 0.1]
        else:
            i = rng.randrange(len(ports))
            p = ports[i]
            if what == "delete":
                del ports[i]
            elif what == "rebind":
                ports[i] = replace(p, node=rng.choice(NODES + (None,)))
            elif what == "readdress":
                ports[i] = replace(p, fixed_ips=(self.address(p.network_id),))
            elif what == "regroup":
                ports[i] = replace(p, security_groups=self.groups(), port_security=rng.random() > 0.3)
            elif what == "fabric":
                ports[i] = replace(p, interface=rng.choice((TUNNEL_INTERFACE, "dhp1", "patch-phy", p.interface)))
            elif what in ("plug", "unplug") and p.node is not None:
                nodes = []
                for n in s.nodes:
                    ofports = dict(n.ofports)
                    if n.name == p.node and what == "plug":
                        ofports[p.interface] = 10 + p.id
                    elif n.name == p.node:
                        ofports.pop(p.interface, None)
                    nodes.append(replace(n, ofports=ofports))
                s = replace(s, nodes=tuple(nodes))
            elif what == "subnet":
                s = replace(s, subnets=tuple(replace(x, enable_dhcp=not x.enable_dhcp) if x.id == 3 else x
                                             for x in s.subnets))
            elif what == "router":
                have = {ri.id for ri in s.router_interfaces}
                s = replace(s, router_interfaces=s.router_interfaces[:2] if 902 in have else
                            s.router_interfaces + (RouterInterface(902, 1, 3, 3, "10.0.3.1", "fa:16:3e:00:09:03"),))
        return replace(s, ports=tuple(sorted(ports, key=lambda p: p.id)))


def derived(s: Snapshot, v: Views | None) -> dict:
    topo = topology(s, v)
    lists = lambda d: {k: [p.id for p in v] for k, v in d.items() if v}   # noqa: E731
    idx = index(s, v)
    return {
        "refused": refused_ports(s, v), "facts": tenant_ports(s, v), "scopes": node_scopes(s, v),
        "dhcp": list(dhcp_server_addresses(s, v).items()),
        "topology": (topo.nodes, topo.networks, topo.subnets, topo.dhcp_servers, topo.ports,
                     lists(topo.ports_by_network), lists(topo.ports_by_node),
                     {k: v for k, v in topo.gateway_networks.items() if v}),
        "secgroups": (idx.ports, idx.views, {k: v for k, v in idx.group_ports.items() if v}, idx.member_sets,
                      {k: v for k, v in idx.local.items() if v}, idx.here, {k: v for k, v in idx.where.items() if v},
                      {n: idx.zones(n) for n in NODES}, idx.contributors(),
                      {r.id: idx.matches(r) for r in s.security_group_rules}),
    }


def following(last: Views, before: Snapshot, after: Snapshot) -> Views:
    """The views of a pass that compiles `after` after `before` (as DesiredState.update makes them)."""
    last.settle()
    v = Views(before=last)
    v.follow(after, before)
    return v


@pytest.mark.parametrize("seed", range(4))
def test_patched_views_equal_fresh_ones(seed):
    walk = Walk(random.Random(seed))
    before = cloud()
    last = Views()
    derived(before, last)
    patched = 0
    for _ in range(STEPS):
        after = walk.step(before)
        v = following(last, before, after)
        assert derived(after, v) == derived(after, None), f"after {walk.next_id} ports made"
        if v.delta(after) is not None and not v.delta(after).fields:
            patched += 1
        for app in registry():
            if app.touched is not None:
                assert app.touched(before, after, v) == app.touched(before, after, None), app.name
        assert compile_all(after, views=v) == compile_all(after)
        before, last = after, v
    assert patched > STEPS // 2     # most steps were patched, not made afresh


def test_a_large_change_or_a_snapshot_that_follows_nothing_is_not_patched():
    walk = Walk(random.Random(9))
    before = cloud()
    before = replace(before, ports=tuple(walk.port(before) for _ in range(300)))
    last = Views()
    after = replace(before, ports=before.ports[:-1])
    delta = following(last, before, after).delta(after)
    assert delta is not None and delta.ports == {before.ports[-1].id} and not delta.fields and not delta.nodes
    assert delta.before == {before.ports[-1].id: before.ports[-1]} and delta.after == {}
    # every port object new (a whole read of the store): too many to patch (DELTA_PORTS)
    fresh = replace(before, ports=tuple(replace(p) for p in before.ports))
    assert following(last, before, fresh).delta(fresh) is None
    # without the views of the pass before (the first pass, or an audit), nothing is patched
    alone = Views()
    alone.follow(after, before)
    assert alone.delta(after) is None

