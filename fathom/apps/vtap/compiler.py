"""vTAP compiler (the vTAP paper, sections III-A and IV-B): TAP policies -> flows and groups of br-int.

Pure: a store snapshot in, the desired vTAP part of every node's br-int out. For each policy and
direction (sender -> receiver; also receiver -> sender when `direction` is `both`) there is one tap
point, on the edge switch of one port:

- a port sends (the sender is a port): the rewriting rule, one flow per match in `tap-ingress`
  (port ranges expand into a few masked matches) -> group of type ALL, keyed by (policy,
  direction), with bucket 1 = `resubmit(,security)`: the original goes on unchanged; and one bucket
  per monitor: destination MAC (and IPv4) := the monitor's, REG_TAP := the copy's marker,
  `resubmit(,tap-recovery)`.
- anyone sends to a port (the sender is "*"): in `tap-egress`, what l2 delivers to that port
  (`reg7` = its ofport) -> group ALL, bucket 1 = `resubmit(,tap-recovery)` (the original goes on),
  one bucket per monitor: REG_TAP := marker, `resubmit(,tap-recovery)`. The copy is taken as the
  port receives it, so it is not rewritten and nothing is restored.
- in `tap-recovery` on the same switch, REG_TAP = marker selects what happens to the copy: the
  monitor is local -> the recovery rule restores the original headers (what the receiver gets:
  for routed traffic also the router's source MAC and TTL - 1) and outputs it to the monitor's port;
  the monitor is on another node -> tun_id := marker, tunnel destination := the monitor's node,
  output to the flow-based tunnel port.
- on the monitor's node, `classify` maps (tunnel port, tun_id = marker) to REG_TAP and goes to
  `tap-recovery`, where the recovery rule restores the headers and delivers.

Markers are VNIs in a range tenant networks must not use: TAP_VNI_BASE | policy << 3 | direction
<< 2 | monitor index, so the receiving node (and anyone looking at the underlay) can tell which
policy, direction and monitor every copy belongs to. Group ids are group_id(APP_VTAP, policy << 1
| direction). Every flow and group carries the cookie (APP_VTAP, KIND_TAP_POLICY, policy id).

Copies never reach a tap point themselves (they go from tap-recovery straight to the monitor's port
or the tunnel), so a packet is copied once per policy that taps it: a packet from a port tapped at
its ingress to a port tapped at its egress is copied by both policies.

Overlap: in one tap point the higher `priority` wins (OpenFlow priority = PRIO_TAP_BASE +
priority): a packet matched by several policies is copied once, by the highest one. Overlapping
policies with the same priority are refused by the API (`conflicting_policies`).

The filter vocabulary (`normalise_filters`) is what OpenFlow 1.3 can match, checked with its
prerequisites; docs/vtap.md lists it.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from fathom.openflow.spec import (
    OFPP_IN_PORT, DecTtl, FlowSpec, GotoTable, Group, GroupSpec, LoadReg, Meter, MeterSpec, Output,
    OutputTrunc, Resubmit,
    SetField, SwitchState, set_tunnel_dst,
)
from fathom.pipeline import stages as st
from fathom.model.taps import (
    ETH_IPV4, Endpoint, Problems, View, directions, effective_eth_type, egress_matches, endpoint, ends,
    ingress_matches, installable_monitors, marker, reverse_filters, tap_role, tapped, vlan_as_network,
)
from fathom.model import TUNNEL_INTERFACE, Port, Snapshot, TapPolicy

MAX_MONITORS = 2
PRIO_TAP_BASE = 1000             # tap-ingress flow priority = base + policy priority
PRIO_MARKER = 100                # tap-recovery and classify flows keyed by marker

# ---------------------------------------------------------------------------------------------- markers


def tap_group_id(policy_id: int, direction: int) -> int:
    return st.group_id(st.APP_VTAP, (policy_id << 1) | direction)


def tap_meter_id(policy_id: int) -> int:
    """The meter of a policy's copies on a switch: same layout as group ids (app in the top byte)."""
    return st.group_id(st.APP_VTAP, policy_id)


def tap_cookie(policy_id: int) -> int:
    return st.cookie(st.APP_VTAP, st.KIND_TAP_POLICY, policy_id)


# ---------------------------------------------------------------------------------------------- compile


@dataclass
class Plan:
    """What one policy needs, where; `problems` say why some or all of it is not installed."""
    policy: TapPolicy
    problems: Problems
    nodes: dict  # node name -> role(s) ("sender edge", "monitor edge")


def compile_vtap(snapshot: Snapshot) -> dict[str, SwitchState]:
    """Desired vTAP flows and groups of every node (nodes without any are left out)."""
    states, _ = compile_vtap_plans(snapshot)
    return states


def compile_vtap_plans(snapshot: Snapshot) -> tuple[dict[str, SwitchState], dict[int, Plan]]:
    view = View(snapshot)
    flows: dict[str, set] = defaultdict(set)
    groups: dict[str, set] = defaultdict(set)
    plans: dict[int, Plan] = {}
    for policy in sorted(snapshot.tap_policies, key=lambda p: p.id):
        plan = Plan(policy, Problems(), {})
        plans[policy.id] = plan
        _compile_policy(view, policy, plan, flows, groups)
    meters: dict[str, set] = defaultdict(set)
    for name, node_flows in flows.items():
        for f in node_flows:
            if f.meter_id() is not None:
                p = plans[st.parse_cookie(f.cookie)[2]].policy
                meters[name].add(MeterSpec(f.meter_id(), p.rate_pps, max(1, p.rate_pps // 10), "pktps",
                                           f.cookie))
    names = set(flows) | set(groups)
    return ({n: SwitchState(frozenset(flows[n]), frozenset(groups[n]), frozenset(meters[n]))
             for n in sorted(names)}, plans)


def _compile_policy(view: View, p: TapPolicy, plan: Plan, flows, groups) -> None:
    problems = plan.problems
    sender, receiver, missing = ends(view.ports, p)
    problems.extend_with(missing)
    monitors: list[tuple[int, Port]] | None = installable_monitors(view.ports, p, sender, receiver, problems)
    if monitors is None:
        return
    filters = dict(p.filters)
    tapping, why = directions(p, sender, receiver)
    problems += why
    for d, src, dst in tapping:
        _compile_direction(view, p, plan, d, src, dst, monitors, filters if d == 0 else reverse_filters(filters),
                           flows, groups)


def _compile_direction(view: View, p: TapPolicy, plan: Plan, d: int, src: Endpoint, dst: Endpoint,
                       monitors, filters: dict, flows, groups) -> None:
    problems = plan.problems
    port, at_egress = tapped(src, dst)
    what = tap_role(d, at_egress)
    node = view.nodes.get(port.node) if port.node else None
    ofport = node.ofport(port.interface) if node else None
    if node is None:
        problems.append(f"{what} port {port.id} is not bound to a node")
        return
    if ofport is None:
        problems.append(f"{what} port {port.id}: interface {port.interface!r} not on "
                        f"{node.name}'s br-int yet")
        return
    c = tap_cookie(p.id)
    filters = vlan_as_network(view, port, filters)
    eth_type = effective_eth_type(filters)
    # At the egress the copy is taken as the receiver gets it: nothing to rewrite or restore. At the
    # ingress it is addressed to the monitor, and the recovery rule restores what the receiver gets.
    l2_adjacent = at_egress or (view.in_network(port.network_id, dst.ip) if eth_type == ETH_IPV4 else True)
    route = None if l2_adjacent else view.route(port.network_id, dst.ip)
    rewrite = not at_egress and dst.mac is not None   # any receiver ("*"): the copy is never rewritten
    restore: list = []
    if route is not None:
        restore += [SetField("eth_src", route[1].mac_address)]
    if rewrite:
        restore += [SetField("eth_dst", dst.mac)]
    rewrite_ip = rewrite and eth_type == ETH_IPV4 and dst.ip is not None
    if rewrite_ip:
        restore += [SetField("ipv4_dst", dst.ip)]
    if route is not None:
        restore += [DecTtl()]

    # bucket 1: the original goes on where the tap point's table miss would have taken it
    buckets = [(Resubmit(st.TAP_RECOVERY if at_egress else st.SECURITY),)]
    for i, mport in monitors:
        mk = marker(p.id, d, i)
        if mk in view.tenant_vnis:
            problems.add(f"tap marker VNI {mk} is used by a tenant network", fatal=True)
            continue
        mon = endpoint(mport)
        mnode = view.nodes.get(mport.node) if mport.node else None
        m_ofport = mnode.ofport(mport.interface) if mnode else None
        label = "monitor" if i == 0 else "monitor2"
        if mnode is None or m_ofport is None:
            problems.append(f"{label} port {mport.id} is not on a node's br-int yet")
            continue
        copy = [SetField("eth_dst", mon.mac)] if rewrite else []
        if rewrite_ip and mon.ip is not None:
            copy.append(SetField("ipv4_dst", mon.ip))
        buckets.append(tuple(copy) + (LoadReg(st.REG_TAP, mk), Resubmit(st.TAP_RECOVERY)))
        meter = (Meter(tap_meter_id(p.id)),) if p.rate_pps else ()
        deliver = tuple(restore) + (_out(m_ofport, p.truncate),)
        # set_field ipv4_dst / dec_ttl need the match to say IPv4 (OpenFlow prerequisites)
        recover_match = {st.REG_TAP: mk, "eth_type": eth_type}
        if mnode.name == node.name:
            flows[node.name].add(FlowSpec(st.TAP_RECOVERY, PRIO_MARKER, recover_match, meter + deliver, c))
            plan.nodes.setdefault(node.name, set()).add("monitor edge")
            continue
        tunnel = node.ofport(TUNNEL_INTERFACE)
        m_tunnel = mnode.ofport(TUNNEL_INTERFACE)
        if tunnel is None or m_tunnel is None or not mnode.tunnel_ip:
            problems.append(f"{label}: no tunnel between {node.name} and {mnode.name} yet")
            buckets.pop()
            continue
        send = (SetField("tunnel_id", mk), set_tunnel_dst(mnode.tunnel_ip))
        flows[node.name].add(FlowSpec(st.TAP_RECOVERY, PRIO_MARKER, {st.REG_TAP: mk},
                                      meter + send + (Output(tunnel),), c))
        if at_egress:
            # a frame delivered from the tunnel: OpenFlow skips an output to the port a frame came in on
            flows[node.name].add(FlowSpec(st.TAP_RECOVERY, PRIO_MARKER + 1, {st.REG_TAP: mk, "in_port": tunnel},
                                          meter + send + (Output(OFPP_IN_PORT),), c))
        flows[mnode.name].add(FlowSpec(st.CLASSIFY, PRIO_MARKER, {"in_port": m_tunnel, "tunnel_id": mk},
                                       (SetField(st.REG_TAP, mk), GotoTable(st.TAP_RECOVERY)), c))
        flows[mnode.name].add(FlowSpec(st.TAP_RECOVERY, PRIO_MARKER, recover_match, deliver, c))
        plan.nodes.setdefault(mnode.name, set()).add("monitor edge")
    if len(buckets) == 1:
        return  # no monitor reachable: leave the traffic alone rather than install a no-op group
    gid = tap_group_id(p.id, d)
    groups[node.name].add(GroupSpec(gid, "all", tuple(buckets), c))
    plan.nodes.setdefault(node.name, set()).add("receiver edge" if at_egress else "sender edge")
    prio = PRIO_TAP_BASE + p.priority
    if at_egress:
        table, matches = st.TAP_EGRESS, egress_matches(dst, filters, ofport)
    else:
        table, matches = st.TAP_INGRESS, ingress_matches(src, dst, filters, l2_adjacent, route)
    for match in matches:
        flows[node.name].add(FlowSpec(table, prio, match, (Group(gid),), c))


def _out(port: int, truncate: int | None):
    """Output of a copy to its monitor: truncated to `truncate` bytes when the policy asks. Always after
    the recovery rule: a switch cannot parse (and so cannot restore) an IP packet shorter than its
    header's total length, so a copy is cut only where it is delivered."""
    return Output(port) if not truncate else OutputTrunc(port, truncate)
