"""Security groups compiler: groups, rules and ports' memberships -> flows of every node's br-int.

Pure: the same model always gives the same flows. docs/security-groups.md explains the design; in
short, for every local port with port security (its "security-group port") on node N:

- egress-conntrack / ingress-conntrack: the port's IPv4 and IPv6 frames go through the connection
  tracker in the port's own zone (`port_zone`: 1..0x7FFF from its id; the zones from 0x8000 are the
  external app's): `reg11 := zone, ct(zone=reg11[0..15])` for what it sends, `ct_clear, reg9 := port
  id, reg11 := zone, ct(zone=reg11[0..15])` for what is delivered to it. One zone per port, as OVN
  has: a frame between two ports of one node is tracked once on each side.
  IPv6 neighbour discovery (ICMPv6 133..136) skips the tracker and the rules, as in Neutron and OVN.
  So do DHCP answers delivered to a port (udp 67 -> 68), as Neutron always allows them: a port's
  DHCP requests go from the security stage straight to its node's DHCP server (never through the
  egress tables), and no port can send a DHCP answer (the security stage drops it), so what
  arrives as one comes from a DHCP server of the network (fathom's own, or one on a provider
  network's wire).
- egress-acl / ingress-acl, in priority order:
  - 200: invalid -> drop;
  - 190: established or related, and the rule that admitted the connection (its `ct_mark`) is a
    rule of one of the port's groups -> allowed (a conjunctive match: port x mark, per group);
  - 180: a reply of a connection whose rule no longer applies -> drop (removing a rule cuts the
    connections it admitted);
  - 100: the rules of the side's direction, each a conjunctive match of up to three clauses
    (port of the group, remote address, protocol and ports) -> `ct(commit)` with `ct_mark` := rule
    id. New connections end here, and so do established ones whose rule went away: another rule
    that still allows them re-admits them (with its id), as Neutron's firewall does after deleting
    the conntrack entries of a removed rule;
  - anything else: the table drops it.

Flow count per node: ports + rules + distinct remote addresses + port-range masks, never their
product: a remote group's members are one clause flow per address, shared by every rule naming
the group (the conjunction lists every rule on it), as OVN's address sets are.
"""
from __future__ import annotations

import ipaddress
from collections import defaultdict
from dataclasses import dataclass

from fathom.apps.tenant.compiler import refused_ports
from fathom.apps.vtap.filters import range_to_masks
from fathom.model import Node, Port, SecurityGroupRule, Snapshot
from fathom.openflow.spec import (
    Conjunction, Ct, CtClear, FlowSpec, GotoTable, SetField, SwitchState, ct_state,
)
from fathom.pipeline import stages as st

ETH_TYPE = {"IPv4": 0x0800, "IPv6": 0x86DD}
PORT_FIELDS = {6: "tcp_dst", 17: "udp_dst", 132: "sctp_dst"}
ICMP_FIELDS = {1: ("icmpv4_type", "icmpv4_code"), 58: ("icmpv6_type", "icmpv6_code")}

PRIO_CONNTRACK = 100
PRIO_NEIGHBOR_DISCOVERY = 110   # IPv6 ND skips conntrack (as in Neutron and OVN: never filtered)
ND_TYPES = (133, 134, 135, 136)  # router solicitation / advertisement, neighbour solicitation / advertisement
PRIO_DHCP_ANSWER = 110          # DHCP answers delivered to a port skip conntrack (Neutron allows them always)
DHCP_ANSWER = {"eth_type": ETH_TYPE["IPv4"], "ip_proto": 17, "udp_src": 67, "udp_dst": 68}
PRIO_INVALID = 200
PRIO_ALLOWED = 190         # established / related, admitted by a rule that still applies
PRIO_STALE_REPLY = 180     # a reply whose admitting rule no longer applies
PRIO_RULE = 100

# conj_id of "port x admitting rule" per group: above every rule id (rule ids are < 2**31)
ESTABLISHED_CONJ_BASE = 1 << 31

INVALID = ct_state(inv=True, trk=True)
NOT_NEW = ct_state(new=False, trk=True)
NOT_NEW_REPLY = ct_state(new=False, rpl=True, trk=True)


@dataclass(frozen=True)
class Side:
    """One direction of filtering, as seen from the port: what it sends or what it receives."""
    direction: str          # the rules' direction: egress | ingress
    conntrack: int          # table
    acl: int                # table
    next: int               # where an allowed frame goes on
    identity: str           # register holding the port's id in the acl table
    remote: str             # which address the remote side is: dst (egress) or src (ingress)

EGRESS = Side("egress", st.EGRESS_CONNTRACK, st.EGRESS_ACL, st.SFC, st.REG_SRC_PORT, "dst")
INGRESS = Side("ingress", st.INGRESS_CONNTRACK, st.INGRESS_ACL, st.OUTPUT, st.REG_DST_PORT, "src")


def _cookie(kind: int, object_id: int) -> int:
    return st.cookie(st.APP_SECGROUPS, kind, object_id)


def port_cookie(port_id: int) -> int:
    return _cookie(st.KIND_PORT, port_id)


def rule_cookie(rule_id: int) -> int:
    return _cookie(st.KIND_SECURITY_GROUP_RULE, rule_id)


def group_cookie(group_id: int) -> int:
    return _cookie(st.KIND_SECURITY_GROUP, group_id)


def established_conj(group_id: int) -> int:
    return ESTABLISHED_CONJ_BASE | group_id


class _Groups:
    """Look-ups over a snapshot's groups, rules and members (built once per compile)."""

    def __init__(self, snapshot: Snapshot):
        self.groups = {g.id: g for g in snapshot.security_groups}
        self.rules: dict[int, list[SecurityGroupRule]] = defaultdict(list)
        for r in sorted(snapshot.security_group_rules, key=lambda r: r.id):
            if r.group_id in self.groups:
                self.rules[r.group_id].append(r)
        # group id -> ethertype -> sorted member addresses
        members: dict[int, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for p in snapshot.ports:
            for gid in p.security_groups:
                for fip in p.fixed_ips:
                    ip = ipaddress.ip_address(fip.ip_address)
                    members[gid]["IPv4" if ip.version == 4 else "IPv6"].add(str(ip))
        self.members = {g: {e: sorted(a, key=ipaddress.ip_address) for e, a in by.items()}
                        for g, by in members.items()}

    def member_addresses(self, group_id: int, ethertype: str) -> list[str]:
        return self.members.get(group_id, {}).get(ethertype, [])


def security_group_ports(snapshot: Snapshot, node: Node) -> list[tuple[Port, int]]:
    """(port, ofport) of the ports on `node` whose traffic the security groups filter: bound there,
    plugged into its br-int, with port security, and compiled by the tenant app."""
    refused = refused_ports(snapshot)
    networks = {n.id for n in snapshot.networks}
    out = []
    for p in snapshot.ports:
        ofport = node.ofport(p.interface) if p.node == node.name else None
        if ofport is not None and p.port_security and p.network_id in networks and p.id not in refused:
            out.append((p, ofport))
    return sorted(out, key=lambda po: po[0].id)


def compile_secgroups(snapshot: Snapshot) -> dict[str, SwitchState]:
    """Desired security-group flows of every node that has a security-group port (others: none)."""
    groups = _Groups(snapshot)
    out = {}
    for node in snapshot.nodes:
        local = security_group_ports(snapshot, node)
        if local:
            out[node.name] = SwitchState(frozenset(_compile_node(groups, node, local)))
    return out


class _Table:
    """Flows of one table by (priority, match); conjunction clauses of several rules on the same
    match become one flow with all their conjunction actions (OpenFlow holds one flow per match)."""

    def __init__(self, table: int):
        self.table = table
        self.flows: dict[tuple, FlowSpec] = {}
        self.conj: dict[tuple, tuple[set, int]] = {}

    def add(self, priority: int, match: dict, actions: tuple, cookie: int) -> None:
        flow = FlowSpec(self.table, priority, match, actions, cookie)
        self.flows[flow.key] = flow

    def clause(self, priority: int, match: dict, conj: Conjunction, cookie: int) -> None:
        key = (priority, FlowSpec(self.table, priority, match).match)
        actions, owner = self.conj.get(key, (set(), cookie))
        actions.add(conj)
        self.conj[key] = (actions, min(owner, cookie))

    def specs(self) -> set[FlowSpec]:
        out = set(self.flows.values())
        for (priority, match), (actions, cookie) in self.conj.items():
            ordered = tuple(sorted(actions, key=lambda c: (c.id, c.clause)))
            out.add(FlowSpec(self.table, priority, match, ordered, cookie))
        return out


def port_zone(port_id: int) -> int:
    """The conntrack zone of a port's connections: 1..SECGROUP_ZONE_MAX (0x7FFF), from its id.

    Zones from 0x8000 belong to the external app (router gateways, floating IPs), so the two never
    share one. Ports whose ids differ by a multiple of 0x7FFF share a zone; on one node their
    connection entries can then mix only where their 5-tuples coincide."""
    return (port_id - 1) % st.SECGROUP_ZONE_MAX + 1


def _compile_node(groups: _Groups, node: Node, local: list[tuple[Port, int]]) -> set[FlowSpec]:
    flows: set[FlowSpec] = set()
    for side in (EGRESS, INGRESS):
        flows |= _conntrack_flows(side, node, local)
        flows |= _acl_flows(side, groups, node, [p for p, _ in local])
    return flows


def _conntrack_flows(side: Side, node: Node, local: list[tuple[Port, int]]) -> set[FlowSpec]:
    flows = {FlowSpec(side.conntrack, PRIO_NEIGHBOR_DISCOVERY,
                      {"eth_type": ETH_TYPE["IPv6"], "ip_proto": 58, "icmpv6_type": t},
                      (GotoTable(side.next),), _cookie(st.KIND_NODE, node.id))
             for t in ND_TYPES}
    if side is INGRESS:
        flows.add(FlowSpec(side.conntrack, PRIO_DHCP_ANSWER, DHCP_ANSWER, (GotoTable(side.next),),
                           _cookie(st.KIND_NODE, node.id)))
    for port, ofport in local:
        for eth_type in ETH_TYPE.values():
            if side is EGRESS:
                match = {st.REG_SRC_PORT: port.id, "eth_type": eth_type}
                actions = (SetField(st.REG_CT_ZONE, port_zone(port.id)), Ct(zone_field=st.REG_CT_ZONE, table=side.acl))
            else:
                match = {st.REG_OUT_PORT: ofport, "eth_type": eth_type}
                actions = (CtClear(), SetField(st.REG_DST_PORT, port.id), SetField(st.REG_CT_ZONE, port_zone(port.id)),
                           Ct(zone_field=st.REG_CT_ZONE, table=side.acl))
            flows.add(FlowSpec(side.conntrack, PRIO_CONNTRACK, match, actions, port_cookie(port.id)))
    return flows


def _acl_flows(side: Side, groups: _Groups, node: Node, ports: list[Port]) -> set[FlowSpec]:
    table = _Table(side.acl)
    node_cookie = _cookie(st.KIND_NODE, node.id)
    table.add(PRIO_INVALID, {"ct_state": INVALID}, (), node_cookie)
    table.add(PRIO_STALE_REPLY, {"ct_state": NOT_NEW_REPLY}, (), node_cookie)

    here = sorted({g for p in ports for g in p.security_groups if g in groups.groups})
    ports_of = {g: [p for p in ports if g in p.security_groups] for g in here}

    # established / related: allowed while the admitting rule (ct_mark) is a rule of a group of the port
    for gid in here:
        rules = groups.rules.get(gid, [])
        if not rules:
            continue
        conj = established_conj(gid)
        for p in ports_of[gid]:
            table.clause(PRIO_ALLOWED, {side.identity: p.id}, Conjunction(conj, 1, 2), port_cookie(p.id))
        for r in rules:
            table.clause(PRIO_ALLOWED, {"ct_state": NOT_NEW, "ct_mark": r.id}, Conjunction(conj, 2, 2),
                         rule_cookie(r.id))
        table.add(PRIO_ALLOWED, {"conj_id": conj}, (GotoTable(side.next),), group_cookie(gid))

    # new connections (and established ones whose rule is gone): the rules of this direction
    for gid in here:
        for r in groups.rules.get(gid, []):
            if r.direction != side.direction:
                continue
            remote = _remote_matches(side, groups, r)
            if not remote:
                continue    # a remote group with no member of this ethertype: the rule matches nothing
            l4 = _protocol_matches(r)
            n = 3 if l4 else 2
            c = rule_cookie(r.id)
            for p in ports_of[gid]:
                table.clause(PRIO_RULE, {side.identity: p.id}, Conjunction(r.id, 1, n), port_cookie(p.id))
            for match in remote:
                table.clause(PRIO_RULE, match, Conjunction(r.id, 2, n), c)
            for match in l4:
                table.clause(PRIO_RULE, match, Conjunction(r.id, 3, n), c)
            commit = Ct(zone_field=st.REG_CT_ZONE, commit=True, exec=(SetField("ct_mark", r.id),))
            table.add(PRIO_RULE, {"conj_id": r.id, "eth_type": ETH_TYPE[r.ethertype]},
                      (commit, GotoTable(side.next)), c)
    return table.specs()


def _address_field(side: Side, ethertype: str) -> str:
    return f"{'ipv4' if ethertype == 'IPv4' else 'ipv6'}_{side.remote}"


def _remote_matches(side: Side, groups: _Groups, r: SecurityGroupRule) -> list[dict]:
    """Clause 2 of a rule: the remote addresses (one match per member address or the prefix)."""
    eth = {"eth_type": ETH_TYPE[r.ethertype]}
    field = _address_field(side, r.ethertype)
    if r.remote_group_id is not None:
        return [{**eth, field: ip} for ip in groups.member_addresses(r.remote_group_id, r.ethertype)]
    if r.remote_prefix is None:
        return [eth]
    net = ipaddress.ip_network(r.remote_prefix, strict=False)
    if net.prefixlen == 0:
        return [eth]
    if net.prefixlen == net.max_prefixlen:
        return [{**eth, field: str(net.network_address)}]
    return [{**eth, field: (str(net.network_address), str(net.netmask))}]


def _protocol_matches(r: SecurityGroupRule) -> list[dict]:
    """Clause 3 of a rule (none when the rule is for any protocol): protocol, then destination
    ports (a range as its fewest masked matches) or ICMP type and code."""
    if r.protocol is None:
        return []
    base = {"eth_type": ETH_TYPE[r.ethertype], "ip_proto": r.protocol}
    if r.protocol in PORT_FIELDS and r.port_min is not None:
        field = PORT_FIELDS[r.protocol]
        high = r.port_max if r.port_max is not None else r.port_min
        return [{**base, field: value if mask == 0xFFFF else (value, mask)}
                for value, mask in range_to_masks(r.port_min, high)]
    if r.protocol in ICMP_FIELDS and r.port_min is not None:
        type_field, code_field = ICMP_FIELDS[r.protocol]
        match = {**base, type_field: r.port_min}
        if r.port_max is not None:
            match[code_field] = r.port_max
        return [match]
    return [base]
