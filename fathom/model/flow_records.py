"""Flow records: how the pipelines' `sample` actions name what they observed, and at what rate.

Every sample fathom puts in a br-int carries one IPFIX observation domain (`OBS_DOMAIN`: OVS 3.1.0
sends templates for one domain per exporter only) and collector set (`COLLECTOR_SET`, the node's
`Flow_Sample_Collector_Set` row), and an observation point id that names the owner of the stage:

    obs_point_id = kind (4 bits) << 28 | object id (28 bits)

    kind 1 admit-egress   a rule (id) admitted a new connection the port sends (egress-acl commit)
    kind 2 admit-ingress  a rule (id) admitted a new connection delivered to the port (ingress-acl)
    kind 3 drop-egress    no rule of the sending port's (id) groups admitted the frame: the
                          "default drop" of egress-acl
    kind 4 drop-ingress   the same for the receiving port (id) in ingress-acl
    kind 5 port-ingress   a frame the port (id) sent, as it enters the security stages
                          (egress-conntrack): the bytes and packets a port sends
    kind 6 chain-hop      a frame of a service chain on its way to one hop (id: the hop marker's
                          low 20 bits, fathom.model.chains: chain, direction, group index), as
                          sfc-select sends it to an instance of the hop's port pair group
    kind 7 tunnel-egress  a frame leaving this node through the tunnel to a port (id) on another
                          node (the l2 flow that sends it there): the point names the network it
                          leaves in and the remote node; the sending port is the node's port
                          holding the frame's source address

A rate is "one in N" packets (N = 1..65535; 0 = off); OVS's `probability` is out of 65535, so a rate
N samples with probability round(65535 / N). OVS counts each sample as 65535 // probability packets
(and their bytes) in its IPFIX records (ofproto-dpif-ipfix.c, dpif_ipfix_flow_sample): the records
carry estimates already; IPFIX carries no rate, so the controller derives the packets really
sampled from the rate it configured (`weight`).

Configuration (`FlowSampling` rows): a project's row (port_id None) gives its ports' rates; a
port's row replaces them for that port (admits excepted: a rule's commit flow is shared by the
ports of its group on a node, so the admit rate is its project's). A chain's hops are sampled at
its project's `ingress` rate (a hop's flow is shared by every port sending into the chain), and so
is what leaves through the tunnel to a port (the l2 flow towards a remote port is shared by every
port sending to it from the node): the rate of the destination port's project.
"""
from __future__ import annotations

from dataclasses import dataclass

OBS_DOMAIN = 1
COLLECTOR_SET = 1
PROBABILITY_MAX = 0xFFFF
RATE_MAX = 0xFFFF

KIND_SHIFT = 28
ID_MASK = (1 << KIND_SHIFT) - 1
ADMIT_EGRESS, ADMIT_INGRESS, DROP_EGRESS, DROP_INGRESS, PORT_INGRESS, CHAIN_HOP, TUNNEL_EGRESS = 1, 2, 3, 4, 5, 6, 7
KINDS = {ADMIT_EGRESS: "admit-egress", ADMIT_INGRESS: "admit-ingress", DROP_EGRESS: "drop-egress",
         DROP_INGRESS: "drop-ingress", PORT_INGRESS: "port-ingress", CHAIN_HOP: "chain-hop",
         TUNNEL_EGRESS: "tunnel-egress"}
HOP_MASK = 0xFFFFF          # a chain hop's point id: the hop marker's bits below SFC_VNI_BASE
DEFAULT_DROP = "default-drop"    # the rule a drop record names: no rule of the port's groups admitted it


@dataclass(frozen=True)
class FlowSampling:
    """Sampling rates ("one in N", 0 = off) of a project (`port_id` None) or of one of its ports."""
    id: int
    project_id: str
    port_id: int | None = None
    ingress: int = 0
    admit: int = 0
    drop: int = 0


@dataclass(frozen=True)
class Rates:
    ingress: int = 0
    admit: int = 0
    drop: int = 0


OFF = Rates()


def point_id(kind: int, object_id: int) -> int:
    if kind not in KINDS or not 0 <= object_id <= ID_MASK:
        raise ValueError(f"observation point kind {kind} / id {object_id} out of range")
    return kind << KIND_SHIFT | object_id


def parse_point(point: int) -> tuple[int, int]:
    """(kind, object id) of an observation point id."""
    return point >> KIND_SHIFT, point & ID_MASK


def probability(rate: int) -> int:
    """OVS's sample probability (out of 65535) for one in `rate` packets."""
    return max(1, round(PROBABILITY_MAX / rate))


def weight(rate: int) -> int:
    """The packets OVS counts one sample as at one in `rate`."""
    return PROBABILITY_MAX // probability(rate)


class SamplingIndex:
    """Rates by project and port, from a snapshot's `flow_sampling` rows."""

    def __init__(self, rows):
        self.projects: dict[str, Rates] = {}
        self.ports: dict[int, Rates] = {}
        for r in rows:
            rates = Rates(r.ingress, r.admit, r.drop)
            if r.port_id is None:
                self.projects[r.project_id] = rates
            else:
                self.ports[r.port_id] = rates

    def of_port(self, port_id: int, project_id: str) -> Rates:
        """A port's rates: its own row's ingress and drop, its project's admit."""
        project = self.projects.get(project_id, OFF)
        own = self.ports.get(port_id)
        return project if own is None else Rates(own.ingress, project.admit, own.drop)

    def admit(self, project_id: str) -> int:
        return self.projects.get(project_id, OFF).admit

    def ingress(self, project_id: str) -> int:
        """A project's own ingress rate: that of its chain hops and of what leaves through the tunnel
        to its ports (as `ingress_rates`)."""
        return self.projects.get(project_id, OFF).ingress


def ingress_rates(rows) -> dict[str, int]:
    """project -> its own ingress rate, from `flow_sampling` rows: the rate of its chain hops and of
    what leaves through the tunnel to its ports (flows every port sending there shares). Reads a
    row's project_id, port_id and ingress only: the compilers that need no more declare no more."""
    return {r.project_id: r.ingress for r in rows if r.port_id is None}
