"""Security groups compiler: groups, rules and ports' memberships -> flows of every node's br-int.

Pure: the same model always gives the same flows. docs/security-groups.md explains the design; in
short, for every local port with port security (its "security-group port") on node N:

- egress-conntrack / ingress-conntrack: the port's IPv4 and IPv6 frames go through the connection
  tracker in the zone of the port's network on N (`network_zones`: 1..0x7FFF, from the network id,
  distinct per node; the zones from 0x8000 are the external app's): `reg11 := zone,
  ct(zone=reg11[0..15])` for what it sends; for what is delivered to it, `reg9 := port id` and, if
  its sender's egress already tracked the frame in that zone in this pass (`ct_state=+trk,
  ct_zone=zone`, or `reg11 = zone | COMMITTED` once egress-acl committed it), straight to
  ingress-acl, else `ct_clear, reg11 := zone, ct(zone=reg11[0..15])`. One zone per network, as
  Neutron's OVS firewall has: a frame between two ports of one network on one node is looked up once
  and its connection is one entry, holding both sides' admitting rules.
  IPv6 neighbour discovery (ICMPv6 133..136) skips the tracker and the rules, as in Neutron and OVN.
  So do DHCP answers delivered to a port (udp 67 -> 68), as Neutron always allows them: a port's
  DHCP requests go from the security stage straight to its node's DHCP server (never through the
  egress tables), and no port can send a DHCP answer (the security stage drops it), so what
  arrives as one comes from a DHCP server of the network (fathom's own, or one on a provider
  network's wire).
- egress-acl / ingress-acl, in priority order:
  - 200: invalid -> drop;
  - 190: established or related, and the rule that admitted the connection on this side is a rule
    of one of the port's groups -> allowed (a conjunctive match: port x admitting rule, per group).
    The originator's egress rule is in `ct_mark`, the responder's ingress rule in `ct_label`: a
    side reads its own direction's field on packets of the original direction and the other field
    on replies (`RULE_FIELD`);
  - 180: a reply of a connection whose rule no longer applies -> drop (removing a rule cuts the
    connections it admitted);
  - 100: the rules of the side's direction, each a conjunctive match of up to three clauses
    (port of the group, remote address, protocol and ports) -> `ct(commit)` with the side's field
    := rule id (egress also sets `reg11`'s COMMITTED bit). New connections end here, and so do
    established ones whose rule went away: another rule that still allows them re-admits them
    (with its id), as Neutron's firewall does after deleting the conntrack entries of a removed
    rule. A frame egress-acl committed in this pass reaches ingress-acl untracked (OVS clears the
    ct fields after a commit), so it skips 200..180 and is judged by the receiver's rules, whose
    commit writes `ct_label` on the same entry;
  - anything else: the table drops it.

Flow count per node: ports + rules + distinct remote addresses + port-range masks, never their
product: a remote group's members are one clause flow per address, shared by every rule naming
the group (the conjunction lists every rule on it), as OVN's address sets are.
"""
from __future__ import annotations

import functools
import hashlib
import ipaddress
from collections import OrderedDict, defaultdict
from dataclasses import dataclass

from fathom.pipeline.infrastructure import refused_ports
from fathom.openflow.masks import range_to_masks
from fathom.model import Node, Port, SecurityGroupRule, Snapshot
from fathom.model import flow_records as fr
from fathom.model.views import Views, get
from fathom.openflow.spec import (
    Conjunction, Ct, CtClear, FlowSpec, GotoTable, LoadReg, Sample, SetField, SwitchState, ct_state,
)
from fathom.pipeline import stages as st
from fathom.pipeline.sampling import sample

ETH_TYPE = {"IPv4": 0x0800, "IPv6": 0x86DD}
PORT_FIELDS = {6: "tcp_dst", 17: "udp_dst", 132: "sctp_dst"}
ICMP_FIELDS = {1: ("icmpv4_type", "icmpv4_code"), 58: ("icmpv6_type", "icmpv6_code")}

PRIO_CONNTRACK = 100
PRIO_TRACKED = 105              # ingress: a frame its sender's egress already tracked in the port's zone
PRIO_NEIGHBOR_DISCOVERY = 110   # IPv6 ND skips conntrack (as in Neutron and OVN: never filtered)
ND_TYPES = (133, 134, 135, 136)  # router solicitation / advertisement, neighbour solicitation / advertisement
PRIO_DHCP_ANSWER = 110          # DHCP answers delivered to a port skip conntrack (Neutron allows them always)
DHCP_ANSWER = {"eth_type": ETH_TYPE["IPv4"], "ip_proto": 17, "udp_src": 67, "udp_dst": 68}
PRIO_INVALID = 200
PRIO_ALLOWED = 190         # established / related, admitted by a rule that still applies
PRIO_STALE_REPLY = 180     # a reply whose admitting rule no longer applies
PRIO_RULE = 100
PRIO_DEFAULT_DROP = 1      # flow records: a port's frames no rule admitted, sampled, then dropped

# conj_id of "port x admitting rule" per group: above every rule id (rule ids are < 2**31)
ESTABLISHED_CONJ_BASE = 1 << 31

INVALID = ct_state(inv=True, trk=True)
NOT_NEW_ORIGINAL = ct_state(new=False, rpl=False, trk=True)
NOT_NEW_REPLY = ct_state(new=False, rpl=True, trk=True)
TRACKED = ct_state(trk=True)
UNTRACKED = ct_state(trk=False)

# Which field of a connection's entry holds the rule that admitted it on each side: the
# originator's egress rule in ct_mark, the responder's ingress rule in ct_label (one entry, both
# sides, when both ports are in one zone on one node).
RULE_FIELD = {"egress": "ct_mark", "ingress": "ct_label"}
# reg11 bit 16: egress-acl committed the frame's connection in zone reg11[0..15] in this pass (the
# commit leaves the packet untracked for the rest of the pass, so ct_state cannot say so)
COMMITTED = 1 << 16


@dataclass(frozen=True)
class Side:
    """One direction of filtering, as seen from the port: what it sends or what it receives."""
    direction: str          # the rules' direction: egress | ingress
    conntrack: int          # table
    acl: int                # table
    next: int               # where an allowed frame goes on
    identity: str           # register holding the port's id in the acl table
    remote: str             # which address the remote side is: dst (egress) or src (ingress)
    admitted: int           # flow records: the observation point kinds of a rule's admission
    dropped: int            # and of the port's default drop (fathom.model.flow_records)

EGRESS = Side("egress", st.EGRESS_CONNTRACK, st.EGRESS_ACL, st.SFC, st.REG_SRC_PORT, "dst",
              fr.ADMIT_EGRESS, fr.DROP_EGRESS)
INGRESS = Side("ingress", st.INGRESS_CONNTRACK, st.INGRESS_ACL, st.OUTPUT, st.REG_DST_PORT, "src",
               fr.ADMIT_INGRESS, fr.DROP_INGRESS)


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


def clause_cookie(key: tuple) -> int:
    return _cookie(st.KIND_SECURITY_GROUP_CLAUSE, clause_id(key))


# clause owner id -> the clause keys seen with it (most recent last), so compiling a few clause
# owners needs no pass over every rule and member; bounded: a key not found here is looked for in
# the snapshot's full clause index
_KEYS: "OrderedDict[int, set[tuple]]" = OrderedDict()
_KEYS_MAX = 1 << 18


def clause_id(key: tuple) -> int:
    """The owner id of a clause flow (48 bits): a digest of (direction, match), stable across
    restarts. Two clauses whose digests collide share an owner, which only means they are compiled
    together."""
    i = _clause_id(key)
    keys = _KEYS.get(i)
    if keys is None:
        keys = _KEYS[i] = set()
        if len(_KEYS) > _KEYS_MAX:
            _KEYS.popitem(last=False)
    keys.add(key)
    return i


@functools.lru_cache(maxsize=1 << 16)
def _clause_id(key: tuple) -> int:
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=6).digest(), "big")


@functools.lru_cache(maxsize=1 << 16)
def _address(text: str) -> tuple[str, str, object]:
    """(ethertype, canonical text, sort key) of an address."""
    ip = ipaddress.ip_address(text)
    return ("IPv4" if ip.version == 4 else "IPv6"), str(ip), ip


def _key(direction: str, match: dict) -> tuple:
    return (direction, tuple(sorted(match.items())))


def _port_view(p: Port, ofport: int | None, eligible: bool) -> tuple:
    return (p.node, p.interface, ofport, eligible, p.network_id, p.security_groups, p.fixed_ips)


class Index:
    """Look-ups over one snapshot's groups, rules, members and security-group ports, built once
    per snapshot (`index`) and shared by the full compile, the per-owner compile and `touched`."""

    def __init__(self, snapshot: Snapshot, views: Views | None = None):
        self.nodes = {n.name: n for n in snapshot.nodes}
        self.groups = {g.id: g for g in snapshot.security_groups}
        self.rules: dict[int, list[SecurityGroupRule]] = defaultdict(list)
        self.rule_by_id: dict[int, SecurityGroupRule] = {}
        self.referrers: dict[int, list[SecurityGroupRule]] = defaultdict(list)   # remote group -> rules
        for r in sorted(snapshot.security_group_rules, key=lambda r: r.id):
            if r.group_id in self.groups:
                self.rules[r.group_id].append(r)
                self.rule_by_id[r.id] = r
                if r.remote_group_id is not None:
                    self.referrers[r.remote_group_id].append(r)
        # group id -> ethertype -> member address -> how many ports hold it; group id -> member port ids
        self.member_counts: dict[int, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))
        self.group_ports: dict[int, set[int]] = defaultdict(set)
        for p in snapshot.ports:
            for gid in p.security_groups:
                self.group_ports[gid].add(p.id)
                for fip in p.fixed_ips:
                    eth, text, _ = _address(fip.ip_address)
                    held = self.member_counts[gid][eth]
                    held[text] = held.get(text, 0) + 1
        self.member_sets = {g: {e: frozenset(a) for e, a in by.items()} for g, by in self.member_counts.items()}
        self._sorted_members: dict[tuple[int, str], list[str]] = {}
        # security-group ports: node name -> [(port, ofport)] by port id; port id -> its view
        refused = refused_ports(snapshot, views)
        networks = {n.id for n in snapshot.networks}
        self.local: dict[str, list[tuple[Port, int]]] = defaultdict(list)
        self.ports: dict[int, Port] = {}
        self.views: dict[int, tuple] = {}
        for p in sorted(snapshot.ports, key=lambda p: p.id):
            ofport = self._add_port(p, refused, networks)
            if ofport is not None:
                self.local[p.node].append((p, ofport))
        # node name -> groups of its security-group ports; group id -> nodes where it is
        self.here: dict[str, set[int]] = {}
        for name, local in self.local.items():
            self.here[name] = self._groups_of(local)
        self.where = self._where()
        self._matches: dict[int, tuple[list[dict], list[dict]]] = {}
        self._protocols: dict[int, list[dict]] = {}
        self._clauses: dict[tuple, list[tuple[int, int, int]]] | None = None
        self._by_clause_id: dict[int, list[tuple]] | None = None
        self._static: dict[tuple, list] | None = None
        self._zones: dict[str, dict[int, int | None]] = {}
        self.sampling = fr.SamplingIndex(snapshot.flow_sampling)

    def _add_port(self, p: Port, refused: dict, networks: set) -> int | None:
        """Note `p` (its view); its OpenFlow port number if it is a security-group port here."""
        node = self.nodes.get(p.node)
        ofport = node.ofport(p.interface) if node is not None else None
        eligible = ofport is not None and p.port_security and p.network_id in networks and p.id not in refused
        self.ports[p.id] = p
        self.views[p.id] = _port_view(p, ofport, eligible)
        return ofport if eligible else None

    def _groups_of(self, local: list) -> set[int]:
        return {g for p, _ in local for g in p.security_groups if g in self.groups}

    def _where(self) -> dict[int, set[str]]:
        where: dict[int, set[str]] = defaultdict(set)
        for name, groups in self.here.items():
            for g in groups:
                where[g].add(name)
        return where

    @classmethod
    def patched(cls, old: "Index", snapshot: Snapshot, delta, views: Views) -> "Index | None":
        """`old` (the snapshot before's) with the changed ports and nodes of `delta`; None when a
        group, a rule or a network changed. What `old` holds is shared, not changed: a group's
        members, a node's ports and the caches that depend on them are made again where the
        change reaches them."""
        if delta.fields & {"security_groups", "security_group_rules", "networks"}:
            return None
        idx = cls.__new__(cls)
        idx.__dict__.update(old.__dict__)
        idx.nodes = {n.name: n for n in snapshot.nodes}
        idx.sampling = fr.SamplingIndex(snapshot.flow_sampling)
        idx.ports, idx.views = dict(old.ports), dict(old.views)
        idx.group_ports = defaultdict(set, old.group_ports)
        idx.member_counts = defaultdict(lambda: defaultdict(dict), old.member_counts)
        # the groups whose ports and the (group, ethertype) whose members changed: copied once
        # each, the old index's are not changed
        regrouped: set[int] = set()
        members: set[tuple[int, str]] = set()
        nodes: set[str] = set()                   # nodes whose security-group ports changed
        refused, networks = refused_ports(snapshot, views), {n.id for n in snapshot.networks}
        added: dict[str, list] = defaultdict(list)
        for port_id in delta.ports:
            p = idx.ports.pop(port_id, None)
            view = idx.views.pop(port_id, None)
            if view is not None and view[3]:
                nodes.add(view[0])
            steps = [(p, -1)] if p is not None else []
            p = delta.after.get(port_id)
            if p is not None:
                steps.append((p, 1))
                ofport = idx._add_port(p, refused, networks)
                if ofport is not None:
                    nodes.add(p.node)
                    added[p.node].append((p, ofport))
            for q, step in steps:
                for gid in q.security_groups:
                    if gid not in regrouped:
                        idx.group_ports[gid] = set(idx.group_ports.get(gid, ()))
                        regrouped.add(gid)
                    if step > 0:
                        idx.group_ports[gid].add(q.id)
                    else:
                        idx.group_ports[gid].discard(q.id)
                    for fip in q.fixed_ips:
                        eth, text, _ = _address(fip.ip_address)
                        if (gid, eth) not in members:
                            by = idx.member_counts[gid] = defaultdict(dict, idx.member_counts.get(gid, {}))
                            by[eth] = dict(by.get(eth, {}))
                            members.add((gid, eth))
                        held = idx.member_counts[gid][eth]
                        held[text] = held.get(text, 0) + step
                        if not held[text]:
                            del held[text]
        for gid in regrouped:
            if not idx.group_ports[gid]:
                del idx.group_ports[gid]
        idx.member_sets = dict(old.member_sets)
        for gid, eth in members:
            by = idx.member_counts[gid]
            if not by[eth]:
                del by[eth]
            if not by:
                del idx.member_counts[gid]
            idx.member_sets[gid] = {e: frozenset(a) for e, a in by.items()}
            if not idx.member_sets[gid]:
                del idx.member_sets[gid]
        idx.local, idx.here = defaultdict(list, old.local), dict(old.here)
        for name in nodes:
            local = [x for x in idx.local.get(name, ()) if x[0].id not in delta.ports] + added.get(name, [])
            local.sort(key=lambda x: x[0].id)
            idx.local.pop(name, None)
            idx.here.pop(name, None)
            if local:
                idx.local[name], idx.here[name] = local, idx._groups_of(local)
        idx.where = idx._where()
        idx._zones = {n: z for n, z in old._zones.items() if n not in nodes}
        idx._sorted_members = {k: v for k, v in old._sorted_members.items() if k not in members}
        changed = {g for g, _ in members}
        idx._matches = {rid: m for rid, m in old._matches.items() if idx.rule_by_id[rid].remote_group_id not in changed}
        idx._protocols = dict(old._protocols)
        if members:
            idx._clauses = idx._by_clause_id = idx._static = None
        return idx

    def zones(self, node: str) -> dict[int, int | None]:
        """network id -> conntrack zone on `node`, for the networks of its security-group ports (see
        `network_zones`)."""
        if node not in self._zones:
            self._zones[node] = network_zones({p.network_id for p, _ in self.local.get(node, ())})
        return self._zones[node]

    def member_addresses(self, group_id: int, ethertype: str) -> list[str]:
        key = (group_id, ethertype)
        if key not in self._sorted_members:
            self._sorted_members[key] = sorted(self.member_sets.get(group_id, {}).get(ethertype, ()),
                                               key=lambda a: _address(a)[2])
        return self._sorted_members[key]

    def matches(self, r: SecurityGroupRule) -> tuple[list[dict], list[dict]]:
        """(remote clauses, protocol clauses) of a rule; no remote clause: the rule matches nothing."""
        if r.id not in self._matches:
            side = EGRESS if r.direction == EGRESS.direction else INGRESS
            self._matches[r.id] = (_remote_matches(side, self, r), self.protocols(r))
        return self._matches[r.id]

    def protocols(self, r: SecurityGroupRule) -> list[dict]:
        """A rule's protocol clauses alone (without listing a remote group's members)."""
        if r.id not in self._protocols:
            self._protocols[r.id] = _protocol_matches(r)
        return self._protocols[r.id]

    def active(self, r: SecurityGroupRule) -> bool:
        """Whether the rule matches anything: a remote group's rule while the group has a member
        of its ethertype (told without listing them: a port's flows ask it of every rule)."""
        if r.remote_group_id is not None:
            return bool(self.member_sets.get(r.remote_group_id, {}).get(r.ethertype))
        return bool(self.matches(r)[0])

    def clause_keys(self, r: SecurityGroupRule) -> list[tuple]:
        remote, l4 = self.matches(r)
        if not remote:
            return []
        return [_key(r.direction, m) for m in (*remote, *l4)]

    def contributors(self) -> dict[tuple, list[tuple[int, int, int]]]:
        """clause key -> (rule id, clause number, clauses) of every active rule using it."""
        if self._clauses is None:
            out: dict[tuple, list] = defaultdict(list)
            for r in self.rule_by_id.values():
                remote, l4 = self.matches(r)
                if not remote:
                    continue
                n = 3 if l4 else 2
                for m in remote:
                    out[_key(r.direction, m)].append((r.id, 2, n))
                for m in l4:
                    out[_key(r.direction, m)].append((r.id, 3, n))
            self._clauses = out
        return self._clauses

    def contributors_of(self, key: tuple) -> list[tuple[int, int, int]]:
        """(rule id, clause number, clauses) of every active rule using one clause key, without
        the whole index: the rules whose own clauses (prefix, protocol) are this key, and for an
        address, the rules naming a group the address is a member of."""
        if self._clauses is not None:
            return self._clauses.get(key, [])
        if self._static is None:
            static: dict[tuple, list] = defaultdict(list)
            for r in self.rule_by_id.values():
                if r.remote_group_id is None:
                    remote, l4 = self.matches(r)
                elif self.member_sets.get(r.remote_group_id, {}).get(r.ethertype):
                    remote, l4 = None, self.protocols(r)   # its members: looked up by address
                else:
                    continue
                if remote == []:
                    continue
                n = 3 if l4 else 2
                for m in remote or ():
                    static[_key(r.direction, m)].append((r.id, 2, n))
                for m in l4:
                    static[_key(r.direction, m)].append((r.id, 3, n))
            self._static = static
        out = list(self._static.get(key, ()))
        direction, match = key
        fields = [(f, v) for f, v in match if f.startswith(("ipv4_", "ipv6_")) and isinstance(v, str)]
        if len(match) == 2 and len(fields) == 1:
            field, addr = fields[0]
            eth = "IPv4" if field.startswith("ipv4") else "IPv6"
            side = EGRESS if direction == EGRESS.direction else INGRESS
            if field == _address_field(side, eth):
                for gid, by in self.member_sets.items():
                    if addr not in by.get(eth, ()):
                        continue
                    for r in self.referrers.get(gid, ()):
                        if r.ethertype == eth and r.direction == direction:
                            l4 = self.protocols(r)
                            out.append((r.id, 2, 3 if l4 else 2))
        return out

    def clause_keys_of(self, ids) -> dict[int, list[tuple]]:
        """Owner id -> its clause keys, for the ids in `ids`."""
        known = {i: _KEYS.get(i) for i in ids}
        if all(k is not None for k in known.values()):
            return {i: list(k) for i, k in known.items()}
        if self._by_clause_id is None:
            by: dict[int, list[tuple]] = defaultdict(list)
            for key in self.contributors():
                by[clause_id(key)].append(key)
            self._by_clause_id = by
        return {i: self._by_clause_id.get(i, []) for i in ids}


def index(snapshot: Snapshot, views: Views | None = None) -> Index:
    """The Index of `snapshot`, once per snapshot; patched for a change of ports and nodes only."""
    return get(views, snapshot, "secgroups_index", Index, Index.patched)


def security_group_ports(snapshot: Snapshot, node: Node, views: Views | None = None) -> list[tuple[Port, int]]:
    """(port, ofport) of the ports on `node` whose traffic the security groups filter: bound there,
    plugged into its br-int, with port security, and compiled by the tenant app."""
    return list(index(snapshot, views).local.get(node.name, ()))


def compile_secgroups(snapshot: Snapshot, only: frozenset | None = None,
                      views: Views | None = None) -> dict[str, SwitchState]:
    """Desired security-group flows of every node that has a security-group port (others: none);
    with `only` ((kind, object id) of this app's owners), exactly the flows of those owners."""
    idx = index(snapshot, views)
    if only is None:
        return {name: SwitchState(frozenset(_node_flows(idx, idx.nodes[name], local)))
                for name, local in idx.local.items() if local}
    return _owner_flows(idx, only)


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
        key = (priority, tuple(sorted(match.items())))
        actions, owner = self.conj.get(key, (set(), cookie))
        actions.add(conj)
        self.conj[key] = (actions, owner)

    def specs(self) -> set[FlowSpec]:
        out = set(self.flows.values())
        for (priority, match), (actions, cookie) in self.conj.items():
            ordered = tuple(sorted(actions, key=lambda c: (c.id, c.clause)))
            out.add(FlowSpec(self.table, priority, match, ordered, cookie))
        return out


def network_zones(networks: set[int]) -> dict[int, int | None]:
    """The conntrack zones of the networks of one node's security-group ports: network id -> zone in
    1..SECGROUP_ZONE_MAX (0x7FFF), distinct on the node.

    A network takes its id folded into that range; in id order, one whose fold an earlier network
    already took takes the next free zone. So the zone of a network never changes while no other
    network of the node folds onto it (ids 0x7FFF apart), a new network (the highest id) never moves
    an existing one, and two networks never share a zone on a node. Zones from 0x8000 belong to the
    external app (router gateways, floating IPs). A node with more networks than zones gives the
    last ones none (None: their ports get conntrack flows that drop everything)."""
    zones: dict[int, int | None] = {}
    taken: set[int] = set()
    for nid in sorted(networks):
        if len(taken) == st.SECGROUP_ZONE_MAX:
            zones[nid] = None
            continue
        zone = (nid - 1) % st.SECGROUP_ZONE_MAX + 1
        while zone in taken:
            zone = zone % st.SECGROUP_ZONE_MAX + 1
        zones[nid] = zone
        taken.add(zone)
    return zones


def _node_flows(idx: Index, node: Node, local: list[tuple[Port, int]]) -> set[FlowSpec]:
    """Every security-group flow of one node."""
    here = sorted(idx.here.get(node.name, ()))
    idx.contributors()      # every clause of every rule: built once for all nodes
    flows: set[FlowSpec] = set()
    for side in (EGRESS, INGRESS):
        table = _Table(side.acl)
        flows |= _node_fixed(side, node, table)
        for port, ofport in local:
            flows |= _port_flows(side, idx, node, port, ofport, table)
        keys = set()
        for gid in here:
            _group_flows(side, idx, gid, table)
            for r in idx.rules.get(gid, ()):
                _rule_flows(side, idx, r, table)
                if r.direction == side.direction:
                    keys.update(idx.clause_keys(r))
        for key in keys:
            _clause_flow(side, idx, node, key, table)
        flows |= table.specs()
    return flows


def _owner_flows(idx: Index, only: frozenset) -> dict[str, SwitchState]:
    """The flows of exactly the owners `only` ((kind, object id) on every node, or (kind, object
    id, node name) on that node) on every node."""
    want: dict[str, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))   # node -> kind -> ids
    clause_ids = set()
    clauses_on: dict[int, set[str]] = defaultdict(set)     # clause owner id -> the nodes named with it
    for kind, obj, *on in only:
        if on:
            if kind != st.KIND_SECURITY_GROUP_CLAUSE:
                raise ValueError(f"an owner of kind {kind} is compiled on every node")
            clauses_on[obj].add(on[0])
        elif kind == st.KIND_NODE:
            for name, local in idx.local.items():
                if local and idx.nodes[name].id == obj:
                    want[name][kind].add(obj)
        elif kind == st.KIND_PORT:
            view = idx.views.get(obj)
            if view is not None and view[3]:
                want[view[0]][kind].add(obj)
        elif kind == st.KIND_SECURITY_GROUP:
            for name in idx.where.get(obj, ()):
                want[name][kind].add(obj)
        elif kind == st.KIND_SECURITY_GROUP_RULE:
            r = idx.rule_by_id.get(obj)
            if r is not None:
                for name in idx.where.get(r.group_id, ()):
                    want[name][kind].add(obj)
        elif kind == st.KIND_SECURITY_GROUP_CLAUSE:
            clause_ids.add(obj)
    clauses = defaultdict(set)   # node -> clause keys
    for keys in idx.clause_keys_of(clause_ids).values():
        for key in keys:
            for rule_id, _, _ in idx.contributors_of(key):
                for name in idx.where.get(idx.rule_by_id[rule_id].group_id, ()):
                    clauses[name].add(key)
    for i, keys in idx.clause_keys_of(set(clauses_on) - clause_ids).items():
        for name in clauses_on[i]:
            if name in idx.nodes:
                clauses[name].update(keys)
    out = {}
    for name in set(want) | set(clauses):
        node, kinds = idx.nodes[name], want.get(name, {})
        ofports = {p.id: o for p, o in idx.local.get(name, ())}
        flows: set[FlowSpec] = set()
        for side in (EGRESS, INGRESS):
            table = _Table(side.acl)
            if kinds.get(st.KIND_NODE):
                flows |= _node_fixed(side, node, table)
            for pid in sorted(kinds.get(st.KIND_PORT, ())):
                flows |= _port_flows(side, idx, node, idx.ports[pid], ofports[pid], table)
            for gid in sorted(kinds.get(st.KIND_SECURITY_GROUP, ())):
                _group_flows(side, idx, gid, table)
            for rid in sorted(kinds.get(st.KIND_SECURITY_GROUP_RULE, ())):
                _rule_flows(side, idx, idx.rule_by_id[rid], table)
            for key in clauses.get(name, ()):
                if key[0] == side.direction:
                    _clause_flow(side, idx, node, key, table)
            flows |= table.specs()
        if flows:
            out[name] = SwitchState(frozenset(flows))
    return out


def _node_fixed(side: Side, node: Node, table: "_Table") -> set[FlowSpec]:
    """The node's own flows: IPv6 neighbour discovery (and, delivered to a port, DHCP answers) past
    the tracker, invalid and stale drops."""
    node_cookie = _cookie(st.KIND_NODE, node.id)
    table.add(PRIO_INVALID, {"ct_state": INVALID}, (), node_cookie)
    table.add(PRIO_STALE_REPLY, {"ct_state": NOT_NEW_REPLY}, (), node_cookie)
    flows = {FlowSpec(side.conntrack, PRIO_NEIGHBOR_DISCOVERY,
                      {"eth_type": ETH_TYPE["IPv6"], "ip_proto": 58, "icmpv6_type": t},
                      (GotoTable(side.next),), node_cookie)
             for t in ND_TYPES}
    if side is INGRESS:
        flows.add(FlowSpec(side.conntrack, PRIO_DHCP_ANSWER, DHCP_ANSWER, (GotoTable(side.next),), node_cookie))
    return flows


def _port_flows(side: Side, idx: Index, node: Node, port: Port, ofport: int, table: "_Table") -> set[FlowSpec]:
    """A port's conntrack flows, and its clause of every rule of its groups (and of their
    established flows)."""
    flows = set()
    c = port_cookie(port.id)
    zone = idx.zones(node.name).get(port.network_id)
    rates = idx.sampling.of_port(port.id, port.project_id)
    if rates.drop:
        table.add(PRIO_DEFAULT_DROP, {side.identity: port.id}, sample(rates.drop, side.dropped, port.id), c)
    for eth_type in ETH_TYPE.values():
        if side is EGRESS:
            match = {st.REG_SRC_PORT: port.id, "eth_type": eth_type}
            actions = sample(rates.ingress, fr.PORT_INGRESS, port.id) + (
                SetField(st.REG_CT_ZONE, zone), Ct(zone_field=st.REG_CT_ZONE, table=side.acl))
        else:
            match = {st.REG_OUT_PORT: ofport, "eth_type": eth_type}
            actions = (CtClear(), SetField(st.REG_DST_PORT, port.id), SetField(st.REG_CT_ZONE, zone),
                       Ct(zone_field=st.REG_CT_ZONE, table=side.acl))
            if zone is not None:
                # tracked by its sender's egress in this zone in this pass: its entry is this
                # port's too (looked up, or just committed by egress-acl)
                on = (SetField(st.REG_DST_PORT, port.id), GotoTable(side.acl))
                flows.add(FlowSpec(side.conntrack, PRIO_TRACKED,
                                   {**match, "ct_state": TRACKED, "ct_zone": zone}, on, c))
                flows.add(FlowSpec(side.conntrack, PRIO_TRACKED,
                                   {**match, "ct_state": UNTRACKED, st.REG_CT_ZONE: zone | COMMITTED}, on, c))
        flows.add(FlowSpec(side.conntrack, PRIO_CONNTRACK, match, actions if zone is not None else (), c))
    for gid in sorted(set(port.security_groups)):
        rules = idx.rules.get(gid, ()) if gid in idx.groups else ()
        if not rules:
            continue
        table.clause(PRIO_ALLOWED, {side.identity: port.id}, Conjunction(established_conj(gid), 1, 2), c)
        for r in rules:
            if r.direction == side.direction and idx.active(r):
                n = 3 if idx.protocols(r) else 2
                table.clause(PRIO_RULE, {side.identity: port.id}, Conjunction(r.id, 1, n), c)
    return flows


def _group_flows(side: Side, idx: Index, gid: int, table: "_Table") -> None:
    """Established or related and admitted by a rule of the group (conjunction: port x mark)."""
    if idx.rules.get(gid):
        table.add(PRIO_ALLOWED, {"conj_id": established_conj(gid)}, (GotoTable(side.next),), group_cookie(gid))


def _rule_flows(side: Side, idx: Index, r: SecurityGroupRule, table: "_Table") -> None:
    """A rule's clause of its group's established flow and, on its side, its commit.

    The entry of a connection holds the rule that admitted it at the originator's egress in
    ct_mark and the one that admitted it at the responder's ingress in ct_label, so a side reads
    the field of its own direction on packets of the original direction (it is the originator
    sending, or the responder receiving) and the other one on replies."""
    c = rule_cookie(r.id)
    field = RULE_FIELD[r.direction]
    state = NOT_NEW_ORIGINAL if r.direction == side.direction else NOT_NEW_REPLY
    table.clause(PRIO_ALLOWED, {"ct_state": state, field: r.id}, Conjunction(established_conj(r.group_id), 2, 2), c)
    if r.direction == side.direction and idx.active(r):
        admit = idx.sampling.admit(idx.groups[r.group_id].project_id)
        commit = sample(admit, side.admitted, r.id) + (
            Ct(zone_field=st.REG_CT_ZONE, commit=True, exec=(SetField(field, r.id),)),)
        if side is EGRESS:
            commit += (LoadReg(st.REG_CT_ZONE, 1, COMMITTED.bit_length() - 1, 1),)
        table.add(PRIO_RULE, {"conj_id": r.id, "eth_type": ETH_TYPE[r.ethertype]}, commit + (GotoTable(side.next),), c)


def _clause_flow(side: Side, idx: Index, node: Node, key: tuple, table: "_Table") -> None:
    """One remote or protocol clause flow on a node: a conjunction action for every active rule of
    this side using it whose group is on the node."""
    here = idx.here.get(node.name, ())
    c = clause_cookie(key)
    match = dict(key[1])
    for rule_id, clause, n in idx.contributors_of(key):
        if idx.rule_by_id[rule_id].group_id in here:
            table.clause(PRIO_RULE, match, Conjunction(rule_id, clause, n), c)


def _address_field(side: Side, ethertype: str) -> str:
    return f"{'ipv4' if ethertype == 'IPv4' else 'ipv6'}_{side.remote}"


def _remote_matches(side: Side, groups: "Index", r: SecurityGroupRule) -> list[dict]:
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
