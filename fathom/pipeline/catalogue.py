"""The pipelines as data: one declaration per bridge kind (br-int, br-phy, the fabric switch).

A `Table` says what a table is for, what happens to a frame no flow claims (`miss`), which tables
its flows may continue to (`next`: goto_table, resubmit, group buckets), and which registers and
header fields its flows may write (`writes`). From the declarations come the skeleton flows of
every bridge (the table-miss flow of each table plus the bridge's fixed flows), the table reference
in docs/pipeline.md (`reference_markdown`), and the checks every compiled flow must pass
(`Pipeline.check`, run by the tests over every app's output).

Invariants that follow from `writes` (checked, not only written down): on br-int only classify, l3
and the NAT stages of a router's external gateway (nat-route, snat) write REG_NETWORK, so only a
route moves a frame into another network; only classify writes
REG_SRC_PORT; only l2 chooses REG_OUT_PORT.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fathom.openflow.spec import (
    Controller, Ct, FlowSpec, GotoTable, Group, LoadReg, Move, Output, Resubmit, SetField,
)
from fathom.pipeline import cookies as ck

OFPP_NORMAL = 0xFFFFFFFA
ETH_TYPE_LLDP = 0x88CC
DROP, NORMAL = "drop", "normal"

# br-int registers (os-ken field names)
REG_SRC_PORT = "reg5"   # fathom id of the local port the frame came from; 0 if it came from remote
REG_NETWORK = "reg6"    # fathom id of the network the frame is in (changed by routing)
REG_OUT_PORT = "reg7"   # OpenFlow port chosen by l2, output by the output stage
REG_TAP = "reg8"        # vTAP: marker of the policy copy a frame is; 0 = none
REG_DST_PORT = "reg9"   # security groups: fathom id of the local port a frame is delivered to
REG_CHAIN_HOP = "reg10" # service chains: the chain hop a frame goes to next; 0 = not steered
REG_CT_ZONE = "reg11"   # security groups: bits 0..15 the conntrack zone (1..0x7FFF) of the filtered port's
                        # network; bit 16: committed by egress-acl in this pass
# Conntrack zones on br-int: security groups use 1..0x7FFF (one per network on each node), the external
# app 0x8000..0xFFFF (one per router gateway and per floating IP, allocated in the store): disjoint
# by construction.
SECGROUP_ZONE_MAX = 0x7FFF
REGISTERS = {REG_SRC_PORT: "fathom id of the local port the frame came from; 0 for frames from the tunnel or uplink",
             REG_NETWORK: "fathom id of the network the frame is in (\"network metadata\")",
             REG_OUT_PORT: "OpenFlow port the output stage sends the frame to",
             REG_TAP: "vTAP marker of a copy ([vtap.md](vtap.md)); 0 = not a copy",
             REG_DST_PORT: "fathom id of the local port a frame is delivered to, for its security groups "
                           "([security-groups.md](security-groups.md)); 0 otherwise",
             REG_CHAIN_HOP: "service chains: the chain hop (chain, direction, group) a frame is steered to "
                            "([sfc.md](sfc.md)); 0 = not steered",
             REG_CT_ZONE: "security groups: bits 0..15 the conntrack zone (1..0x7FFF) of the network of the port "
                          "whose rules filter the frame, bit 16 set once egress-acl committed its connection "
                          "in this pass ([security-groups.md](security-groups.md)); zones 0x8000 and up are "
                          "the external app's ([external.md](external.md))"}

_ARP_REPLY = frozenset({"eth_src", "eth_dst", "arp_op", "arp_sha", "arp_tha", "arp_spa", "arp_tpa"})
_TUNNEL = frozenset({"tunnel_id", "tun_ipv4_dst"})


@dataclass(frozen=True)
class Fixed:
    """A flow every bridge of the kind holds whatever the apps want (e.g. LLDP to the controller)."""
    priority: int
    match: dict
    actions: tuple
    object_id: int | None = None     # cookie object id; default: the table's skeleton object id


@dataclass(frozen=True)
class Table:
    name: str
    number: int
    doc: str
    miss: str = DROP                                # DROP, NORMAL or the name of the next table
    next: tuple[str, ...] = ()                      # tables a flow may continue to
    writes: frozenset[str] = frozenset()            # registers and fields a flow may write
    fixed: tuple[Fixed, ...] = ()


@dataclass(frozen=True)
class Pipeline:
    bridge: str
    tables: tuple[Table, ...]
    skeleton_app: int                  # app byte of the skeleton flows' cookies
    skeleton_base: int = 0             # skeleton cookie object id = base | table number
    doc: str = ""
    by_name: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self):
        self.by_name.update({t.name: t for t in self.tables})
        numbers = [t.number for t in self.tables]
        if len(set(numbers)) != len(numbers) or numbers != sorted(numbers):
            raise ValueError(f"{self.bridge}: table numbers must be unique and in pipeline order")
        for t in self.tables:
            for n in t.next + ((t.miss,) if t.miss not in (DROP, NORMAL) else ()):
                if n not in self.by_name or self.by_name[n].number <= t.number:
                    raise ValueError(f"{self.bridge}: table {t.name} may only continue to a later declared table, "
                                     f"not {n!r}")

    def number(self, name: str) -> int:
        return self.by_name[name].number

    def table(self, number: int) -> Table | None:
        return next((t for t in self.tables if t.number == number), None)

    def skeleton_cookie(self, table: Table, object_id: int | None = None) -> int:
        return ck.cookie(self.skeleton_app, ck.KIND_STAGE,
                         object_id if object_id is not None else self.skeleton_base | table.number)

    def skeleton(self) -> frozenset[FlowSpec]:
        """The table-miss flow of every table and the bridge's fixed flows."""
        flows = set()
        for t in self.tables:
            if t.miss == DROP:
                miss = ()
            elif t.miss == NORMAL:
                miss = (Output(OFPP_NORMAL),)
            else:
                miss = (GotoTable(self.number(t.miss)),)
            flows.add(FlowSpec(t.number, 0, {}, miss, self.skeleton_cookie(t)))
            for f in t.fixed:
                flows.add(FlowSpec(t.number, f.priority, f.match, f.actions, self.skeleton_cookie(t, f.object_id)))
        return frozenset(flows)

    def check(self, flows, groups=()) -> list[str]:
        """What in these flows breaks the declaration: a table not declared, a continuation to a table
        not in `next`, a write not in `writes` (group buckets count for the table that uses them)."""
        by_id = {g.group_id: g for g in groups}
        problems = []
        for f in flows:
            t = self.table(f.table)
            if t is None:
                problems.append(f"{self.bridge}: table {f.table} is not declared: {f.to_ofctl()}")
                continue
            allowed_next = {self.number(n) for n in t.next} | (
                {self.number(t.miss)} if t.miss not in (DROP, NORMAL) else set())
            for a in _actions(f.actions, by_id):
                target = a.table if isinstance(a, (GotoTable, Resubmit, Ct)) else None
                if target is not None and target not in allowed_next:
                    problems.append(f"{self.bridge} {t.name}: continues to table {target}, not declared: {f.to_ofctl()}")
                written = _written(a)
                if written is not None and written not in t.writes:
                    problems.append(f"{self.bridge} {t.name}: writes {written}, not declared: {f.to_ofctl()}")
        return problems


def _actions(actions, groups):
    for a in actions:
        yield a
        if isinstance(a, Ct):
            yield from a.exec
        if isinstance(a, Group) and a.group_id in groups:
            for bucket in groups[a.group_id].buckets:
                yield from _actions(bucket, groups)


def _written(a) -> str | None:
    if isinstance(a, SetField):
        return a.field
    if isinstance(a, LoadReg):
        return a.field
    if isinstance(a, Move):
        return a.dst
    return None


# ---------------------------------------------------------------------------------------------- br-int

BR_INT = Pipeline("br-int", skeleton_app=ck.APP_PIPELINE, doc="every node's integration bridge: VMs, tunnel, uplink", tables=(
    Table("classify", 0, "in_port of a local port → `reg6` := network, `reg5` := port id; `vxlan0` + `tun_id`=VNI "
          "→ `reg6`, to l2; `patch-phy` + VLAN id → pop VLAN, `reg6`, to l2; `patch-phy` untagged → the flat "
          "network, to l2; `vxlan0` + `tun_id`=tap marker → `reg8`, to tap-recovery; `vxlan0` + `tun_id`=chain hop "
          "marker → `reg9`, to sfc-deliver; on a gateway node: `ext0` (+ VLAN id) → the external network, to nat-in; "
          "from `vxlan0`/`patch-phy` to a router interface MAC of a router whose gateway the node hosts → `reg6`, "
          "to snat",
          next=("tap-ingress", "sfc-deliver", "nat-in", "snat", "l2", "tap-recovery"),
          writes=frozenset({REG_SRC_PORT, REG_NETWORK, REG_TAP, REG_CHAIN_HOP})),
    Table("tap-ingress", 10, "vTAP rewriting rules for frames sent by local ports: match a policy → group ALL "
          "(original → security, copy → tap-recovery); see [vtap.md](vtap.md)",
          miss="security", next=("tap-recovery",), writes=frozenset({"eth_dst", "ipv4_dst", REG_TAP})),
    Table("security", 20, "port security: from port P, IPv4 only from P's MAC and fixed IPs, ARP only with P's "
          "MAC/IP as sender, other ethertypes only from P's MAC", next=("arp",)),
    Table("arp", 30, "ARP requests for a known address (every bound port and every router interface of the "
          "frame's network) are turned into replies and sent back out of `IN_PORT`; a port asking about "
          "its own address goes on to sfc",
          miss="egress-conntrack", next=("sfc",), writes=_ARP_REPLY),
    Table("egress-conntrack", 32, "security groups, frames a local port sends: IPv4 and IPv6 from a port "
          "with security groups → `reg11` := the zone of the port's network on this node, `ct(zone=reg11, "
          "table=egress-acl)`; anything else (ARP, a port without port security) goes on; see "
          "[security-groups.md](security-groups.md)",
          miss="sfc", next=("egress-acl",), writes=frozenset({REG_CT_ZONE})),
    Table("egress-acl", 35, "the sending port's egress rules on the connection: invalid → drop; "
          "established or related → on while the rule that admitted it on this side (`ct_mark` for the "
          "originator, `ct_label` for the responder's replies) still applies to the port; new → a rule "
          "(conjunctive match: port × remote × protocol) commits it with `ct_mark` := rule id and sets "
          "`reg11` bit 16 (committed in this pass); anything else → drop",
          next=("sfc",), writes=frozenset({"ct_mark", REG_CT_ZONE})),
    Table("sfc", 40, "service chains, where a frame enters or moves on: from a chain's source port and "
          "matching one of its flow classifiers, or IPv4 coming back from a VNF's egress port (its ingress "
          "port: a symmetric chain's replies) → `reg10` := the chain hop it goes to next; to sfc-select; "
          "see [sfc.md](sfc.md)", miss="l3", next=("sfc-select",), writes=frozenset({REG_CHAIN_HOP})),
    Table("sfc-select", 42, "`reg10` = chain hop → that hop's select group: one bucket per VNF instance, "
          "chosen by a symmetric hash of the 5-tuple (one instance: its bucket's actions in the flow); a bucket "
          "sets the instance port's MAC as destination and outputs to it, or carries the hop in `tun_id` to the "
          "instance's node", writes=frozenset({"eth_dst"}) | _TUNNEL),
    Table("sfc-deliver", 44, "chain frames from another node (`reg10` = hop, destination MAC = a local VNF "
          "instance's port) → output to that port"),
    Table("nat-in", 46, "frames from the external network on a gateway node ([external.md](external.md)): ARP "
          "requests for a router gateway IP or an associated floating IP hosted here answered; IPv4 to a floating IP → "
          "`ct(commit, zone=FIP's, nat(dst=fixed IP))`, to a router gateway IP → `ct(zone=router's, nat)` (replies "
          "of SNAT only); both recirculate to nat-route", next=("nat-route",), writes=_ARP_REPLY | {"vlan_vid"}),
    Table("nat-route", 48, "after conntrack: (`ct_zone`, destination in a subnet of the zone's router) → src MAC "
          ":= router interface MAC, TTL − 1, `reg6` := the subnet's network; to l3-neighbor",
          next=("l3-neighbor",), writes=frozenset({"eth_src", REG_NETWORK})),
    Table("l3", 50, "distributed routing: frame to a router interface's MAC, IPv4 to a subnet on the same router "
          "→ src MAC := outgoing interface MAC, TTL − 1, `reg6` := destination network; to l3-neighbor. A router "
          "with an external gateway: anything else to its MAC → snat on the gateway node, elsewhere to l2 (which "
          "carries it to the gateway node)",
          miss="l2", next=("l3-neighbor", "snat"), writes=frozenset({"eth_src", REG_NETWORK})),
    Table("l3-neighbor", 55, "routed frames only: destination IP → destination MAC, to l2",
          next=("l2",), writes=frozenset({"eth_dst"})),
    Table("snat", 57, "gateway node, a tenant network's frame to its router leaving for the external network: "
          "TTL − 1, src MAC := router gateway MAC, dst MAC := the upstream's, `reg6` := external network, "
          "`ct(commit, nat(src=floating IP))` in the FIP's zone for a port with one, else "
          "`ct(commit, nat(src=router gateway IP))` in the router's zone; to l2",
          next=("l2",), writes=frozenset({"eth_src", "eth_dst", REG_NETWORK})),
    Table("l2", 60, "`(reg6, dst MAC)` → local port (`reg7` := ofport), or owning node (set `tun_id`=VNI, "
          "`tun_dst`=node tunnel IP, `reg7` := vxlan0), or uplink (push VLAN id / untagged for flat, `reg7` := "
          "patch-phy); anything else (broadcast, multicast, unknown unicast) → the network's flood group",
          next=("tap-egress", "tap-recovery"), writes=frozenset({REG_OUT_PORT, "vlan_vid"}) | _TUNNEL),
    Table("tap-egress", 65, "vTAP at the egress to a local port (a policy whose sender is `*`), for unicast "
          "frames l2 delivers to it (`reg7` = its ofport): match a policy → group ALL (original → tap-recovery, "
          "where it matches no marker and goes on; copy: `reg8` := marker → tap-recovery); see [vtap.md](vtap.md)",
          miss="tap-recovery", next=("tap-recovery",), writes=frozenset({REG_TAP})),
    Table("tap-recovery", 70, "vTAP copies (`reg8` = marker): to a local monitor with the original headers "
          "restored, or to the monitor's node over the tunnel with `tun_id` = marker; see [vtap.md](vtap.md)",
          miss="ingress-conntrack", writes=frozenset({"eth_src", "eth_dst", "ipv4_dst"}) | _TUNNEL),
    Table("ingress-conntrack", 72, "security groups, frames delivered to a local port (`reg7` = its ofport; "
          "switched, routed, from the tunnel or the uplink alike): IPv4 and IPv6 to a port with security "
          "groups, already tracked in the zone of the port's network in this pass (by its sender's egress: "
          "`ct_state=+trk` and `ct_zone`, or `reg11` = zone + bit 16 after its commit) → `reg9` := port id, "
          "to ingress-acl; otherwise `ct_clear`, `reg9` := port id, `reg11` := the zone, `ct(zone=reg11, "
          "table=ingress-acl)`; DHCP answers (udp 67 → 68, always allowed as in Neutron) and anything else "
          "go on", miss="output", next=("ingress-acl",), writes=frozenset({REG_DST_PORT, REG_CT_ZONE})),
    Table("ingress-acl", 75, "the receiving port's ingress rules, as egress-acl (`ct_label` for the "
          "responder, `ct_mark` for the originator's replies; a new connection is committed with "
          "`ct_label` := rule id)", next=("output",), writes=frozenset({"ct_label"})),
    Table("output", 80, "`reg7` → `output:reg7`"),
))

# ---------------------------------------------------------------------------------------------- br-phy

BR_PHY = Pipeline("br-phy", skeleton_app=ck.APP_FABRIC, skeleton_base=0x100,
                  doc="every node's physical bridge: the underlay port and the tunnel endpoint", tables=(
    Table("normal", 0, "NORMAL switching of the underlay; LLDP from the fabric switch → controller (link discovery); "
          "the VLAN trunk as a fixed pipe: everything from `patch-int` → `ul0`, tagged frames from `ul0` → "
          "`patch-int` (no MAC learning on the trunk)",
          miss=NORMAL, fixed=(Fixed(1000, {"eth_type": ETH_TYPE_LLDP}, (Controller(),), object_id=0x101),)),
))

# ---------------------------------------------------------------------------------------------- fabric switch

FABRIC_SWITCH = Pipeline("fabric-switch", skeleton_app=ck.APP_FABRIC, skeleton_base=0x200,
                         doc="the top-of-rack switch (br-fabric): VLAN trunks to the nodes, SVIs of fabric routers", tables=(
    Table("trunk-in", 0, "LLDP → controller; untagged = underlay → NORMAL; (in_port, VLAN) allowed → svi; "
          "else drop", next=("svi",),
          fixed=(Fixed(1000, {"eth_type": ETH_TYPE_LLDP}, (Controller(),)),
                 Fixed(50, {"vlan_vid": 0x0000}, (Output(OFPP_NORMAL),)))),
    Table("svi", 10, "fabric routers: ARP for a gateway answered; routed: src MAC, TTL − 1, VLAN → svi-neigh",
          miss="l2", next=("svi-neigh",), writes=_ARP_REPLY | {"vlan_vid"}),
    Table("svi-neigh", 15, "routed frame: destination IP → destination MAC; unknown → drop",
          next=("l2",), writes=frozenset({"eth_dst"})),
    Table("l2", 20, "(VLAN, dst MAC) → the port facing the node hosting it; else flood the VLAN's group"),
))

PIPELINES = {p.bridge: p for p in (BR_INT, BR_PHY, FABRIC_SWITCH)}


def reference_markdown(pipeline: Pipeline) -> str:
    """The table reference of one bridge kind for docs/pipeline.md (tests check the doc holds it)."""
    def miss(t: Table) -> str:
        return {DROP: "drop", NORMAL: "NORMAL"}.get(t.miss) or f"→ {t.miss}"

    def names(items) -> str:
        return ", ".join(f"`{x}`" for x in sorted(items)) or "—"

    lines = ["| table | name | what it does | next | writes | table miss |", "|---|---|---|---|---|---|"]
    for t in pipeline.tables:
        lines.append(f"| {t.number} | {t.name} | {t.doc} | {', '.join(t.next) or '—'} | {names(t.writes)} | {miss(t)} |")
    return "\n".join(lines) + "\n"


DOC_BEGIN = "<!-- generated from fathom/pipeline/catalogue.py: {bridge} -->"
DOC_END = "<!-- end of generated table -->"


def update_doc(text: str) -> str:
    """`text` with the table reference of each bridge kind written between its markers."""
    for p in PIPELINES.values():
        begin = DOC_BEGIN.format(bridge=p.bridge)
        if begin not in text:
            continue
        head, rest = text.split(begin, 1)
        _, tail = rest.split(DOC_END, 1)
        text = f"{head}{begin}\n{reference_markdown(p)}{DOC_END}{tail}"
    return text


if __name__ == "__main__":
    import sys
    from pathlib import Path

    doc = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/pipeline.md")
    doc.write_text(update_doc(doc.read_text()))
