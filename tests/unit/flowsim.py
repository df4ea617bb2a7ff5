"""A small interpreter of compiled switch states, for tests: walks frames through br-int tables.

It follows OpenFlow 1.3 semantics closely enough to check what the compilers mean: highest-priority
match per table, apply-actions in order, goto_table, ALL groups, SELECT groups (one bucket, picked by
a symmetric hash of the frame's 5-tuple: the same bucket for a flow and its replies, as OVS's default
dp_hash sym_l4 selection), IN_PORT, and "never output to the in_port"; and the Nicira extensions
security groups use: conjunctive matches (`conjunction`, `conj_id`) and a connection tracker per
(node, zone) (`ct`, `ct_clear`, `ct_state`, `ct_zone`, `ct_mark`, `ct_label`), which remembers committed
connections by their addresses, protocol and ports between `send` calls; as in OVS, a `ct` without
`table` leaves the packet untracked for the rest of the pass. Between nodes (registers and conntrack
state stay behind), a tunnel output reaches the node whose tunnel_ip is tun_ipv4_dst, and an uplink
output reaches every other node's uplink (the physical network acts as a hub: a superset of what a
learning switch would deliver, which makes isolation checks stricter) - or, given a compiled fabric switch and
the fabric switch port facing each node, crosses the fabric switch's tables like a frame on the real trunk.
"""
from __future__ import annotations

from dataclasses import dataclass

from fathom.openflow.spec import (
    CT_STATE_BITS, OFPP_IN_PORT, Conjunction, Controller, Ct, CtClear, DecTtl, FlowSpec,
    GotoTable, Group, LoadReg, Meter, Move, Output, OutputTrunc, PopVlan, PushVlan, Resubmit, Sample, SetField,
    SwitchState,
)
from fathom.apps.tenant import compiler as tenant_compiler
from fathom.model import TUNNEL_INTERFACE, UPLINK_INTERFACE, Snapshot
from fathom.pipeline.catalogue import BR_INT
from fathom.trace.tables import (  # noqa: F401 (tests import matches from here)
    field_int, field_of, field_value, matches, symmetric_hash,
)

_CT_STATE = ("ct_state", "ct_zone", "ct_mark", "ct_label")   # what a lookup sets and a commit clears
_CT_FIELDS = (*_CT_STATE, "conj_id")
_L4_PORTS = (("tcp_src", "tcp_dst"), ("udp_src", "udp_dst"), ("sctp_src", "sctp_dst"))
_ICMP_QUERY = {0: 8, 14: 13, 129: 128}   # reply type -> request type


@dataclass
class Delivery:
    node: str
    interface: str
    frame: dict


FABRIC_SWITCH = "<fabric switch>"   # the fabric switch's key among the switches (never a node name: those are [a-z0-9])
OFPP_NORMAL = 0xFFFFFFFA


class Fabric:
    def __init__(self, snapshot: Snapshot, states: dict[str, SwitchState], fabric: SwitchState | None = None,
                 fabric_ports: dict[str, int] | None = None):
        """`fabric`, `fabric_ports` (node name -> fabric switch port facing it): uplink frames cross the fabric switch's tables;
        the tagged frames it drops are kept in `fabric_drops` as (sending node, frame)."""
        self.nodes = {n.name: n for n in snapshot.nodes}
        self.states = dict(states)
        self.by_tunnel_ip = {n.tunnel_ip: n for n in snapshot.nodes if n.tunnel_ip}
        self.fabric_ports = fabric_ports or {}
        self.fabric_drops: list[tuple[str, dict]] = []
        if fabric is not None:
            self.states[FABRIC_SWITCH] = fabric
        self.tables = {}
        for name, state in self.states.items():
            tables: dict[int, list[FlowSpec]] = {}
            for f in state.flows:
                tables.setdefault(f.table, []).append(f)
            for flows in tables.values():
                flows.sort(key=lambda f: -f.priority)
            self.tables[name] = tables
        self.groups = {name: {g.group_id: g for g in s.groups} for name, s in self.states.items()}
        # (node, zone) -> {connection as its first packet saw it: {"ct_mark": .., "ct_label": ..}}
        self.conntrack: dict[tuple[str, int], dict[tuple, dict]] = {}

    def send(self, node: str, interface: str, frame: dict) -> list[Delivery]:
        """Deliveries to workload interfaces of a frame sent by `interface` on `node`."""
        ofport = self.nodes[node].ofports[interface]
        return self._ingress(node, {**frame, "in_port": ofport}, hops=0)

    def _ingress(self, node: str, pkt: dict, hops: int) -> list[Delivery]:
        assert hops < 8, "frame loops between nodes"
        out: list[Delivery] = []
        for port, frame in self._pipeline(node, pkt):
            out += self._wire(node, port, frame, hops)
        return out

    def _wire(self, node_name: str, port: int, frame: dict, hops: int) -> list[Delivery]:
        node = self.nodes[node_name]
        names = {v: k for k, v in node.ofports.items()}
        interface = names.get(port)
        # registers and conntrack state stay in the switch
        clean = {k: v for k, v in frame.items() if not k.startswith("reg") and k != "in_port" and k not in _CT_FIELDS}
        if interface == TUNNEL_INTERFACE:
            remote = self.by_tunnel_ip.get(frame.get("tun_ipv4_dst"))
            if remote is None or remote.name == node_name or TUNNEL_INTERFACE not in remote.ofports:
                return []
            pkt = {**clean, "in_port": remote.ofports[TUNNEL_INTERFACE]}
            pkt.pop("tun_ipv4_dst", None)
            return self._ingress(remote.name, pkt, hops + 1)
        clean.pop("tunnel_id", None)
        clean.pop("tun_ipv4_dst", None)
        if interface == UPLINK_INTERFACE and FABRIC_SWITCH in self.states:
            return self._cross_tor(node_name, clean, hops)
        if interface == UPLINK_INTERFACE:
            out = []
            for other in self.nodes.values():
                if other.name != node_name and UPLINK_INTERFACE in other.ofports:
                    out += self._ingress(other.name,
                                         {**clean, "in_port": other.ofports[UPLINK_INTERFACE]},
                                         hops + 1)
            return out
        assert interface is not None, f"output to unknown port {port} on {node_name}"
        return [Delivery(node_name, interface, clean)]

    def _cross_tor(self, node_name: str, frame: dict, hops: int) -> list[Delivery]:
        """A frame from a node's uplink through the fabric switch: out of a port, to the node behind it."""
        behind = {port: node for node, port in self.fabric_ports.items()}
        outputs = self._pipeline(FABRIC_SWITCH, {**frame, "in_port": self.fabric_ports[node_name]})
        if not outputs and frame.get("vlan") is not None:
            self.fabric_drops.append((node_name, frame))
        out = []
        for port, sent in outputs:
            clean = {k: v for k, v in sent.items() if k != "in_port"}
            targets = [n for n in self.fabric_ports if n != node_name] if port == OFPP_NORMAL else [behind[port]]
            for target in targets:
                other = self.nodes[target]
                if UPLINK_INTERFACE in other.ofports:
                    out += self._ingress(target, {**clean, "in_port": other.ofports[UPLINK_INTERFACE]}, hops + 1)
        return out

    def _pipeline(self, node: str, pkt: dict) -> list[tuple[int, dict]]:
        """(port, frame) outputs of one pass through a node's tables, starting at table 0."""
        outputs: list[tuple[int, dict]] = []
        self._run_table(node, 0, dict(pkt), outputs, depth=0)
        return outputs

    def _run_table(self, node: str, table: int, pkt: dict, outputs: list, depth: int) -> None:
        assert depth < 32, "resubmit loop"
        flow = self._lookup(self.tables[node].get(table, []), pkt)
        if flow is not None:
            self._apply(node, flow.actions, pkt, outputs, depth)
        # No flow: OpenFlow 1.3 table-miss drops.

    @staticmethod
    def _lookup(flows: list[FlowSpec], pkt: dict) -> FlowSpec | None:
        """The flow that decides (flows sorted by descending priority). Flows of conjunction actions
        only are clauses: at the highest priority where clauses match, a conjunction every clause of
        which matched sets conj_id and the lookup is repeated with it (as OVS does)."""
        priority = None
        clauses: dict[int, set[int]] = {}
        sizes: dict[int, int] = {}
        for flow in flows:
            if priority is not None and flow.priority != priority:
                break
            if not matches(flow, pkt):
                continue
            if flow.actions and all(isinstance(a, Conjunction) for a in flow.actions):
                priority = flow.priority
                for c in flow.actions:
                    clauses.setdefault(c.id, set()).add(c.clause)
                    sizes[c.id] = c.n_clauses
                continue
            if priority is None:
                return flow
        done = sorted(cid for cid, seen in clauses.items() if len(seen) == sizes[cid])
        if done:
            with_id = {**pkt, "conj_id": done[0]}
            found = next((f for f in flows if dict(f.match).get("conj_id") == done[0] and matches(f, with_id)), None)
            if found is not None:
                return found
        if priority is not None:
            return Fabric._lookup([f for f in flows if f.priority < priority], pkt)
        return None

    def _connection(self, pkt: dict) -> tuple | None:
        """The packet's connection as (eth_type, protocol, src, dst, sport, dport); None if not IP."""
        if pkt.get("eth_type") not in (0x0800, 0x86DD):
            return None
        v = "ipv4" if pkt["eth_type"] == 0x0800 else "ipv6"
        sport = dport = 0
        for src, dst in _L4_PORTS:
            if src in pkt or dst in pkt:
                sport, dport = pkt.get(src, 0), pkt.get(dst, 0)
        for field in ("icmpv4_type", "icmpv6_type"):
            if field in pkt:     # a request and its reply are one connection (echo, timestamp, ...)
                sport = dport = _ICMP_QUERY.get(pkt[field], pkt[field])
        return (pkt["eth_type"], pkt.get("ip_proto", 0), pkt.get(f"{v}_src"), pkt.get(f"{v}_dst"), sport, dport)

    def _ct(self, node: str, a: Ct, pkt: dict) -> None:
        zone = (pkt.get(a.zone_field, 0) >> a.zone_ofs) & 0xFFFF if a.zone_field else a.zone
        table = self.conntrack.setdefault((node, zone), {})
        conn = self._connection(pkt)
        if conn is None:
            return
        reverse = (conn[0], conn[1], conn[3], conn[2], conn[5], conn[4])
        bits = CT_STATE_BITS
        if conn in table:
            key, state = conn, bits["trk"] | bits["est"]
        elif reverse in table:
            key, state = reverse, bits["trk"] | bits["est"] | bits["rpl"]
        else:
            key, state = conn, bits["trk"] | bits["new"]
        entry = dict(table.get(key, {"ct_mark": 0, "ct_label": 0}))
        if a.commit:
            for x in a.exec:
                if isinstance(x, SetField) and x.field in entry:
                    entry[x.field] = x.value
            table[key] = entry
        if a.table is None:     # OVS: untracked for the rest of the pass
            for name in _CT_STATE:
                pkt.pop(name, None)
        else:
            pkt.update(ct_state=state, ct_zone=zone, **entry)

    def _apply(self, node: str, actions: tuple, pkt: dict, outputs: list, depth: int) -> None:
        for a in actions:
            if isinstance(a, SetField):
                if a.field == "vlan_vid":
                    pkt["vlan"] = a.value & 0xFFF
                else:
                    pkt[a.field] = a.value
            elif isinstance(a, Move):
                src = field_int(a.src, field_of(pkt, a.src))
                bits = (src >> a.src_ofs) & ((1 << a.n_bits) - 1)
                dst = field_int(a.dst, field_of(pkt, a.dst) or 0)
                mask = ((1 << a.n_bits) - 1) << a.dst_ofs
                pkt[a.dst] = field_value(a.dst, (dst & ~mask) | (bits << a.dst_ofs))
            elif isinstance(a, LoadReg):
                old = pkt.get(a.field, 0)
                mask = ((1 << a.n_bits) - 1) << a.ofs
                pkt[a.field] = (old & ~mask) | (a.value << a.ofs)
            elif isinstance(a, PushVlan):
                assert pkt.get("vlan") is None, "double tagging"
                pkt["vlan"] = 0
            elif isinstance(a, PopVlan):
                pkt["vlan"] = None
            elif isinstance(a, DecTtl):
                if pkt.get("ttl", 64) <= 1:
                    return
                pkt["ttl"] = pkt.get("ttl", 64) - 1
            elif isinstance(a, Output):
                port = pkt["in_port"] if a.port == OFPP_IN_PORT else a.port
                if a.port == OFPP_IN_PORT or port != pkt["in_port"]:
                    outputs.append((port, dict(pkt)))
            elif isinstance(a, Group):
                group = self.groups[node][a.group_id]
                assert group.type in ("all", "select")
                buckets = group.buckets if group.type == "all" else \
                    [group.buckets[symmetric_hash(pkt) % len(group.buckets)]] if group.buckets else []
                for bucket in buckets:
                    self._apply(node, bucket, dict(pkt), outputs, depth)
            elif isinstance(a, GotoTable):
                self._run_table(node, a.table, pkt, outputs, depth + 1)
                return
            elif isinstance(a, Resubmit):
                self._run_table(node, a.table, dict(pkt), outputs, depth + 1)
            elif isinstance(a, Ct):
                self._ct(node, a, pkt)
                if a.table is not None:
                    self._run_table(node, a.table, dict(pkt), outputs, depth + 1)
            elif isinstance(a, CtClear):
                for name in _CT_FIELDS:
                    pkt.pop(name, None)
            elif isinstance(a, Controller):
                pass
            elif isinstance(a, Meter):          # a meter only drops above its rate
                pass
            elif isinstance(a, Sample):         # a copy to the IPFIX collector: the frame goes on
                pass
            elif isinstance(a, OutputTrunc):    # the frame model has no payload to cut
                if a.port != pkt["in_port"]:
                    outputs.append((a.port, dict(pkt)))
            else:
                raise TypeError(a)


def compile_tenant(snapshot: Snapshot) -> dict:
    """The tenant compiler's br-int states with the pipeline's table-miss flows: what a br-int holds
    in a cloud without taps or fabric routers."""
    from fathom.openflow.spec import SwitchState
    return {node: SwitchState(BR_INT.skeleton()) | state
            for node, state in tenant_compiler.compile_tenant(snapshot).items()}
