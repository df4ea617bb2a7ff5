"""External networks: router gateways, SNAT and floating IPs on the gateway node (docs/external.md).

Incremental as far as telling that a change does not concern it: its flows depend on the router
gateways, floating IPs, nodes, networks, subnets, router interfaces, router modes and which
networks have a port plugged on each node. A change that leaves all of these as they were touches
nothing of it (most port changes); any other is compiled whole (logged and counted).
"""
from __future__ import annotations

from fathom.apps.base import BR_INT, App, Problem, Severity, SwitchKey
from fathom.apps.external.compiler import compile_external, unsupported_gateways
from fathom.apps.incremental import local_networks, node_facts
from fathom.model import EXTERNAL_INTERFACE
from fathom.model.routers import effective_modes
from fathom.pipeline.cookies import APP_EXTERNAL


def compile(model) -> dict:
    return {SwitchKey(BR_INT, node): state for node, state in compile_external(model).items()}


def _inputs(model) -> tuple:
    return (model.router_gateways, model.floating_ips, node_facts(model), model.networks, model.subnets,
            model.router_interfaces, effective_modes(model), local_networks(model))


def touched(before, after):
    if not before.router_gateways and not after.router_gateways:
        return set()
    return set() if _inputs(before) == _inputs(after) else "gateways, floating IPs or their networks changed"


def status(model, agents) -> list[Problem]:
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


APP = App("external", APP_EXTERNAL,
          {BR_INT: ("classify", "nat-in", "nat-route", "l3", "snat", "l2", "output")}, compile, touched=touched,
          status=status)
