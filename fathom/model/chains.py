"""Port chains in the model: their hop markers and limits (the sfc app steers by them, the store
checks them), their VNF instances in path order, and PPTMon on them: where a measured chain's
programs go, as host-local objects.

A port chain with `pptmon` set is measured on every VNF instance (port pair) of every group, on the
node its ports are bound to. The programs sit on the host side of the VNF's ports — the interfaces
the node's agent sees (`Port.interface`, the VIF on the node's br-int):

- `ppt_in` where packets enter the VNF: the egress of its ingress port's host interface (towards
  the VM);
- `ppt_out` where they leave it: the ingress of its egress port's host interface (from the VM).

The controller names the br-int interfaces; the node's agent places the programs on the VM-facing
interfaces behind them (fathom.agent.plugging), for it alone sees how a VIF is plugged: with hybrid
plugging (tap → Linux bridge → veth → br-int) on any datapath, or plugged directly on OVS's kernel
datapath, the VM's packets pass TC ingress of the VM-facing interface before a switch takes them.
Plugged directly on the userspace datapath (`netdev`), OVS reads them with a packet socket, served
*before* TC ingress: the programs would see the packet but OVS would forward it unchanged. There the
agent reports the instance `error`, saying so; while an interface is missing, `pending`.

Only the forward direction is measured (a symmetric chain's replies cross the other hooks).
Roles follow the chain's order: the first group's instances are sources (they sample, one packet
every `period_ns`), the middle ones transit, the last group's sinks (they report each sampled
packet and remove the option); a chain of one group is source-sink. Every instance of a group has
its group's role.

Each instance gets its own VNF id (1-byte, in the option's entries): 1, 2, ... in path order
(groups in chain order, instances in port pair id order). The controller maps a record's VNF ids
back to groups and port pairs with the same numbering (`chain_instances`), from the model, when the
record arrives from the sink's node (also once `pptmon` is off again: the last samples arrive
after); the records are filed under `chain_label(chain id)`, a name
that operator attachments cannot use (it has a colon).

`lost_across` compares what the first group's instances stamped with what reached the last
group's (the loaders' counters, which the agents report): a VNF that terminates TCP (a proxy)
cannot carry the option across, and the chain says so (`lost_warning`) instead of measuring nothing
in silence. A change of the chain's path restarts every instance's counters (the attachments carry
the path), and only counters of the current attachments are compared.

The objects' owner is ("port_chain_vnf", port pair id) (a pair is in at most one group, a group in
at most one chain); the chain's status is the worst of its instances' (`chain_pptmon_status`, which
the sfc app's status reports).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from fathom.model import Snapshot
from fathom.model.hostlocal import PptmonAttach, digest, owner_key
from fathom.model.status import Status, worst

# Hop markers: SFC_VNI_BASE | chain << 7 | direction << 6 | group index. VNIs 0xE00000..0xEFFFFF are
# chain hops, never tenant networks (vTAP's markers are 0xF00000 and up).
SFC_VNI_BASE = 0xE00000
MAX_CHAIN_ID = (1 << 13) - 1
MAX_GROUPS = 64
MAX_INSTANCES = 32


def hop_marker(chain_id: int, direction: int, index: int) -> int:
    if not 0 < chain_id <= MAX_CHAIN_ID or not 0 <= index < MAX_GROUPS or direction not in (0, 1):
        raise ValueError(f"no hop marker for chain {chain_id}, direction {direction}, group {index}")
    return SFC_VNI_BASE | chain_id << 7 | direction << 6 | index


def parse_hop_marker(value: int) -> tuple[int, int, int] | None:
    """(chain id, direction, group index) of a hop marker; None for any other value."""
    if value & ~0xFFFFF != SFC_VNI_BASE:
        return None
    return (value >> 7) & MAX_CHAIN_ID, (value >> 6) & 1, value & 0x3F


@dataclass(frozen=True)
class VnfPort:
    """One VNF instance of a chain, in path order: where per-VNF tools attach (PPTMon: `role`)."""
    chain_id: int
    position: int               # index of its group in the chain
    group_id: int
    pair_id: int
    node: str | None
    ingress_interface: str | None
    egress_interface: str | None
    role: str                   # source | transit | sink | source-sink (PPTMon's modes)


def _role(position: int, n: int) -> str:
    if n == 1:
        return "source-sink"
    return "source" if position == 0 else "sink" if position == n - 1 else "transit"


def chain_vnf_ports(snapshot: Snapshot, chain_id: int) -> list[VnfPort]:
    """The VNF instances of a chain in path order (all instances of a group share its position;
    within a group, by port pair id)."""
    chain = next((c for c in snapshot.port_chains if c.id == chain_id), None)
    if chain is None:
        return []
    ports = {p.id: p for p in snapshot.ports}
    pairs = {p.id: p for p in snapshot.port_pairs}
    groups = {g.id: g for g in snapshot.port_pair_groups}
    out = []
    n = len(chain.port_pair_group_ids)
    for k, gid in enumerate(chain.port_pair_group_ids):
        g = groups.get(gid)
        for pair in ([pairs[i] for i in sorted(g.port_pair_ids) if i in pairs] if g else []):
            ing, egr = ports.get(pair.ingress_port_id), ports.get(pair.egress_port_id)
            out.append(VnfPort(chain.id, k, gid, pair.id, ing.node if ing else None,
                               ing.interface if ing else None, egr.interface if egr else None, _role(k, n)))
    return out


OWNER_KIND = "port_chain_vnf"
MAX_PPTMON_GROUPS = 8          # entries in the option (fathom.pptmon.wire.MAX_HOPS)
MAX_PPTMON_INSTANCES = 255     # VNF ids are one byte; 0 is not used
LABEL_PREFIX = "port_chain:"


def chain_label(chain_id: int) -> str:
    """The chain name a measured port chain's records are filed under."""
    return f"{LABEL_PREFIX}{chain_id}"


def parse_chain_label(label: str) -> int | None:
    """The port chain id of `chain_label(id)`, None for any other name."""
    rest = label[len(LABEL_PREFIX):] if label.startswith(LABEL_PREFIX) else ""
    return int(rest) if rest.isascii() and rest.isdigit() and len(rest) <= 10 else None


@dataclass(frozen=True)
class ChainVnf:
    """One measured VNF instance of a chain. `node` is None while its ports are not bound to one
    node with interfaces (then it has no attachment: `problem` says why)."""
    chain_id: int
    position: int              # index of its group in the chain
    group_id: int
    pair_id: int
    vnf_id: int                # its id in the option's entries
    role: str                  # source | transit | sink | source-sink
    node: str | None
    in_point: str | None       # "<interface>:egress" (into the VM)
    out_point: str | None      # "<interface>:ingress" (out of the VM)
    problem: str | None = None
    fatal: bool = False        # the problem will not pass by itself (status error, not pending)


def chain_pptmon(snapshot: Snapshot, chain_id: int) -> list[ChainVnf]:
    """The measured instances of a chain in path order ([] for a chain without pptmon or with more
    instances than VNF ids)."""
    chain = next((c for c in snapshot.port_chains if c.id == chain_id), None)
    return chain_instances(snapshot, chain_id) if chain is not None and chain.pptmon is not None else []


def chain_instances(snapshot: Snapshot, chain_id: int) -> list[ChainVnf]:
    """A chain's instances as PPTMon numbers them, whether or not it is measured now: the records of
    a chain keep arriving for a moment after its `pptmon` is turned off (the sink's last samples
    are on their way), and they are filed and shown with these ids. [] for an unknown chain or one
    with more instances than VNF ids."""
    chain = next((c for c in snapshot.port_chains if c.id == chain_id), None)
    if chain is None:
        return []
    vnfs = chain_vnf_ports(snapshot, chain_id)
    if len(vnfs) > MAX_PPTMON_INSTANCES or len(chain.port_pair_group_ids) > MAX_PPTMON_GROUPS:
        return []
    ports = {p.id: p for p in snapshot.ports}
    pairs = {p.id: p for p in snapshot.port_pairs}
    out = []
    for i, v in enumerate(vnfs):
        pair = pairs[v.pair_id]
        ing, egr = ports.get(pair.ingress_port_id), ports.get(pair.egress_port_id)
        problem, fatal = None, False
        if ing is None or egr is None:
            problem, fatal = f"port pair {v.pair_id}: a port was deleted", True
        elif not ing.node or not egr.node:
            problem = f"port pair {v.pair_id}: not bound to a node"
        elif ing.node != egr.node:
            problem, fatal = f"port pair {v.pair_id}: its ports are on two nodes ({ing.node}, {egr.node})", True
        elif not ing.interface or not egr.interface:
            problem = f"port pair {v.pair_id}: no interface named on node {ing.node}"
        placed = problem is None
        out.append(ChainVnf(chain_id, v.position, v.group_id, v.pair_id, i + 1, v.role,
                            ing.node if placed else None,
                            f"{ing.interface}:egress" if placed else None,
                            f"{egr.interface}:ingress" if placed else None, problem, fatal))
    return out


def chain_attachments(snapshot: Snapshot) -> list[tuple[str, PptmonAttach]]:
    """(node, PptmonAttach) for every placed instance of every chain with pptmon on."""
    out = []
    for chain in snapshot.port_chains:
        if chain.pptmon is not None:
            out += [(v.node, a) for v, a in _placed(snapshot, chain)]
    return out


def _placed(snapshot: Snapshot, chain) -> list[tuple[ChainVnf, PptmonAttach]]:
    """The placed instances of a measured chain with their attachments. Every attachment carries
    the chain's `path` (its instances' pair, VNF id and role): a change of the path, e.g. a group
    removed, is a change of every attachment, so every instance's loader starts again and the
    counters `lost_across` compares restart together."""
    vnfs = chain_pptmon(snapshot, chain.id)
    path = hashlib.sha256(repr([(v.pair_id, v.vnf_id, v.role) for v in vnfs]).encode()).hexdigest()[:16]
    return [(v, PptmonAttach(v.pair_id, chain_label(chain.id), v.vnf_id, v.role, v.in_point, v.out_point,
                             chain.pptmon.period_ns, OWNER_KIND, path)) for v in vnfs if v.node is not None]


def lost_across(snapshot: Snapshot, chain_id: int, agents: dict) -> dict:
    """Sampled packets of a measured chain that reached its last group without the option, from
    the counters the agents report for its instances (fathom.agent.pptmon): `stamped` by the
    first group's instances, `reached` the last group's with the option (reported there). A VNF
    that terminates TCP (a proxy) ends the option with the connection: what it sends on is not
    marked, the sink sees nothing to report. `agents`: node -> what its agent last reported
    (fathom.store.agents.AgentView).

    Only counters of loaders running the chain's current path count (the report's `applied` is
    the digest of the attachment the agent holds), and only once every placed source and sink
    reports them (`counted`): after a change of the chain, old and new loaders' counters are never
    compared with each other."""
    chain = next((c for c in snapshot.port_chains if c.id == chain_id), None)
    stamped = reached = 0
    counted = chain is not None and chain.pptmon is not None
    for v, attach in _placed(snapshot, chain) if counted else []:
        if v.role == "transit":
            continue
        view = agents.get(v.node)
        said = (view.objects.get(owner_key(attach.owner)) or {}) if view is not None else {}
        counters = said.get("counters") or {}
        if not counters or said.get("applied") != digest([attach]):
            counted = False
            break
        if v.role in ("source", "source-sink"):
            stamped += int(counters.get("sampled", 0))
        if v.role in ("sink", "source-sink"):
            reached += int(counters.get("reported", 0))
    if not counted:
        stamped = reached = 0
    return {"counted": counted, "stamped": stamped, "reached": reached, "lost_across": max(0, stamped - reached)}


LOST_MIN = 5     # stamped packets before a chain that delivers none (or under half) to its sink is called lossy


def lost_warning(lost: dict) -> str | None:
    """A chain-level warning when the sink sees too few of the packets the source stamped."""
    if lost["stamped"] < LOST_MIN or lost["reached"] * 2 >= lost["stamped"]:
        return None
    return (f"PPTMon: {lost['lost_across']} of {lost['stamped']} sampled packets reached the last group without "
            "the option (a VNF on the path does not carry TCP options across, e.g. it terminates TCP): "
            "their times are not measured")


WARNING_KIND = "port_chain_pptmon_warning"


def chain_warnings(snapshot: Snapshot, agents: dict) -> dict[int, str]:
    """chain id -> the PPTMon warning of every measured chain that has one."""
    out = {}
    for chain in snapshot.port_chains:
        if chain.pptmon is not None:
            warning = lost_warning(lost_across(snapshot, chain.id, agents))
            if warning:
                out[chain.id] = warning
    return out


def chain_pptmon_status(snapshot, chain_id: int, agents: dict) -> Status:
    """What the agents say of a measured chain's PPTMon programs: `agents` holds the status of each
    instance's attachment, (OWNER_KIND, port pair id) -> status."""
    vnfs = chain_pptmon(snapshot, chain_id)
    if not vnfs:
        return ("error", f"PPTMon: a measured chain has at most {MAX_PPTMON_GROUPS} groups and "
                         f"{MAX_PPTMON_INSTANCES} instances")
    parts: list[Status] = []
    for v in vnfs:
        if v.problem is not None:
            parts.append(("error" if v.fatal else "pending", f"PPTMon: {v.problem}"))
            continue
        st = agents.get((OWNER_KIND, v.pair_id), ("pending", f"waiting for the agent on node {v.node}"))
        parts.append(st if st[0] == "active" else (st[0], f"PPTMon on port pair {v.pair_id}: {st[1]}"))
    return worst(parts)
