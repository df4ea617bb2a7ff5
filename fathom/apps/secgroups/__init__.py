"""Security groups: stateful filtering (OVS conntrack) of what every port with port security sends
and receives, with Neutron's semantics; docs/security-groups.md.

Incremental: every flow has one owner that its match alone decides (a port, a rule, a group, a
node, or a clause shared by rules: `KIND_SECURITY_GROUP_CLAUSE`, a digest of its match), so a
change touches:
- a port whose binding, plug, port security, network, groups or addresses changed: the port (its
  conntrack flows and its clause of each rule); the addresses it brings to or takes from a group, in
  the remote clauses of the rules naming that group (one clause flow per address, as OVN's address
  sets); a group it brings to or takes from a node: that group, its rules and their clauses on
  that node (the clauses on other nodes do not change: the owners named with their switch);
- a network whose conntrack zone on a node changed (`network_zones`: only when a network folding
  onto the same zone came or went): its ports' conntrack flows there;
- a rule added, removed or changed (or one whose remote group gains its first or loses its last
  member of the rule's ethertype): the rule, its group, the group's ports and the rule's clauses;
- a group added or removed: the group and its ports;
- flow-records rates (fathom.model.flow_records): the ports whose rates changed, and the rules of
  the groups whose project's admit rate changed.
A change of the nodes themselves is not handled (the app is compiled whole).
"""
from __future__ import annotations

from collections import defaultdict

from fathom.apps.base import BR_INT, App, Owner, OwnerOn, Reads, SwitchKey
from fathom.apps.incremental import per_model
from fathom.apps.secgroups.compiler import (
    EGRESS, ETH_TYPE, INGRESS, _address_field, _key, clause_id, compile_secgroups, index,
)
from fathom.pipeline import cookies as ck
from fathom.pipeline.cookies import APP_SECGROUPS


def compile(model, views=None) -> dict:
    return {SwitchKey(BR_INT, node): state for node, state in compile_secgroups(model, views=views).items()}


def compile_owners(model, owners, views=None) -> dict:
    only = frozenset((o.kind, o.id, o.switch.name) if o.switch is not None else (o.kind, o.id)
                     for o in owners if o.app == APP_SECGROUPS)
    if not only:
        return {}
    return {SwitchKey(BR_INT, node): state for node, state in compile_secgroups(model, only, views).items()}


def _owner(kind: int, obj: int) -> Owner:
    return Owner(APP_SECGROUPS, kind, obj)


def touched(before, after, views=None):
    b, a = index(before, views), index(after, views)
    if {n.id: n.name for n in before.nodes} != {n.id: n.name for n in after.nodes}:
        return "nodes changed"
    owners: set[Owner | OwnerOn] = set()
    changed: set[int] = set()      # rules whose flows may differ everywhere (their ports' clauses too)
    moved: dict[int, set[str]] = defaultdict(set)   # rules whose group came to or left these nodes
    groups = set(b.groups) ^ set(a.groups)
    changed |= {rid for rid in set(b.rule_by_id) | set(a.rule_by_id) if b.rule_by_id.get(rid) != a.rule_by_id.get(rid)}
    # a group's members (by ethertype): a new or gone address is a clause flow of each rule naming
    # the group; the first or last member makes the rule match something or nothing
    for gid in set(b.member_sets) | set(a.member_sets):
        mb, ma = b.member_sets.get(gid, {}), a.member_sets.get(gid, {})
        if mb == ma:
            continue
        for eth in set(mb) | set(ma):
            old, new = mb.get(eth, frozenset()), ma.get(eth, frozenset())
            if old == new:
                continue
            for idx in (b, a):
                for r in idx.referrers.get(gid, ()):
                    if r.ethertype != eth:
                        continue
                    if bool(old) != bool(new):
                        changed.add(r.id)
                        continue
                    field = _address_field(EGRESS if r.direction == EGRESS.direction else INGRESS, eth)
                    for ip in old ^ new:
                        key = _key(r.direction, {"eth_type": ETH_TYPE[eth], field: ip})
                        owners.add(_owner(ck.KIND_SECURITY_GROUP_CLAUSE, clause_id(key)))
    # the ports whose views may differ: those the delta names, else every one
    delta = views.delta_from(before, after) if views is not None else None
    for pid in (delta.ports if delta is not None else set(b.views) | set(a.views)):
        if b.views.get(pid) != a.views.get(pid):
            owners.add(_owner(ck.KIND_PORT, pid))
    # a network whose zone on a node changed (another network folding onto it came or went): the
    # conntrack flows of its ports there
    for name in set(b.local) | set(a.local):
        zb, za = b.zones(name), a.zones(name)
        if zb is za or zb == za:
            continue
        moved_nets = {n for n in set(zb) | set(za) if zb.get(n) != za.get(n)}
        for idx in (b, a):
            owners.update(_owner(ck.KIND_PORT, p.id) for p, _ in idx.local.get(name, ()) if p.network_id in moved_nets)
    nodes = {n.name: n.id for n in after.nodes}
    for name in set(b.here) | set(a.here):
        came = b.here.get(name, set()) ^ a.here.get(name, set())
        for idx in (b, a):
            for gid in came:
                for r in idx.rules.get(gid, ()):
                    moved[r.id].add(name)
                owners.add(_owner(ck.KIND_SECURITY_GROUP, gid))
        if bool(b.local.get(name)) != bool(a.local.get(name)):
            owners.add(_owner(ck.KIND_NODE, nodes[name]))
    if before.flow_sampling != after.flow_sampling:
        owners |= _sampling_touched(b, a)
    for rid in changed:
        for idx in (b, a):
            r = idx.rule_by_id.get(rid)
            if r is not None:
                groups.add(r.group_id)
    for gid in groups:
        owners.add(_owner(ck.KIND_SECURITY_GROUP, gid))
        for idx in (b, a):
            owners.update(_owner(ck.KIND_PORT, pid) for pid in idx.group_ports.get(gid, ()))
    for rid in changed | set(moved):
        owners.add(_owner(ck.KIND_SECURITY_GROUP_RULE, rid))
        for idx in (b, a):
            r = idx.rule_by_id.get(rid)
            if r is None:
                continue
            owners.add(_owner(ck.KIND_SECURITY_GROUP, r.group_id))
            ids = {clause_id(k) for k in idx.clause_keys(r)}
            if rid in changed:
                owners.update(_owner(ck.KIND_SECURITY_GROUP_CLAUSE, i) for i in ids)
            else:   # its clauses elsewhere are the same: on the nodes its group came to or left only
                switches = [SwitchKey(BR_INT, name) for name in moved[rid]]
                owners.update(_owner(ck.KIND_SECURITY_GROUP_CLAUSE, i).on(key) for i in ids for key in switches)
    return owners


def _sampling_touched(b, a) -> set[Owner]:
    """The owners whose sample actions a change of the flow-records rates moves: the ports whose
    rates changed (their port-ingress and default-drop samples) and the rules of the groups whose
    project's admit rate changed (their commit flows)."""
    owners = set()
    for idx in (b, a):
        for local in idx.local.values():
            for p, _ in local:
                if b.sampling.of_port(p.id, p.project_id) != a.sampling.of_port(p.id, p.project_id):
                    owners.add(_owner(ck.KIND_PORT, p.id))
        for gid, g in idx.groups.items():
            if b.sampling.admit(g.project_id) != a.sampling.admit(g.project_id):
                owners.update(_owner(ck.KIND_SECURITY_GROUP_RULE, r.id) for r in idx.rules.get(gid, ()))
    return owners


# What `compile` reads (checked). `touched` is written by hand: a port's addresses are clause flows
# of the rules naming its groups, a group coming to a node touches its rules' clauses there only,
# and a network's conntrack zone follows the other networks on the node; the declaration (an
# object's own owner, or owners naming it) cannot say these.
READS = Reads({
    "nodes": frozenset({"id", "name", "ofports"}),
    "networks": frozenset({"id"}),
    "ports": frozenset({"id", "project_id", "network_id", "fixed_ips", "node", "interface", "port_security",
                        "security_groups", "ofport"}),
    "security_groups": frozenset({"id", "project_id"}),
    "flow_sampling": frozenset({"project_id", "port_id", "ingress", "admit", "drop"}),
    "security_group_rules": frozenset({"id", "group_id", "direction", "ethertype", "protocol", "port_min", "port_max",
                                       "remote_prefix", "remote_group_id"}),
})


def reach(model, write) -> frozenset:
    """The nodes a port's write may change the groups' flows on: its own, and those of the ports
    in a group with a rule that names a remote group (a port's addresses are clauses of the rules
    naming its groups; which groups a new or updated port is in, the model before it cannot say)."""
    return frozenset(write.nodes | _referring_nodes(model))


@per_model
def _referring_nodes(model) -> set:
    """The nodes of the ports in a group with a rule that names a remote group."""
    referring = {r.group_id for r in model.security_group_rules if r.remote_group_id is not None}
    return {p.node for p in model.ports if p.node is not None and not referring.isdisjoint(p.security_groups)}


APP = App("secgroups", APP_SECGROUPS,
          {BR_INT: ("egress-conntrack", "egress-acl", "ingress-conntrack", "ingress-acl")}, compile,
          touched=touched, compile_owners=compile_owners, reads=READS, reach=reach)
