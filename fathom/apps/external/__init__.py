"""External networks: router gateways, SNAT and floating IPs on the gateway node (docs/external.md).

Incremental as far as telling that a change does not concern it: its flows depend on what
`compile` reads (READS: router gateways, floating IPs, nodes, networks, subnets, router interfaces,
router modes; of the ports, which networks have a port plugged on each node). A change that leaves
all of these as they were touches nothing of it (most port changes); any other is compiled whole
(logged and counted).
"""
from __future__ import annotations

from fathom.apps.base import BR_INT, App, Problem, Reads, Severity, SwitchKey
from fathom.apps.external.compiler import compile_external, unsupported_gateways
from fathom.apps.incremental import declared_facts, local_networks
from fathom.model import EXTERNAL_INTERFACE
from fathom.model.routers import effective_modes
from fathom.pipeline.cookies import APP_EXTERNAL


def compile(model, views=None) -> dict:
    return {SwitchKey(BR_INT, node): state for node, state in compile_external(model).items()}


def _inputs(model, views) -> tuple:
    return declared_facts(model, READS, without=frozenset({"ports"})), local_networks(model, views)


def touched(before, after, views=None):
    if not before.router_gateways and not after.router_gateways:
        return set()
    if _inputs(before, views) == _inputs(after, views):
        return set()
    return "gateways, floating IPs or their networks changed"


def status(model, agents, views=None) -> list[Problem]:
    """A router gateway not compiled (a router mode it does not support), or waiting for its gateway
    node's external port (`ext0`)."""
    refused = unsupported_gateways(model) if model.router_gateways else {}
    nodes = {n.name: n for n in model.nodes}
    out = []
    for gw in model.router_gateways:
        node = nodes.get(gw.node)
        if gw.router_id in refused:
            out.append(Problem(("router_gateway", gw.router_id), Severity.ERROR, refused[gw.router_id]))
        elif node is None or node.ofport(EXTERNAL_INTERFACE) is None:
            out.append(Problem(("router_gateway", gw.router_id), Severity.PENDING,
                               f"waiting for interface {EXTERNAL_INTERFACE!r} (the external network) on gateway "
                               f"node {gw.node!r}"))
    return out


# What `compile` reads (checked). `touched` is written by hand: of the ports, only which networks are
# plugged on each node matters (fathom.apps.incremental.local_networks), which the declaration
# cannot say: from it, every port plugged would compile the app whole.
READS = Reads({
    "nodes": frozenset({"name", "tunnel_ip", "ofports"}),
    "networks": frozenset({"id", "type", "segmentation_id", "upstream_mac"}),
    "subnets": frozenset({"id", "cidr"}),
    "ports": frozenset({"network_id", "node", "interface", "ofport"}),
    "router_interfaces": frozenset({"id", "router_id", "subnet_id", "network_id", "mac_address"}),
    "router_gateways": frozenset({"router_id", "network_id", "ip_address", "mac_address", "node", "ct_zone", "snat"}),
    "floating_ips": frozenset({"id", "ip_address", "ct_zone", "port_id", "fixed_ip", "router_id"}),
    "fabric": frozenset({"modes"}),
})


APP = App("external", APP_EXTERNAL,
          {BR_INT: ("classify", "nat-in", "nat-route", "l3", "snat", "l2", "output")}, compile, touched=touched,
          reads=READS, status=status,
          reach=lambda model, _write: None if model.router_gateways or model.floating_ips else frozenset())
