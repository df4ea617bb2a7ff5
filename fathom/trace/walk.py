"""A simulated trace: one packet from a port, through the desired tables of every switch it reaches.

The walk starts at the source port's br-int and follows every packet a pass sends out
(fathom.trace.tables runs each pass): the tunnel to the node whose tunnel IP it is addressed to,
the uplink through the node's br-phy and the fabric switch to the br-phy and br-int of the node behind the
fabric switch port (in a fabric; without one the uplink reaches the nodes that host the frame's destination
MAC), a network-node router's namespace (Linux routing between its `qrp` legs, not OpenFlow: the
walk routes by the router's interfaces as the namespace does), a VNF of a service chain (a router
between its two ports: in on one, out of the other towards the destination), the external
network's upstream router (which sends a frame for a floating IP or router gateway of this cloud
back to the gateway node hosting it, and nothing else), and a workload port (the packet is
delivered when it is addressed to the port, a flooded copy otherwise). Each leaf of the walk is a
verdict; the trace's verdict is the one about the packet's destination.

Pure: reads only the model and the desired states it is given. Bounded: MAX_HOPS switch passes.
"""
from __future__ import annotations

import ipaddress
from collections import deque
from typing import Callable, Mapping

from fathom.model import (
    EXTERNAL_INTERFACE, TUNNEL_INTERFACE, UPLINK_INTERFACE, Port, RouterInterface, Snapshot,
)
from fathom.model.routers import router_port_interface
from fathom.openflow.spec import OFPP_CONTROLLER
from fathom.pipeline import cookies as ck
from fathom.pipeline.catalogue import (BR_INT, BR_PHY, FABRIC_SWITCH, OFPP_NORMAL, PIPELINES, REG_DST_PORT, REG_SRC_PORT,
                                      REG_TAP)
from fathom.trace import ofproto
from fathom.trace import tables as tb

MAX_HOPS = 64                 # switch passes and hops outside the switches in one trace
PROTOCOLS = {"icmp": 1, "tcp": 6, "udp": 17}
ETH_IPV4 = 0x0800
PHY_PATCH, PHY_UPLINK = "patch-int", "ul0"     # br-phy's interfaces (fathom.controller.setups)
CT_NEXT = 4                   # ct actions a traced bridge pass resumes with the given state (ofproto/trace --ct-next)
DESIRED, ACTUAL = "desired (what the controller compiles)", "actual (each node's tables, traced by its agent)"


class TraceError(ValueError):
    """The trace cannot be asked this way (a 4xx for the API)."""


class Unanswered(Exception):
    """A switch's own tables could not be traced: why (its agent is down, did not answer in time, or
    failed)."""


# actual(node, bridge, br_flow, ct_next) -> what `ovs-appctl ofproto/trace` printed on that node
Actual = Callable[[str, str, str, list], str]


def trace(snapshot: Snapshot, states: Mapping, source: Port, to: str, proto: str = "icmp",
          sport: int | None = None, dport: int | None = None, ct_state: str = "new", ttl: int = 64,
          visible: Callable[[str], bool] = lambda project: True, actual: Actual | None = None) -> dict:
    """The trace of a packet from `source` to the IPv4 address `to`, as a JSON-able dict.

    `states`: the desired state of every switch, keyed by objects with `bridge` and `name` (the
    controller's SwitchKey). `visible(project)`: whether the caller may see that project's objects
    by name (others are named "another project's …"). `actual`: trace each node's bridges through
    their own tables with it (raising Unanswered when it cannot); the fabric switch's pass stays
    simulated. The result then also holds the desired verdict and, where the two verdicts differ,
    the `difference`: the first stage whose actual flow is not the desired one."""
    if proto not in PROTOCOLS:
        raise TraceError(f"proto is one of {', '.join(PROTOCOLS)}")
    if ct_state not in tb.CT_STATES:
        raise TraceError(f"ct_state is one of {', '.join(tb.CT_STATES)}")
    if proto in ("tcp", "udp") and dport is None:
        raise TraceError(f"{proto} needs a destination port")
    if proto == "icmp" and (sport is not None or dport is not None):
        raise TraceError("icmp has no ports")
    try:
        dst = str(ipaddress.IPv4Address(to))
    except ValueError:
        raise TraceError(f"{to[:64]!r} is not an IPv4 address") from None
    by_switch = {(k.bridge, k.name): v for k, v in states.items()}
    desired = _Walk(snapshot, by_switch, tb.CT_STATES[ct_state], visible).run(source, dst, proto, sport, dport, ttl,
                                                                               ct_state)
    if actual is None:
        return desired
    result = _Walk(snapshot, by_switch, tb.CT_STATES[ct_state], visible, actual).run(
        source, dst, proto, sport, dport, ttl, ct_state)
    result["desired"] = {"verdict": desired["verdict"]}
    if _outcome(result["verdict"]) != _outcome(desired["verdict"]):
        result["difference"] = _difference(result, desired["verdict"])
    return result


def destination(snapshot: Snapshot, source: Port, to: str) -> Port | None:
    """The port the address `to` names for a packet from `source` (None: no port owns it)."""
    return _Walk(snapshot, {}, tb.CT_NEW, lambda project: True).destination(source, to)


def _outcome(verdict: dict) -> tuple:
    return verdict["result"], verdict.get("port"), verdict.get("node")


def _difference(result: dict, desired: dict) -> dict:
    """Where the actual walk leaves the desired one: the first hop whose switch holds other flows for
    the packet than it should (or that could not be traced)."""
    out = {"desired": desired["result"], "actual": result["verdict"]["result"]}
    for hop in result["hops"]:
        if hop.get("differs"):
            d = hop["differs"][0]
            out.update(hop=hop["id"], switch=hop["switch"], stage=d["stage"],
                       reason=f"{hop['switch']}, {d['stage']}: desired {d['desired']}; actual {d['actual']}")
            return out
        if hop.get("tables") == "unknown":
            leaf = next(lf for lf in result["leaves"] if lf["hop"] == hop["id"])
            out.update(hop=hop["id"], switch=hop["switch"], reason=leaf["detail"])
            return out
    out["reason"] = "the switches hold the desired flows for this packet; the verdicts differ past them"
    return out


def _first_ipv4(port: Port) -> str | None:
    return next((f.ip_address for f in port.fixed_ips if ipaddress.ip_address(f.ip_address).version == 4), None)


class _Walk:
    def __init__(self, snapshot: Snapshot, states: dict, ct_state: int, visible, actual: Actual | None = None):
        self.s = snapshot
        self.actual = actual
        self.states = states
        self.ct_state = ct_state
        self.visible = visible
        self.nodes = {n.name: n for n in snapshot.nodes}
        self.nodes_by_id = {n.id: n for n in snapshot.nodes}
        self.networks = {n.id: n for n in snapshot.networks}
        self.subnets = {s.id: s for s in snapshot.subnets}
        self.ports = {p.id: p for p in snapshot.ports}
        self.port_at = {(p.node, p.interface): p for p in snapshot.ports if p.node and p.interface}
        self.legs = {ri.id: ri for ri in snapshot.router_interfaces}
        self.routers = {r.id: r for r in snapshot.routers}
        self.pairs = {}      # port id -> (port pair, the other port's id)
        for pp in snapshot.port_pairs:
            self.pairs[pp.ingress_port_id] = (pp, pp.egress_port_id)
            self.pairs[pp.egress_port_id] = (pp, pp.ingress_port_id)
        self.hops: list[dict] = []
        self.leaves: list[dict] = []

    # ------------------------------------------------------------------------------------------ names

    def _name(self, obj, kind: str) -> str:
        project = getattr(obj, "project_id", None)
        if project is not None and not self.visible(project):
            return f"another project's {kind}"
        return obj.name or f"{kind} {obj.id}"

    def owner(self, cookie: int, priority: int = 0) -> dict:
        app, kind, oid = ck.parse_cookie(cookie)
        out = {"app": ck.APPS.get(app, f"app {app}"), "kind": ck.KINDS.get(kind, f"kind {kind}"), "id": oid}
        name = None
        if kind == ck.KIND_STAGE:
            name = "the pipeline's table-miss flow" if priority == 0 else "a fixed flow of the pipeline"
        elif kind == ck.KIND_NODE and oid in self.nodes_by_id:
            name = self.nodes_by_id[oid].name
        elif kind == ck.KIND_NETWORK and oid in self.networks:
            name = self._name(self.networks[oid], "network")
        elif kind == ck.KIND_PORT and oid in self.ports:
            name = self._name(self.ports[oid], "port")
        elif kind in (ck.KIND_PORT, ck.KIND_ROUTER_INTERFACE) and oid in self.legs:   # a router interface's port
            name = self._leg_name(self.legs[oid])
        elif kind == ck.KIND_ROUTER and oid in self.routers:
            name = self._name(self.routers[oid], "router")
        elif kind == ck.KIND_SECURITY_GROUP_RULE:
            name = self._rule_name(oid)
        elif kind == ck.KIND_SECURITY_GROUP:
            g = next((g for g in self.s.security_groups if g.id == oid), None)
            name = self._name(g, "security group") if g else None
        elif kind == ck.KIND_TAP_POLICY:
            t = next((t for t in self.s.tap_policies if t.id == oid), None)
            name = self._name(t, "tap policy") if t else None
        elif kind == ck.KIND_PORT_CHAIN:
            c = next((c for c in self.s.port_chains if c.id == oid), None)
            name = self._name(c, "port chain") if c else None
        elif kind == ck.KIND_FLOATING_IP:
            f = next((f for f in self.s.floating_ips if f.id == oid), None)
            name = (f.ip_address if self.visible(f.project_id) else "another project's floating IP") if f else None
        if name is not None:
            out["name"] = name
        return out

    def _leg_name(self, ri: RouterInterface) -> str:
        router = self.routers.get(ri.router_id)
        name = self._name(router, "router") if router else f"router {ri.router_id}"
        return f"{name} interface {ri.ip_address}"

    def _rule_name(self, rule_id: int) -> str | None:
        r = next((r for r in self.s.security_group_rules if r.id == rule_id), None)
        if r is None:
            return None
        g = next((g for g in self.s.security_groups if g.id == r.group_id), None)
        if g is not None and not self.visible(g.project_id):
            return "another project's security group rule"
        what = {None: "any", 1: "icmp", 6: "tcp", 17: "udp"}.get(r.protocol, str(r.protocol))
        ports = f" {r.port_min}-{r.port_max}" if r.port_min is not None else ""
        remote = f" remote {r.remote_prefix}" if r.remote_prefix else (
            f" remote group {r.remote_group_id}" if r.remote_group_id else "")
        return f"rule {r.id} of security group {g.name if g else r.group_id}: {r.direction} {what}{ports}{remote}"

    def port_name(self, p: Port) -> str:
        return self._name(p, "port")

    # ------------------------------------------------------------------------------------------ the packet

    def _resolve(self, network_id: int, ip: str) -> str | None:
        """The MAC a host of `network_id` gets by ARP for `ip` (fathom answers for bound ports and router
        interfaces)."""
        for p in self.s.ports:
            if p.network_id == network_id and p.node and any(f.ip_address == ip for f in p.fixed_ips):
                return p.mac_address
        for ri in self.s.router_interfaces:
            if ri.network_id == network_id and ri.ip_address == ip:
                return ri.mac_address
        return None

    def _next_hop_mac(self, network_id: int, src_ip: str, dst_ip: str) -> tuple[str | None, str]:
        """(destination MAC, how it was chosen) of a host sending from `src_ip` to `dst_ip`."""
        subnet = next((s for s in self.subnets.values() if s.network_id == network_id
                       and ipaddress.IPv4Address(src_ip) in s.prefix), None)
        if subnet is None:
            return None, f"no subnet of the network holds {src_ip}"
        if ipaddress.IPv4Address(dst_ip) in subnet.prefix:
            mac = self._resolve(network_id, dst_ip)
            return mac, (f"{dst_ip} is on-link: ARP answered with {mac}" if mac
                         else f"ARP for {dst_ip} unanswered: no port of the network has this address")
        if not subnet.gateway_ip:
            return None, f"no route to {dst_ip}: subnet {subnet.cidr} has no gateway"
        mac = self._resolve(network_id, subnet.gateway_ip)
        return mac, (f"via the gateway {subnet.gateway_ip} ({mac})" if mac
                     else f"no route to {dst_ip}: the gateway {subnet.gateway_ip} is no router's interface")

    def destination(self, source: Port, dst: str) -> Port | None:
        """The port `dst` names for `source`: on its network, on a network its routers join, or the
        port behind a floating IP."""
        same = [p for p in self.s.ports if any(f.ip_address == dst for f in p.fixed_ips)]
        for p in same:
            if p.network_id == source.network_id:
                return p
        routers = {ri.router_id for ri in self.s.router_interfaces if ri.network_id == source.network_id}
        routed = {ri.network_id for ri in self.s.router_interfaces if ri.router_id in routers}
        for p in same:
            if p.network_id in routed:
                return p
        fip = next((f for f in self.s.floating_ips if f.ip_address == dst and f.port_id is not None), None)
        return self.ports.get(fip.port_id) if fip else None

    # ------------------------------------------------------------------------------------------ the walk

    def run(self, source: Port, dst: str, proto: str, sport, dport, ttl: int, ct_state: str) -> dict:
        src_ip = _first_ipv4(source)
        if src_ip is None:
            raise TraceError(f"port {source.name or source.id} has no IPv4 address to send from")
        target = self.destination(source, dst)
        mac, how = self._next_hop_mac(source.network_id, src_ip, dst)
        pkt = {"eth_src": source.mac_address, "eth_dst": mac or "ff:ff:ff:ff:ff:ff", "eth_type": ETH_IPV4,
               "ipv4_src": src_ip, "ipv4_dst": dst, "ip_proto": PROTOCOLS[proto], "ttl": ttl, "vlan": None}
        if proto == "icmp":
            pkt.update(icmpv4_type=8, icmpv4_code=0)
        else:
            pkt.update({f"{proto}_src": sport if sport is not None else 49152, f"{proto}_dst": dport})
        result = {"source": {"port": self.port_name(source), "node": source.node, "ip": src_ip},
                  "to": {"ip": dst, "port": self.port_name(target) if target else None},
                  "packet": _show_packet(pkt), "next_hop": how,
                  "assumptions": {"ct_state": ct_state, "state": ACTUAL if self.actual else DESIRED},
                  "hops": self.hops, "leaves": self.leaves}
        node = self.nodes.get(source.node) if source.node else None
        ofport = node.ofport(source.interface) if node else None
        if mac is None:
            self._leaf(None, "dropped", f"the source VM does not send it: {how}")
        elif ofport is None:
            self._leaf(None, "dropped", f"the source port {self.port_name(source)} is down: "
                       + ("not bound to a node" if node is None else f"its interface is not plugged on {node.name}"))
        else:
            self._walk((BR_INT.bridge, node.name), ofport, pkt)
        result["verdict"] = self._verdict(target)
        return result

    def _walk(self, switch: tuple, in_port: int, pkt: dict) -> None:
        queue = deque([(switch, in_port, pkt, None)])
        while queue:
            switch, in_port, pkt, parent = queue.popleft()
            if len(self.hops) >= MAX_HOPS:
                self._leaf(parent, "unknown", f"the trace stops after {MAX_HOPS} hops (a loop?)")
                break
            queue.extend(self._pass(switch, in_port, pkt, parent))

    def _hop(self, kind: str, name: str, in_port: str, parent, **extra) -> dict:
        hop = {"id": len(self.hops), "from": parent, "switch": f"{kind} {name}", "bridge": kind, "name": name,
               "in_port": in_port, "steps": [], "outputs": [], **extra}
        self.hops.append(hop)
        return hop

    def _leaf(self, where, result: str, detail: str, **extra) -> None:
        self.leaves.append({"hop": where, "result": result, "detail": detail, **extra})

    def _pass(self, switch: tuple, in_port: int, pkt: dict, parent) -> list:
        bridge, name = switch
        port_names = self._port_names(bridge, name)
        hop = self._hop(bridge, name, port_names.get(in_port, str(in_port)), parent)
        state = self.states.get(switch)
        if state is None:
            self._leaf(hop["id"], "dropped", f"{bridge} {name} has no desired state (not a switch fathom programs)")
            return []
        tables = tb.tables_of(state)
        try:
            p = tb.run(tables, {**pkt, "in_port": in_port}, self.ct_state)
        except tb.LoopError as e:
            p = e
        pipeline = PIPELINES[bridge]
        if self.actual is not None and bridge in (BR_INT.bridge, BR_PHY.bridge):
            desired = p
            ct = ["trk,new" if self.ct_state == tb.CT_NEW else "trk,est"] * CT_NEXT
            try:
                text = self.actual(name, bridge, ofproto.br_flow({**pkt, "in_port": in_port}), ct)
            except Unanswered as e:
                hop["tables"] = "unknown"
                self._leaf(hop["id"], "unknown", f"{bridge} {name} not traced: {e}")
                return []
            p = ofproto.parse(text, bridge)
            hop["tables"] = "actual"
            differs = self._differs(pipeline, port_names, desired, p)
            if differs:
                hop["differs"] = differs
        elif self.actual is not None:
            hop["tables"] = "desired (no agent runs on a fabric switch)"
        if isinstance(p, tb.LoopError):
            self._leaf(hop["id"], "unknown", str(p))
            return []
        for step in p.steps:
            hop["steps"].append(self._step(pipeline, step))
        for index, why, at in p.ends:
            step = p.steps[index]
            self._leaf(hop["id"], "dropped", self._why(pipeline, step, why, at), step=index)
        nxt = []
        for e in p.out:
            nxt += self._wire(hop, switch, port_names, e)
        return nxt

    def _differs(self, pipeline, port_names: dict, desired, actual: tb.Pass) -> list[dict]:
        """The stages where the switch's actual flows for the packet are not the desired ones (in
        the order the packet meets them), and its outputs when they differ."""
        if isinstance(desired, tb.LoopError):
            return [{"stage": "(all)", "desired": str(desired), "actual": "traced"}]

        def by_table(p: tb.Pass) -> dict[int, list]:
            out: dict[int, list] = {}
            for step in p.steps:
                out.setdefault(step.table, []).append(step.flow)
            return out

        def show(flows: list) -> str:
            if not flows:
                return "not reached"
            return "; ".join("table miss" if f is None else f"priority {f.priority}"
                             + (f" {self._owned(f)}" if f.cookie else "") for f in flows)

        d, a = by_table(desired), by_table(actual)
        out = []
        for table in dict.fromkeys([s.table for s in actual.steps] + [s.table for s in desired.steps]):
            key = [None if f is None else (f.priority, f.cookie) for f in d.get(table, [])]
            if key != [None if f is None else (f.priority, f.cookie) for f in a.get(table, [])]:
                t = pipeline.table(table)
                out.append({"stage": t.name if t else f"table {table}", "table": table,
                            "desired": show(d.get(table, [])), "actual": show(a.get(table, []))})
        ports = [sorted(port_names.get(e.port, str(e.port)) for e in p.out) for p in (desired, actual)]
        if ports[0] != ports[1]:
            out.append({"stage": "ports out", "desired": ", ".join(ports[0]) or "nowhere",
                        "actual": ", ".join(ports[1]) or "nowhere"})
        return out

    def _owned(self, flow) -> str:
        owner = self.owner(flow.cookie, flow.priority)
        if owner["kind"] == "stage":
            return f"({owner.get('name', 'the pipeline')})"
        return f"({owner['kind']} {owner.get('name', owner['id'])})"

    def _step(self, pipeline, step: tb.Step) -> dict:
        t = pipeline.table(step.table)
        out = {"table": step.table, "stage": t.name if t else f"table {step.table}", "depth": step.depth}
        if step.flow is None:
            out.update(priority=None, match=None, actions="drop (table miss)", owner=None)
        else:
            match, actions = (step.flow.match, step.flow.actions_text) if isinstance(step.flow, ofproto.TracedFlow) \
                else tb.describe(step.flow)
            out.update(priority=step.flow.priority, match=match, actions=actions,
                       owner=self.owner(step.flow.cookie, step.flow.priority) if step.flow.cookie else None)
        if step.notes:
            out["notes"] = list(step.notes)
        return out

    def _why(self, pipeline, step: tb.Step, why: str, pkt: dict) -> str:
        t = pipeline.table(step.table)
        stage = t.name if t else f"table {step.table}"
        text = f"{why} at {stage}"
        if step.flow is not None and step.flow.cookie and step.flow.priority > 0:
            owner = self.owner(step.flow.cookie)
            text += f" (flow of {owner['kind']} {owner.get('name', owner['id'])})"
        if stage in ("egress-acl", "ingress-acl"):
            port = self.ports.get(pkt.get(REG_SRC_PORT if stage == "egress-acl" else REG_DST_PORT, 0))
            if port is not None:
                direction = "egress" if stage == "egress-acl" else "ingress"
                groups = [g for g in self.s.security_groups if g.id in port.security_groups]
                named = ", ".join(self._name(g, "security group") for g in groups) or "none"
                text += (f": no {direction} rule of port {self.port_name(port)}'s security groups ({named}) "
                         f"admits it (ct_state {'new' if self.ct_state == tb.CT_NEW else 'established'})")
        elif stage in ("sfc-select", "sfc-deliver"):
            text += ": no instance of the chain hop is up here"
        elif stage == "l3" and step.flow is not None and not step.flow.actions:
            text = f"no route: {text}"
        return text

    def _port_names(self, bridge: str, name: str) -> dict[int, str]:
        if bridge == BR_INT.bridge:
            node = self.nodes.get(name)
            return {v: k for k, v in node.ofports.items()} if node else {}
        if bridge == BR_PHY.bridge:
            node = self.nodes.get(name)
            return {v: k for k, v in node.phy_ofports.items()} if node else {}
        switch = self._tor(name)
        if switch is None:
            return {}
        return {ofport: f"{port} (to {node})" for node, (port, ofport) in self.s.fabric.node_ports(switch).items()
                if ofport is not None}

    def _tor(self, name: str):
        fabric = self.s.fabric
        return next((s for s in fabric.switches if s.name == name), None) if fabric else None

    # ------------------------------------------------------------------------------------------ between switches

    def _wire(self, hop: dict, switch: tuple, names: dict, e: tb.Emitted) -> list:
        bridge, name = switch
        pkt = _on_the_wire(e.packet)
        here = hop["id"]
        if e.port == OFPP_CONTROLLER:
            hop["outputs"].append({"port": "CONTROLLER"})
            self._leaf(here, "controller", "sent to the controller (a packet-in: not followed)")
            return []
        if e.port == OFPP_NORMAL:
            hop["outputs"].append({"port": "NORMAL"})
            self._leaf(here, "uplink", f"NORMAL switching on {bridge} {name} (the underlay: not followed)")
            return []
        iface = names.get(e.port)
        hop["outputs"].append({"port": iface or str(e.port)})
        if iface is None:
            self._leaf(here, "dropped", f"output to port {e.port}, which {bridge} {name} does not have")
            return []
        if bridge == FABRIC_SWITCH.bridge:
            node = next((n for n, (_, ofport) in self.s.fabric.node_ports(self._tor(name)).items()
                         if ofport == e.port), None)
            return self._to_phy(here, node, PHY_UPLINK, pkt)
        if bridge == BR_PHY.bridge:
            if iface == PHY_PATCH:
                return self._to_int(here, name, UPLINK_INTERFACE, pkt)
            if iface == PHY_UPLINK:
                for s in (self.s.fabric.switches if self.s.fabric else ()):
                    _, ofport = self.s.fabric.node_ports(s).get(name, (None, None))
                    if ofport is not None:
                        return [((FABRIC_SWITCH.bridge, s.name), ofport, pkt, here)]
                self._leaf(here, "uplink", f"sent out {name}'s underlay port: no fabric switch known to face it")
                return []
            self._leaf(here, "dropped", f"output to br-phy port {iface}")
            return []
        return self._from_br_int(here, name, iface, pkt, e.packet)

    def _to_int(self, here, node: str, iface: str, pkt: dict) -> list:
        n = self.nodes.get(node)
        ofport = n.ofport(iface) if n else None
        if ofport is None:
            self._leaf(here, "dropped", f"{node} has no {iface} on br-int")
            return []
        return [((BR_INT.bridge, node), ofport, pkt, here)]

    def _to_phy(self, here, node: str | None, iface: str, pkt: dict) -> list:
        n = self.nodes.get(node) if node else None
        ofport = n.phy_ofports.get(iface) if n else None
        if ofport is None or (BR_PHY.bridge, node) not in self.states:
            self._leaf(here, "dropped", f"no br-phy {iface} on {node or 'the node behind this fabric switch port'}")
            return []
        return [((BR_PHY.bridge, node), ofport, pkt, here)]

    def _from_br_int(self, here, node: str, iface: str, pkt: dict, raw: dict) -> list:
        if iface == TUNNEL_INTERFACE:
            remote = next((n for n in self.nodes.values() if n.tunnel_ip and n.tunnel_ip == raw.get("tun_ipv4_dst")), None)
            if remote is None or remote.name == node:
                self._leaf(here, "dropped", f"tunnel to {raw.get('tun_ipv4_dst')}: no other node has this tunnel IP")
                return []
            self.hops[here]["outputs"][-1]["tunnel"] = {"vni": raw.get("tunnel_id"), "to": remote.name,
                                                        "remote_ip": raw.get("tun_ipv4_dst")}
            return self._to_int(here, remote.name, TUNNEL_INTERFACE,
                                {**pkt, "tunnel_id": raw.get("tunnel_id", 0), "tun_ipv4_dst": remote.tunnel_ip,
                                 **({"tun_ipv4_src": self.nodes[node].tunnel_ip} if self.nodes[node].tunnel_ip else {})})
        if iface == UPLINK_INTERFACE:
            if (BR_PHY.bridge, node) in self.states:
                return self._to_phy(here, node, PHY_PATCH, pkt)
            hosts = [p.node for p in self.s.ports if p.mac_address == pkt["eth_dst"] and p.node != node
                     and self.nodes.get(p.node) and self.nodes[p.node].ofport(UPLINK_INTERFACE) is not None]
            if not hosts:
                self._leaf(here, "uplink", f"sent out {node}'s uplink (VLAN {pkt.get('vlan')}): the physical network "
                           f"beyond is not fathom's")
                return []
            return [s for h in sorted(set(hosts)) for s in self._to_int(here, h, UPLINK_INTERFACE, pkt)]
        if iface == EXTERNAL_INTERFACE:
            return self._upstream(here, node, pkt)
        leg = next((ri for ri in self.s.router_interfaces if router_port_interface(ri.id) == iface), None)
        if leg is not None:
            return self._namespace_router(here, node, leg, pkt)
        port = self.port_at.get((node, iface))
        if port is None:
            self._leaf(here, "host", f"to {iface} on {node} (a host-local service port, e.g. DHCP)")
            return []
        tap = raw.get(REG_TAP, 0)
        if tap:
            self._leaf(here, "copy", f"a tap copy delivered to monitor port {self.port_name(port)}",
                       port=self.port_name(port), node=node)
            return []
        if port.id in self.pairs and pkt.get("eth_dst") == port.mac_address \
                and all(f.ip_address != pkt.get("ipv4_dst") for f in port.fixed_ips):
            return self._vnf(here, port, pkt)
        if pkt.get("eth_dst") == port.mac_address or int(pkt["eth_dst"].split(":")[0], 16) & 1:
            self._leaf(here, "delivered", f"delivered to port {self.port_name(port)} on {node}",
                       port=self.port_name(port), port_id=port.id, node=node)
        else:
            self._leaf(here, "flooded", f"a flooded copy reaches port {self.port_name(port)}, which it is not "
                       f"addressed to (the VM discards it)", port=self.port_name(port))
        return []

    def _namespace_router(self, here, node: str, leg: RouterInterface, pkt: dict) -> list:
        """A network-node router: the namespace routes between its legs as Linux does."""
        router = self.routers.get(leg.router_id)
        hop = self._hop("router-namespace", f"{self._name(router, 'router') if router else leg.router_id} on {node}",
                        router_port_interface(leg.id), here)
        if pkt.get("eth_dst") != leg.mac_address or pkt.get("eth_type") != ETH_IPV4:
            self._leaf(hop["id"], "dropped", "not IPv4 to the router interface's MAC: the namespace does not route it")
            return []
        dst = ipaddress.IPv4Address(pkt["ipv4_dst"])
        out = max((ri for ri in self.s.router_interfaces if ri.router_id == leg.router_id
                   and ri.subnet_id in self.subnets and dst in self.subnets[ri.subnet_id].prefix),
                  key=lambda ri: self.subnets[ri.subnet_id].prefix.prefixlen, default=None)
        if out is None:
            self._leaf(hop["id"], "dropped", f"no route to {dst} in the router's namespace")
            return []
        mac = self._resolve(out.network_id, str(dst))
        if mac is None or pkt.get("ttl", 64) <= 1:
            self._leaf(hop["id"], "dropped", f"no neighbour {dst} on the router's interface {out.ip_address}"
                       if mac is None else "TTL expired in the router's namespace")
            return []
        hop["steps"].append({"stage": "linux routing", "match": f"ip_dst {dst} in {self.subnets[out.subnet_id].cidr}",
                             "actions": f"out of {router_port_interface(out.id)}: dl_src {out.mac_address}, "
                                        f"dl_dst {mac}, ttl-1", "owner": self.owner(
                                            ck.cookie(ck.APP_TENANT, ck.KIND_ROUTER_INTERFACE, out.id))})
        hop["outputs"].append({"port": router_port_interface(out.id)})
        routed = {**pkt, "eth_src": out.mac_address, "eth_dst": mac, "ttl": pkt.get("ttl", 64) - 1}
        return self._to_int(hop["id"], node, router_port_interface(out.id), routed)

    def _vnf(self, here, port: Port, pkt: dict) -> list:
        """A VNF instance: a router between its two ports (docs/sfc.md)."""
        pair, other_id = self.pairs[port.id]
        other = self.ports.get(other_id)
        hop = self._hop("vnf", self._name(pair, "port pair"), self.port_name(port), here)
        node = self.nodes.get(other.node) if other and other.node else None
        ofport = node.ofport(other.interface) if node else None
        if ofport is None:
            self._leaf(hop["id"], "dropped", f"chain hop down: the VNF's port {self.port_name(other) if other else other_id} "
                       f"is not plugged")
            return []
        src_ip = _first_ipv4(other) or pkt["ipv4_src"]
        mac, how = self._next_hop_mac(other.network_id, src_ip, pkt["ipv4_dst"])
        if mac is None or pkt.get("ttl", 64) <= 1:
            self._leaf(hop["id"], "dropped", how if mac is None else "TTL expired in the VNF")
            return []
        hop["steps"].append({"stage": "vnf (IP forwarding)", "match": f"in on {self.port_name(port)}",
                             "actions": f"out of {self.port_name(other)}: dl_src {other.mac_address}, {how}, ttl-1",
                             "owner": None})
        hop["outputs"].append({"port": self.port_name(other)})
        out = {**pkt, "eth_src": other.mac_address, "eth_dst": mac, "ttl": pkt.get("ttl", 64) - 1}
        return self._to_int(hop["id"], node.name, other.interface, out)

    def _upstream(self, here, node: str, pkt: dict) -> list:
        """The external network's upstream router: a floating IP or router gateway address of this cloud
        goes back to the gateway node hosting it; anything else leaves the cloud."""
        dst = pkt.get("ipv4_dst")
        fip = next((f for f in self.s.floating_ips if f.ip_address == dst and f.router_id is not None), None)
        router_id = fip.router_id if fip else next(
            (g.router_id for g in self.s.router_gateways if g.ip_address == dst), None)
        gw = next((g for g in self.s.router_gateways if g.router_id == router_id), None)
        ext = self.networks.get(gw.network_id) if gw else None
        if gw is None or gw.node is None or ext is None:
            self._leaf(here, "uplink", f"sent out {node}'s external port ({EXTERNAL_INTERFACE}) to the upstream router")
            return []
        hop = self._hop("upstream", f"router of {self._name(ext, 'network')}", EXTERNAL_INTERFACE, here)
        hop["steps"].append({"stage": "provider router (outside fathom)", "match": f"ip_dst {dst}",
                             "actions": f"back to {gw.node}'s {EXTERNAL_INTERFACE}: dl_dst {gw.mac_address} "
                                        f"(ARP answered by the gateway node), ttl-1 (assumed)", "owner": None})
        hop["outputs"].append({"port": EXTERNAL_INTERFACE})
        back = {**pkt, "eth_src": ext.upstream_mac or pkt["eth_dst"], "eth_dst": gw.mac_address,
                "ttl": pkt.get("ttl", 64) - 1, "vlan": ext.segmentation_id if ext.type == "vlan" else None}
        return self._to_int(hop["id"], gw.node, EXTERNAL_INTERFACE, back)

    # ------------------------------------------------------------------------------------------ verdict

    def _verdict(self, target: Port | None) -> dict:
        delivered = [lf for lf in self.leaves if lf["result"] == "delivered"]
        if target is not None:
            hit = next((lf for lf in delivered if lf.get("port_id") == target.id), None)
            if hit:
                return {"result": "delivered", "port": hit["port"], "node": hit["node"], "reason": hit["detail"]}
        if delivered and target is None:
            lf = delivered[0]
            return {"result": "delivered", "port": lf["port"], "node": lf["node"], "reason": lf["detail"]}
        out = next((lf for lf in self.leaves if lf["result"] == "uplink"), None)
        if out is not None:
            return {"result": "uplink", "reason": out["detail"]}
        unknown = next((lf for lf in self.leaves if lf["result"] == "unknown"), None)
        if unknown is not None:
            return {"result": "unknown", "reason": unknown["detail"]}
        down = self._down(target)
        drops = [lf for lf in self.leaves if lf["result"] in ("dropped", "unknown")]
        reason = drops[0]["detail"] if drops else (
            "only flooded copies reach other ports" if self.leaves else "nothing was sent")
        if down:
            reason = f"{down}; {reason}"
        if delivered:
            reason += f"; delivered instead to {', '.join(lf['port'] for lf in delivered)}"
        return {"result": "dropped", "reason": reason}

    def _down(self, target: Port | None) -> str | None:
        if target is None:
            return None
        node = self.nodes.get(target.node) if target.node else None
        if node is None:
            return f"the destination port {self.port_name(target)} is down: not bound to a node"
        if node.ofport(target.interface) is None:
            return f"the destination port {self.port_name(target)} is down: its interface is not plugged on {node.name}"
        return None


def passed_through(step: dict) -> bool:
    """A stage the packet only crossed: its table-miss flow goes on to the next table (a table or a
    picture of the trace may leave it out)."""
    owner = step.get("owner") or {}
    return owner.get("kind") == "stage" and step["actions"].startswith("goto_table") and not step.get("notes")


def _on_the_wire(pkt: dict) -> dict:
    """What leaves a switch: headers only (registers, metadata, conntrack and tunnel fields stay behind)."""
    keep = ("eth_src", "eth_dst", "eth_type", "vlan", "ipv4_src", "ipv4_dst", "ip_proto", "ttl",
            "tcp_src", "tcp_dst", "udp_src", "udp_dst", "icmpv4_type", "icmpv4_code", "arp_op", "arp_spa",
            "arp_tpa", "arp_sha", "arp_tha")
    return {k: pkt[k] for k in keep if k in pkt}


def _show_packet(pkt: dict) -> dict:
    return {k: v for k, v in pkt.items() if v is not None}
