"""What apps' `touched` hooks compare between two models: the facts of nodes and ports their flows
depend on, computed once per model (Snapshot.memo) whichever apps ask."""
from __future__ import annotations

from fathom.model import Snapshot
from fathom.pipeline.infrastructure import is_infrastructure_interface


def node_facts(model: Snapshot) -> dict:
    """node name -> the node (not its bootstrap state, which no compiler reads) and the port numbers of the fabric's own interfaces on its br-int
    (tunnel, uplink, external port, router legs) and br-phy. A VIF's port number is its port's
    fact (`port_facts`): a VIF plugged or unplugged changes that port's facts only, and an
    interface no port is bound to concerns no flow."""
    def make(m: Snapshot) -> dict:
        return {n.name: (n.id, n.role, n.tunnel_ip, n.management_ip, n.datapath_type,
                         tuple(sorted((i, o) for i, o in n.ofports.items() if is_infrastructure_interface(i))),
                         tuple(sorted(n.phy_ofports.items())))
                for n in m.nodes}
    return model.memo("node_facts", make)


def port_facts(model: Snapshot) -> dict:
    """port id -> (the port, its OpenFlow port number on its node's br-int or None)."""
    def make(m: Snapshot) -> dict:
        nodes = {n.name: n for n in m.nodes}
        return {p.id: (p, nodes[p.node].ofport(p.interface) if p.node in nodes else None) for p in m.ports}
    return model.memo("port_facts", make)


def local_networks(model: Snapshot) -> dict:
    """node name -> the networks with a port plugged there."""
    def make(m: Snapshot) -> dict:
        out: dict[str, set] = {}
        for p, ofport in port_facts(m).values():
            if ofport is not None:
                out.setdefault(p.node, set()).add(p.network_id)
        return {n: frozenset(s) for n, s in out.items()}
    return model.memo("local_networks", make)


def changed_ports(before: Snapshot, after: Snapshot, ids) -> bool:
    """Whether any of these ports' facts differ between the two models."""
    b, a = port_facts(before), port_facts(after)
    return any(b.get(i) != a.get(i) for i in ids if i is not None)
