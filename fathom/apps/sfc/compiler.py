"""Service chain steering: port chains -> flows and select groups of every node's br-int.

Pure: a snapshot in, the desired sfc part of every node's br-int out. For a chain with groups
G0..Gn-1 and direction d (0 = forward; 1 = a symmetric chain's replies, through Gn-1..G0):

- the chain hop a frame goes to next is `hop_marker(chain, d, k)` (it goes to group k). Inside a
  node it lives in REG_CHAIN_HOP; between nodes in the VXLAN VNI (`tun_id`), from a range no tenant
  network uses, so a frame never loses its place in the chain;
- sfc (entry): on the node of a classifier's logical source port, a frame from that port (the
  source-port register) matching the classifier (and sent to the MAC of its logical destination
  port, when it names one) -> hop (chain, 0, 0); for a symmetric chain, at the
  logical destination port, the mirrored classifier -> hop (chain, 1, n-1);
- sfc (moving on): IPv4 coming back from instance i of group k — from its egress port going
  forward, from its ingress port going back — -> hop (chain, d, k±1); after the last group nothing
  matches and the frame goes on to l3/l2 like any other: delivered to its destination;
- sfc-select: hop -> the hop's select group, one bucket per instance of the group, the same buckets in
  the same order on every node (a group of one instance needs no choice: the bucket's actions go in
  the flow itself). OVS picks a bucket by a symmetric hash of the 5-tuple (dp_hash,
  sym_l4, basis 0: the OVS default for select groups), so a flow stays on one instance and its
  replies meet the same one. A bucket sets the destination MAC to the port the instance receives on
  (ingress going forward, egress going back: the VNF sees an ordinary packet sent to it) and either
  outputs to it, or sets tun_id := hop marker and the instance node's tunnel address and outputs to
  the tunnel;
- classify (remote): tunnel + tun_id = hop marker -> REG_CHAIN_HOP, to sfc-deliver, where the hop and
  the destination MAC pick the local port;
- flow records: when the chain's project samples what its ports send (its `ingress` rate), the
  sfc-select flow of every hop samples first, observation point chain-hop + the hop marker
  (fathom.model.flow_records), so a record names the chain, the direction and the group.

Every flow and group carries the cookie (APP_SFC, KIND_PORT_CHAIN, chain id). Group ids are
group_id(APP_SFC, marker & 0xFFFFF). A chain whose instances are not all placed yet (an unbound
port, an interface not plugged, no tunnel) is compiled without the missing buckets and reported in
its plan; a hop with no instance at all has no group, and its frames are dropped in sfc-select
rather than let past a VNF they must cross.

Hop markers and the limits on chains are the model's (fathom.model.chains).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from fathom.model import classifiers as cls
from fathom.model import flow_records as fr
from fathom.model.chains import MAX_CHAIN_ID, MAX_GROUPS, hop_marker
from fathom.model import TUNNEL_INTERFACE, Node, Port, PortChain, PortPair, Snapshot
from fathom.openflow.spec import FlowSpec, GotoTable, Group, GroupSpec, Output, SetField, SwitchState, set_tunnel_dst
from fathom.pipeline import stages as st
from fathom.pipeline.sampling import sample

PRIO_CLASSIFIER = 100
PRIO_HOP = 100
ETH_IPV4 = 0x0800


def chain_cookie(chain_id: int) -> int:
    return st.cookie(st.APP_SFC, st.KIND_PORT_CHAIN, chain_id)


def hop_group_id(marker: int) -> int:
    return st.group_id(st.APP_SFC, marker & 0xFFFFF)


@dataclass
class Plan:
    """What one chain needs, where; `problems` say what is missing (status pending / error)."""
    chain: PortChain
    problems: list = field(default_factory=list)
    nodes: set = field(default_factory=set)
    fatal: bool = False      # the chain cannot be compiled at all (status error)


class _View:
    def __init__(self, snapshot: Snapshot):
        self.nodes = {n.name: n for n in snapshot.nodes}
        self.ports = {p.id: p for p in snapshot.ports}
        self.pairs = {p.id: p for p in snapshot.port_pairs}
        self.groups = {g.id: g for g in snapshot.port_pair_groups}
        self.tenant_vnis = {n.segmentation_id for n in snapshot.networks if n.type == "vxlan"}
        self.hop_rates = fr.ingress_rates(snapshot.flow_sampling)     # project -> the rate of its hops

    def place(self, port: Port | None) -> tuple[Node, int] | None:
        """(node, ofport) of a port plugged into its node's br-int, or None."""
        node = self.nodes.get(port.node) if port is not None and port.node else None
        ofport = node.ofport(port.interface) if node is not None else None
        return None if ofport is None else (node, ofport)

    def instances(self, group_id: int) -> list[PortPair]:
        g = self.groups.get(group_id)
        return [self.pairs[i] for i in sorted(g.port_pair_ids) if i in self.pairs] if g else []


def compile_sfc_plans(snapshot: Snapshot) -> tuple[dict[str, SwitchState], dict[int, Plan]]:
    view = _View(snapshot)
    flows: dict[str, set] = defaultdict(set)
    groups: dict[str, set] = defaultdict(set)
    plans: dict[int, Plan] = {}
    for chain in sorted(snapshot.port_chains, key=lambda c: c.id):
        plan = plans[chain.id] = Plan(chain)
        _compile_chain(snapshot, view, chain, plan, flows, groups)
    names = sorted(set(flows) | set(groups))
    return {n: SwitchState(frozenset(flows[n]), frozenset(groups[n])) for n in names}, plans


def compile_sfc(snapshot: Snapshot) -> dict[str, SwitchState]:
    return compile_sfc_plans(snapshot)[0]


def _compile_chain(snapshot: Snapshot, view: _View, chain: PortChain, plan: Plan, flows, groups) -> None:
    problems = plan.problems
    n = len(chain.port_pair_group_ids)
    if chain.id > MAX_CHAIN_ID or n > MAX_GROUPS:
        problems.append(f"chain id {chain.id} or its {n} groups are beyond the hop marker space")
        plan.fatal = True
        return
    markers = {hop_marker(chain.id, d, k) for d in (0, 1) for k in range(n)}
    if markers & view.tenant_vnis:
        problems.append(f"a tenant network uses a hop marker VNI of this chain ({min(markers & view.tenant_vnis)})")
        plan.fatal = True
        return
    c = chain_cookie(chain.id)
    directions = (0, 1) if chain.symmetric else (0,)
    hop_groups = [view.instances(gid) for gid in chain.port_pair_group_ids]
    for k, pairs in enumerate(hop_groups):
        if not pairs:
            problems.append(f"port pair group {chain.port_pair_group_ids[k]} has no port pair")

    # entry: classifiers at the source port's node (mirrored ones at the destination port's node)
    for d, fc in cls.entry_classifiers(snapshot, chain):
        src = view.ports.get(fc.logical_source_port_id)
        where = view.place(src)
        if where is None:
            problems.append(f"flow classifier {fc.id}: port {fc.logical_source_port_id} is not plugged into "
                            "a node yet")
            continue
        node, _ = where
        first = 0 if d == 0 else n - 1
        dst = view.ports.get(fc.logical_destination_port_id) if fc.logical_destination_port_id else None
        if fc.logical_destination_port_id is not None and dst is None:
            problems.append(f"flow classifier {fc.id}: its destination port {fc.logical_destination_port_id} is gone")
            continue
        for match in cls.matches(fc, dst.mac_address if dst else None):
            flows[node.name].add(FlowSpec(st.SFC, PRIO_CLASSIFIER, {st.REG_SRC_PORT: src.id, **match},
                                          (SetField(st.REG_CHAIN_HOP, hop_marker(chain.id, d, first)),
                                           GotoTable(st.SFC_SELECT)), c))
        plan.nodes.add(node.name)

    # moving on: from the side of an instance a frame leaves on, to the next group (none after the last)
    for k, pairs in enumerate(hop_groups):
        for d in directions:
            nxt = k + 1 if d == 0 else k - 1
            if not 0 <= nxt < n:
                continue
            for pair in pairs:
                out_port = view.ports.get(pair.egress_port_id if d == 0 else pair.ingress_port_id)
                where = view.place(out_port)
                if where is None:
                    continue   # reported below, with the instance
                flows[where[0].name].add(FlowSpec(
                    st.SFC, PRIO_HOP, {st.REG_SRC_PORT: out_port.id, "eth_type": ETH_IPV4},
                    (SetField(st.REG_CHAIN_HOP, hop_marker(chain.id, d, nxt)), GotoTable(st.SFC_SELECT)), c))

    # select groups on every node that can send to a hop; delivery on the instances' nodes
    senders = {name for name in flows if any(f.cookie == c for f in flows[name])}
    hop_rate = view.hop_rates.get(chain.project_id, 0)
    for k, pairs in enumerate(hop_groups):
        for d in directions:
            marker = hop_marker(chain.id, d, k)
            observe = sample(hop_rate, fr.CHAIN_HOP, marker & fr.HOP_MASK)
            targets = []
            for pair in pairs:
                port = view.ports.get(pair.ingress_port_id if d == 0 else pair.egress_port_id)
                where = view.place(port)
                if where is None:
                    problems.append(f"port pair {pair.id}: port {port.id if port else '?'} is not plugged "
                                    "into a node yet")
                    continue
                targets.append((port, where[0], where[1]))
            for node_name in sorted(senders):
                node = view.nodes[node_name]
                buckets = []
                for port, tnode, ofport in targets:
                    if tnode.name == node.name:
                        buckets.append((SetField("eth_dst", port.mac_address), Output(ofport)))
                        continue
                    tunnel = node.ofport(TUNNEL_INTERFACE)
                    remote_tunnel = tnode.ofport(TUNNEL_INTERFACE)
                    if tunnel is None or remote_tunnel is None or not tnode.tunnel_ip:
                        problems.append(f"no tunnel between {node.name} and {tnode.name} yet")
                        continue
                    buckets.append((SetField("eth_dst", port.mac_address), SetField("tunnel_id", marker),
                                    set_tunnel_dst(tnode.tunnel_ip), Output(tunnel)))
                    flows[tnode.name].add(FlowSpec(st.CLASSIFY, PRIO_HOP,
                                                   {"in_port": remote_tunnel, "tunnel_id": marker},
                                                   (SetField(st.REG_CHAIN_HOP, marker), GotoTable(st.SFC_DELIVER)), c))
                    flows[tnode.name].add(FlowSpec(st.SFC_DELIVER, PRIO_HOP,
                                                   {st.REG_CHAIN_HOP: marker, "eth_dst": port.mac_address},
                                                   (Output(ofport),), c))
                    plan.nodes.add(tnode.name)
                if not buckets:
                    continue
                if len(targets) == 1:
                    # one instance: nothing to choose, so no select group (its hash costs every packet a
                    # second pass through the datapath)
                    flows[node.name].add(FlowSpec(st.SFC_SELECT, PRIO_HOP, {st.REG_CHAIN_HOP: marker},
                                                  observe + buckets[0], c))
                    continue
                gid = hop_group_id(marker)
                groups[node.name].add(GroupSpec(gid, "select", tuple(buckets), c))
                flows[node.name].add(FlowSpec(st.SFC_SELECT, PRIO_HOP, {st.REG_CHAIN_HOP: marker},
                                              observe + (Group(gid),), c))
    plan.problems = sorted(set(problems))
