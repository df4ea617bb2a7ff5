"""The security-groups compiler (fathom/apps/secgroups): what its flows allow and deny, walked through
every app's compiled br-ints with the connection tracker of tests/unit/flowsim.py; that the flow
count grows with rules plus members, never their product; and that a real OVS takes the flows.

The cloud: two compute nodes; network blue (VXLAN, 10.0.0.0/24) and red (VLAN 110, 10.1.0.0/24)
joined by a distributed router; project p's ports web1 (c1, blue), web2 (c2, blue), db (c2, red),
cli (c1, red), and project q's port q1 (c1, blue, address overlapping nothing).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fathom.apps import BR_INT, SwitchKey, compile_all
from fathom.apps.secgroups import compiler as sg
from fathom.model import (
    TUNNEL_INTERFACE, UPLINK_INTERFACE, FixedIp, Network, Node, Port, Router, RouterInterface, SecurityGroup,
    SecurityGroupRule, Snapshot, Subnet,
)
from fathom.pipeline import catalogue as cat
from fathom.pipeline import cookies as ck

from .flowsim import Fabric
from .test_spec_ovs import _dumped_flows, _install, ovs  # noqa: F401 - the real-OVS fixture

TCP, UDP, ICMP = 6, 17, 1
DEFAULT, WEB, DB, Q_DEFAULT = 1, 2, 3, 4
GW = {1: "02:fd:00:00:00:01", 2: "02:fd:00:00:00:02"}

# rules of groups: default (Neutron's), web (ingress TCP 80 from anywhere, UDP 53 from 10.1.0.0/24,
# ICMP echo from anywhere), db (ingress TCP 5432 from members of web), q's default
RULES = (
    SecurityGroupRule(1, DEFAULT, "egress", "IPv4"),
    SecurityGroupRule(2, DEFAULT, "egress", "IPv6"),
    SecurityGroupRule(3, DEFAULT, "ingress", "IPv4", remote_group_id=DEFAULT),
    SecurityGroupRule(4, DEFAULT, "ingress", "IPv6", remote_group_id=DEFAULT),
    SecurityGroupRule(10, WEB, "ingress", "IPv4", TCP, 80, 80),
    SecurityGroupRule(11, WEB, "ingress", "IPv4", UDP, 53, 53, remote_prefix="10.1.0.0/24"),
    SecurityGroupRule(12, WEB, "ingress", "IPv4", ICMP, 8, None),
    SecurityGroupRule(13, WEB, "egress", "IPv4"),
    SecurityGroupRule(20, DB, "ingress", "IPv4", TCP, 5432, 5432, remote_group_id=WEB),
    SecurityGroupRule(21, DB, "egress", "IPv4", TCP, 1, 1023),
    SecurityGroupRule(30, Q_DEFAULT, "egress", "IPv4"),
    SecurityGroupRule(31, Q_DEFAULT, "ingress", "IPv4", remote_group_id=Q_DEFAULT),
)


def _port(pid, name, project, net, ip, node, groups, port_security=True) -> Port:
    return Port(pid, name, project, net, f"02:00:00:00:00:{pid:02x}", (FixedIp(net, ip),), node, name,
                port_security, groups)


def cloud(rules=RULES, **changes) -> Snapshot:
    ports = {p.name: p for p in (
        _port(11, "web1", "p", 1, "10.0.0.11", "c1", (WEB,)),
        _port(12, "web2", "p", 1, "10.0.0.12", "c2", (WEB,)),
        _port(13, "db", "p", 2, "10.1.0.13", "c2", (DB,)),
        _port(14, "cli", "p", 2, "10.1.0.14", "c1", (DEFAULT,)),
        _port(15, "q1", "q", 1, "10.0.0.15", "c1", (Q_DEFAULT,)),
    )}
    for name, fields in changes.items():
        ports[name] = dataclasses.replace(ports[name], **fields)
    nodes = tuple(Node(i, n, "compute", f"198.18.0.{i}", None, "complete",
                       {TUNNEL_INTERFACE: 1, UPLINK_INTERFACE: 2,
                        **{p.interface: 10 + p.id for p in ports.values() if p.node == n}})
                  for i, n in ((1, "c1"), (2, "c2")))
    return Snapshot(
        nodes, (Network(1, "blue", "p", "vxlan", 1001), Network(2, "red", "p", "vlan", 110)),
        (Subnet(1, "blue", "p", 1, "10.0.0.0/24", "10.0.0.1"), Subnet(2, "red", "p", 2, "10.1.0.0/24", "10.1.0.1")),
        tuple(ports.values()), (Router(1, "r", "p"),),
        (RouterInterface(1, 1, 1, 1, "10.0.0.1", GW[1]), RouterInterface(2, 1, 2, 2, "10.1.0.1", GW[2])),
        security_groups=(SecurityGroup(DEFAULT, "default", "p"), SecurityGroup(WEB, "web", "p"),
                         SecurityGroup(DB, "db", "p"), SecurityGroup(Q_DEFAULT, "default", "q")),
        security_group_rules=tuple(rules))


def fabric(snap: Snapshot, conntrack=None) -> Fabric:
    states = {k.name: s for k, s in compile_all(snap).items() if k.bridge == BR_INT}
    sim = Fabric(snap, states)
    if conntrack is not None:
        sim.conntrack = conntrack
    return sim


def _by_name(snap: Snapshot) -> dict[str, Port]:
    return {p.name: p for p in snap.ports}


def frame(snap: Snapshot, src: str, dst: str, proto: int, dport: int = 0, sport: int = 40000, **extra) -> dict:
    """An IPv4 frame from port src to port dst (through the router when they are in different networks)."""
    ports = _by_name(snap)
    s, d = ports[src], ports[dst]
    eth_dst = d.mac_address if s.network_id == d.network_id else GW[s.network_id]
    pkt = {"eth_src": s.mac_address, "eth_dst": eth_dst, "eth_type": 0x0800, "ip_proto": proto,
           "ipv4_src": s.fixed_ips[0].ip_address, "ipv4_dst": d.fixed_ips[0].ip_address, "ttl": 64, **extra}
    if proto == TCP:
        pkt.update(tcp_src=sport, tcp_dst=dport)
    elif proto == UDP:
        pkt.update(udp_src=sport, udp_dst=dport)
    elif proto == ICMP:
        pkt.update(icmpv4_type=dport, icmpv4_code=0)
    return pkt


def reply(snap: Snapshot, pkt: dict, src: str, dst: str) -> dict:
    """The answer of dst to `pkt` (ports swapped; echo request -> echo reply)."""
    back = frame(snap, dst, src, pkt["ip_proto"])
    for a, b in (("tcp_src", "tcp_dst"), ("udp_src", "udp_dst")):
        if a in pkt:
            back[a], back[b] = pkt[b], pkt[a]
    if pkt["ip_proto"] == ICMP:
        back["icmpv4_type"] = 0
    return back


def delivered(sim: Fabric, snap: Snapshot, src: str, pkt: dict) -> list[str]:
    p = _by_name(snap)[src]
    return [d.interface for d in sim.send(p.node, p.interface, pkt)]


def connect(sim, snap, src, dst, proto, dport=0) -> tuple[bool, bool]:
    """(request delivered, reply delivered) of one exchange src -> dst."""
    pkt = frame(snap, src, dst, proto, dport)
    there = delivered(sim, snap, src, pkt) == [dst]
    back = there and delivered(sim, snap, dst, reply(snap, pkt, src, dst)) == [src]
    return there, back


# ---------------------------------------------------------------------------------------------- semantics


def test_ingress_rules_allow_exactly_what_they_say():
    snap = cloud()
    sim = fabric(snap)
    assert connect(sim, snap, "web2", "web1", TCP, 80) == (True, True)      # same network, cross node
    assert connect(sim, snap, "cli", "web1", TCP, 80) == (True, True)       # routed, same node
    assert connect(sim, snap, "web2", "web1", TCP, 81) == (False, False)    # another port
    assert connect(sim, snap, "cli", "web2", UDP, 53) == (True, True)       # from 10.1.0.0/24, routed
    assert connect(sim, snap, "web1", "web2", UDP, 53) == (False, False)    # from outside the prefix
    assert connect(sim, snap, "cli", "web1", ICMP, 8) == (True, True)       # echo request
    assert connect(sim, snap, "cli", "web1", ICMP, 13) == (False, False)    # timestamp: another type


def test_remote_group_admits_its_members_only():
    snap = cloud()
    sim = fabric(snap)
    assert connect(sim, snap, "web1", "db", TCP, 5432) == (True, True)      # web member, routed cross node
    assert connect(sim, snap, "cli", "db", TCP, 5432) == (False, False)     # not a member of web
    # joining the group is enough: no rule changes
    snap = cloud(cli={"security_groups": (DEFAULT, WEB)})
    assert connect(fabric(snap), snap, "cli", "db", TCP, 5432) == (True, True)


def test_egress_rules_limit_what_a_port_sends():
    snap = cloud()
    sim = fabric(snap)
    # db may open TCP 1..1023 only (web1 accepts TCP 80 from anywhere)
    assert connect(sim, snap, "db", "web1", TCP, 80) == (True, True)
    assert connect(sim, snap, "db", "web1", UDP, 53) == (False, False)
    # the default group: egress anywhere, ingress from its members only
    assert connect(sim, snap, "cli", "db", TCP, 22) == (False, False)       # db does not accept
    assert connect(sim, snap, "web1", "cli", TCP, 22) == (False, False)     # web1 is no member of default


def test_a_port_without_groups_sends_and_receives_no_ip_but_arp():
    snap = cloud(web1={"security_groups": ()})
    sim = fabric(snap)
    assert connect(sim, snap, "web2", "web1", TCP, 80) == (False, False)
    assert connect(sim, snap, "web1", "web2", TCP, 80) == (False, False)
    web1, web2 = _by_name(snap)["web1"], _by_name(snap)["web2"]
    arp = {"eth_src": web1.mac_address, "eth_dst": "ff:ff:ff:ff:ff:ff", "eth_type": 0x0806, "arp_op": 1,
           "arp_spa": "10.0.0.11", "arp_tpa": "10.0.0.12", "arp_sha": web1.mac_address}
    assert delivered(sim, snap, "web1", arp) == ["web1"]     # answered by the switch, as before


def test_ipv6_neighbour_discovery_is_never_filtered():
    snap = cloud(web1={"security_groups": ()})
    sim = fabric(snap)
    web1, web2 = _by_name(snap)["web1"], _by_name(snap)["web2"]
    for icmp_type, delivered_to in ((136, ["web1"]), (128, [])):     # neighbour advertisement; echo request
        pkt = {"eth_src": web2.mac_address, "eth_dst": web1.mac_address, "eth_type": 0x86DD, "ip_proto": 58,
               "ipv6_src": "fe80::2", "ipv6_dst": "fe80::1", "icmpv6_type": icmp_type, "icmpv6_code": 0}
        assert delivered(sim, snap, "web2", pkt) == delivered_to, icmp_type


def test_port_security_off_disables_filtering():
    snap = cloud(web1={"port_security": False, "security_groups": ()})
    sim = fabric(snap)
    assert connect(sim, snap, "web2", "web1", TCP, 81) == (True, True)      # web2's egress is open
    assert connect(sim, snap, "web1", "web2", TCP, 80) == (True, True)
    assert connect(sim, snap, "cli", "web1", UDP, 9) == (True, True)
    assert not any(dict(f.match).get(cat.REG_SRC_PORT) == 11 or dict(f.match).get(cat.REG_DST_PORT) == 11
                   for s in sg.compile_secgroups(snap).values() for f in s.flows)


@pytest.mark.parametrize("src", ["web2", "q1"], ids=["cross node", "same node and network"])
def test_established_connection_survives_an_unrelated_rule_change(src):
    snap = cloud()
    sim = fabric(snap)
    pkt = frame(snap, src, "web1", TCP, 80)
    assert delivered(sim, snap, src, pkt) == ["web1"]
    more = cloud(RULES + (SecurityGroupRule(40, WEB, "ingress", "IPv4", TCP, 443, 443),))
    fewer = cloud(tuple(r for r in RULES if r.id != 11))
    for changed in (more, fewer):
        after = fabric(changed, sim.conntrack)
        assert delivered(after, changed, "web1", reply(changed, pkt, src, "web1")) == [src]
        assert delivered(after, changed, src, pkt) == ["web1"]


def test_removing_the_admitting_rule_cuts_the_connection():
    snap = cloud()
    sim = fabric(snap)
    pkt = frame(snap, "web2", "web1", TCP, 80)
    assert delivered(sim, snap, "web2", pkt) == ["web1"]
    cut = cloud(tuple(r for r in RULES if r.id != 10))
    after = fabric(cut, sim.conntrack)
    assert delivered(after, cut, "web1", reply(cut, pkt, "web2", "web1")) == []   # the reply
    assert delivered(after, cut, "web2", pkt) == []                              # and the next request
    # another rule that allows it re-admits it, with its own mark
    other = cloud(tuple(r for r in RULES if r.id != 10) + (SecurityGroupRule(41, WEB, "ingress", "IPv4", TCP),))
    again = fabric(other, sim.conntrack)
    assert delivered(again, other, "web2", pkt) == ["web1"]
    assert delivered(again, other, "web1", reply(other, pkt, "web2", "web1")) == ["web2"]


def test_leaving_the_group_cuts_what_its_rules_admitted():
    snap = cloud()
    sim = fabric(snap)
    pkt = frame(snap, "web1", "db", TCP, 5432)
    assert delivered(sim, snap, "web1", pkt) == ["db"]
    moved = cloud(db={"security_groups": (DEFAULT,)})
    after = fabric(moved, sim.conntrack)
    assert delivered(after, moved, "db", reply(moved, pkt, "web1", "db")) == []


def test_tenants_stay_isolated():
    snap = cloud(q1={"security_groups": (Q_DEFAULT,)})
    sim = fabric(snap)
    # q1 is in blue's address space but another project: its default group admits only its members
    assert connect(sim, snap, "web2", "q1", TCP, 80) == (False, False)
    assert connect(sim, snap, "q1", "web1", TCP, 80) == (True, True)    # web admits TCP 80 from anywhere


def _zone(snap: Snapshot, node: str, net: int) -> int:
    return sg.Index(snap).zones(node)[net]


def test_one_node_one_network_one_entry_with_both_sides_rules():
    """q1 -> web1 (c1, blue): tracked once in blue's zone; the entry holds q1's egress rule (30) in
    ct_mark and web1's ingress rule (10) in ct_label, and the reply needs both."""
    snap = cloud()
    sim = fabric(snap)
    assert connect(sim, snap, "q1", "web1", TCP, 80) == (True, True)
    zone = _zone(snap, "c1", 1)
    assert {k: list(v.values()) for k, v in sim.conntrack.items() if v} == {
        ("c1", zone): [{"ct_mark": 30, "ct_label": 10}]}
    # cross node: each node's entry holds its own side's half
    sim = fabric(snap)
    assert connect(sim, snap, "web2", "web1", TCP, 80) == (True, True)
    assert {k: list(v.values()) for k, v in sim.conntrack.items() if v} == {
        ("c2", zone): [{"ct_mark": 13, "ct_label": 0}], ("c1", zone): [{"ct_mark": 0, "ct_label": 10}]}


def test_routed_traffic_is_tracked_in_each_network_s_zone():
    snap = cloud()
    sim = fabric(snap)
    assert connect(sim, snap, "cli", "web1", TCP, 80) == (True, True)       # red -> blue on c1
    blue, red = _zone(snap, "c1", 1), _zone(snap, "c1", 2)
    assert blue != red
    assert {k: list(v.values()) for k, v in sim.conntrack.items() if v} == {
        ("c1", red): [{"ct_mark": 1, "ct_label": 0}], ("c1", blue): [{"ct_mark": 0, "ct_label": 10}]}


def test_either_side_s_rule_removed_cuts_a_same_node_connection():
    snap = cloud()
    sim = fabric(snap)
    pkt = frame(snap, "q1", "web1", TCP, 80)
    assert delivered(sim, snap, "q1", pkt) == ["web1"]
    for gone in (10, 30):      # the responder's ingress rule, the originator's egress rule
        cut = cloud(tuple(r for r in RULES if r.id != gone))
        conntrack = {k: {c: dict(e) for c, e in v.items()} for k, v in sim.conntrack.items()}
        after = fabric(cut, conntrack)
        assert delivered(after, cut, "web1", reply(cut, pkt, "q1", "web1")) == [], gone
        assert delivered(after, cut, "q1", pkt) == [], gone
    # another rule on the responder's side re-admits it; its reply passes both sides again
    other = cloud(tuple(r for r in RULES if r.id != 10) + (SecurityGroupRule(41, WEB, "ingress", "IPv4", TCP),))
    again = fabric(other, sim.conntrack)
    assert delivered(again, other, "q1", pkt) == ["web1"]
    assert delivered(again, other, "web1", reply(other, pkt, "q1", "web1")) == ["q1"]
    assert list(sim.conntrack[("c1", _zone(snap, "c1", 1))].values()) == [{"ct_mark": 30, "ct_label": 41}]


def test_networks_never_share_a_zone_on_a_node():
    """Network ids 0x7FFF apart fold onto one zone: on a node holding both, the later takes the next
    free zone; a new network never moves an existing one."""
    assert sg.network_zones({1, 0x8000, 2}) == {1: 1, 2: 2, 0x8000: 3}
    assert sg.network_zones({0x8000}) == {0x8000: 1}
    assert sg.network_zones({0x8000, 0x10000}) == {0x8000: 1, 0x10000: 2}
    full = set(range(1, 0x8000))
    assert sg.network_zones(full | {0x8000})[0x8000] is None


def _two_tenants(nets: tuple[int, int], both: bool) -> Snapshot:
    """Projects p and q, each a network with the same addresses (10.9.0.0/24), on node c1; with
    `both` false, only q's port is bound there."""
    a, b = nets
    ports = [Port(21, "qa", "q", b, "02:00:00:00:01:21", (FixedIp(b, "10.9.0.5"),), "c1", "qa", True, (Q_DEFAULT,)),
             Port(22, "qb", "q", b, "02:00:00:00:01:22", (FixedIp(b, "10.9.0.6"),), "c1", "qb", True, (Q_DEFAULT,))]
    if both:
        ports += [Port(23, "pa", "p", a, "02:00:00:00:01:23", (FixedIp(a, "10.9.0.5"),), "c1", "pa", True, (DEFAULT,)),
                  Port(24, "pb", "p", a, "02:00:00:00:01:24", (FixedIp(a, "10.9.0.6"),), "c1", "pb", True, (DEFAULT,))]
    node = Node(1, "c1", "compute", "198.18.0.1", None, "complete",
                {TUNNEL_INTERFACE: 1, UPLINK_INTERFACE: 2, **{p.interface: p.id for p in ports}})
    return Snapshot((node,), (Network(a, "pn", "p", "vxlan", 2001), Network(b, "qn", "q", "vxlan", 2002)),
                    (Subnet(1, "psub", "p", a, "10.9.0.0/24", "10.9.0.1"), Subnet(2, "qsub", "q", b, "10.9.0.0/24", "10.9.0.1")),
                    tuple(ports), security_groups=(SecurityGroup(DEFAULT, "default", "p"),
                                                   SecurityGroup(Q_DEFAULT, "default", "q")),
                    security_group_rules=RULES)


def test_tenants_with_the_same_addresses_on_one_node_never_share_entries():
    """Networks 1 and 0x8000 (one zone by the fold) of two projects, the same addresses on one node:
    a connection of one never admits the same 5-tuple in the other."""
    snap = _two_tenants((1, 0x8000), both=True)
    sim = fabric(snap)
    assert connect(sim, snap, "pa", "pb", TCP, 22) == (True, True)
    assert _zone(snap, "c1", 1) != _zone(snap, "c1", 0x8000)
    # q's default admits TCP from its members only, so the same 5-tuple in q's network passes; its
    # reply seen first in q's network would be new there, not p's established reply
    sim2 = fabric(snap, sim.conntrack)
    pkt = frame(snap, "pa", "pb", TCP, 22)
    back = reply(snap, pkt, "pa", "pb")
    assert delivered(sim2, snap, "qb", {**back, "eth_src": "02:00:00:00:01:22", "eth_dst": "02:00:00:00:01:21"}) \
        == ["qa"]
    zone_q = _zone(snap, "c1", 0x8000)
    assert sim2.conntrack[("c1", zone_q)], "q's frame was tracked in q's own zone"


def test_a_zone_that_moves_is_recompiled_incrementally():
    """Network 1 arriving on a node where network 0x8000 holds zone 1 moves 0x8000's ports to zone 2:
    touched names them, and compiling those owners gives the whole compile."""
    from fathom.apps import by_owner
    from fathom.apps.secgroups import compile as whole_compile, compile_owners, touched
    before, after = _two_tenants((1, 0x8000), both=False), _two_tenants((1, 0x8000), both=True)
    assert sg.Index(before).zones("c1") == {0x8000: 1}
    assert sg.Index(after).zones("c1") == {1: 1, 0x8000: 2}
    owners = touched(before, after)
    assert {(ck.KIND_PORT, 21), (ck.KIND_PORT, 22)} <= {(o.kind, o.id) for o in owners}
    old = {k: by_owner(s) for k, s in whole_compile(before).items()}
    new = {k: by_owner(s) for k, s in compile_owners(after, owners).items()}
    for key, state in whole_compile(after).items():
        kept = {o: s for o, s in old.get(key, {}).items() if o not in owners and o.on(key) not in owners}
        assert {**kept, **new.get(key, {})} == by_owner(state)


def test_a_group_coming_to_a_node_recompiles_its_clauses_on_that_node_only():
    """db (on c2) joins the default group, which only c1 had: the group's clauses are named on c2
    alone (c1's do not change but for db's new address), and compiling those owners gives the
    whole compile on every node."""
    from fathom.apps import by_owner
    from fathom.apps.secgroups import compile as whole_compile, compile_owners, touched
    before, after = cloud(), cloud(db={"security_groups": (DB, DEFAULT)})
    owners = touched(before, after)
    c2 = SwitchKey(BR_INT, "c2")
    clauses = [o for o in owners if o.kind == ck.KIND_SECURITY_GROUP_CLAUSE]
    scoped = [o for o in clauses if o.switch is not None]
    assert scoped and {o.switch for o in scoped} == {c2}
    new_address = {sg.clause_id(("ingress", (("eth_type", 0x0800), ("ipv4_src", "10.1.0.13"))))}
    assert {o.id for o in clauses if o.switch is None} == new_address
    old = {k: by_owner(s) for k, s in whole_compile(before).items()}
    new = {k: by_owner(s) for k, s in compile_owners(after, owners).items()}
    assert set(new) == {SwitchKey(BR_INT, "c1"), c2}
    for key, state in whole_compile(after).items():
        kept = {o: s for o, s in old.get(key, {}).items() if o not in owners and o.on(key) not in owners}
        assert {**kept, **new.get(key, {})} == by_owner(state), key


# ---------------------------------------------------------------------------------------------- flows


def _group_flows(rules: int, members: int) -> int:
    """Flows on c1 for a group `web` of `rules` ingress TCP rules from members of group `db`, which
    has `members` ports (bound on c2)."""
    ports = [_port(11, "web1", "p", 1, "10.0.0.11", "c1", (WEB,))]
    ports += [_port(100 + i, f"m{i}", "p", 1, f"10.0.{1 + i // 250}.{1 + i % 250}", "c2", (DB,))
              for i in range(members)]
    node = Node(1, "c1", "compute", "198.18.0.1", None, "complete", {"web1": 10})
    snap = Snapshot((node,), (Network(1, "blue", "p", "vxlan", 1001),), (), tuple(ports),
                    security_groups=(SecurityGroup(WEB, "web", "p"), SecurityGroup(DB, "db", "p")),
                    security_group_rules=tuple(SecurityGroupRule(1000 + i, WEB, "ingress", "IPv4", TCP, 1000 + i,
                                                                 1000 + i, remote_group_id=DB)
                                               for i in range(rules)))
    return len(sg.compile_secgroups(snap)["c1"].flows)


def test_flow_count_is_linear_in_rules_plus_members():
    base = _group_flows(10, 10)
    per_rule = (_group_flows(20, 10) - base) / 10
    per_member = (_group_flows(10, 20) - base) / 10
    # no interaction term: doubling both costs the sum of doubling each
    assert _group_flows(20, 20) - base == (per_rule + per_member) * 10
    assert per_rule <= 4 and per_member <= 1
    assert _group_flows(200, 200) == base + per_rule * 190 + per_member * 190 < 200 * 200 / 10


def test_flows_keep_to_the_pipeline_and_carry_their_owner():
    snap = cloud()
    for node, state in sg.compile_secgroups(snap).items():
        assert cat.BR_INT.check(state.flows) == []
        kinds = {ck.parse_cookie(f.cookie)[:2] for f in state.flows}
        assert kinds <= {(ck.APP_SECGROUPS, k) for k in (ck.KIND_PORT, ck.KIND_NODE, ck.KIND_SECURITY_GROUP,
                                                          ck.KIND_SECURITY_GROUP_RULE,
                                                          ck.KIND_SECURITY_GROUP_CLAUSE)}, node
        # a clause flow's owner is a function of its match alone, whichever rules share it
        for f in state.flows:
            if ck.parse_cookie(f.cookie)[1] == ck.KIND_SECURITY_GROUP_CLAUSE:
                assert all(a.clause in (2, 3) for a in f.actions), f


def test_ovs_takes_the_flows_and_prints_them_as_we_do(ovs, tmp_path):  # noqa: F811 - the fixture
    snap = cloud()
    node = next(n for n in snap.nodes if n.name == "c2")
    state = {k.name: s for k, s in compile_all(snap).items() if k.bridge == BR_INT}["c2"]
    target = ovs.bridge("brsg", dict(node.ofports))
    _install(ovs, target, state.flows, state.groups, Path(tmp_path))
    assert _dumped_flows(ovs, target) == sorted(f.to_ofctl() for f in state.flows)


def test_one_clause_s_rules_found_alone_are_those_of_the_whole_index():
    """contributors_of(key) (a few clause owners compiled) = the whole clause index's entry."""
    snap = cloud()
    whole = sg.Index(snap).contributors()
    assert whole
    for key, rules in whole.items():
        assert sorted(sg.Index(snap).contributors_of(key)) == sorted(rules), key
