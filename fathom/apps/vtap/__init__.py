"""vTAP: TAP policies as group tables at the sender's edge and recovery rules at the monitor's.

Incremental: every flow, group and meter belongs to one policy, compiled alone; a change touches
the policies that changed and those whose sender, receiver or monitor ports changed (bound,
plugged, moved, deleted). A change of nodes, networks, subnets or routers (the routes a copy
takes) is not handled while there are policies: the app is compiled whole.
"""
from __future__ import annotations

from dataclasses import replace

from fathom.apps.base import BR_INT, App, Owner, Problem, Reads, SwitchKey
from fathom.apps.incremental import declared_reach, declared_touched
from fathom.apps.vtap.compiler import compile_vtap_plans
from fathom.model.routers import tenant_view
from fathom.model.views import get
from fathom.pipeline import cookies as ck
from fathom.pipeline.cookies import APP_VTAP


def plans(model, views=None):
    """(desired state per node, plan per policy), once per model: the status model reads the plans."""
    return get(views, model, "vtap_plans", lambda m, v: compile_vtap_plans(tenant_view(m, v)))


def compile(model, views=None) -> dict:
    return {SwitchKey(BR_INT, node): state for node, state in plans(model, views)[0].items()}


def compile_owners(model, owners, views=None) -> dict:
    ids = {o.id for o in owners if o.app == APP_VTAP and o.kind == ck.KIND_TAP_POLICY}
    view = tenant_view(model, views)
    only = replace(view, tap_policies=tuple(p for p in view.tap_policies if p.id in ids))
    if not only.tap_policies:
        return {}
    return {SwitchKey(BR_INT, node): state for node, state in compile_vtap_plans(only)[0].items()}


# What the policies' flows read: each policy owns its flows, and reaches its sender, receiver and
# monitor ports; the routes a copy takes (nodes, networks, subnets, router interfaces) compile the
# app whole when they change.
READS = Reads(
    fields={
        "nodes": frozenset({"name", "tunnel_ip", "ofports"}),
        "networks": frozenset({"id", "type", "segmentation_id"}),
        "subnets": frozenset({"id", "network_id", "cidr"}),
        "router_interfaces": frozenset({"id", "router_id", "subnet_id", "network_id", "mac_address"}),
        "ports": frozenset({"id", "network_id", "mac_address", "fixed_ips", "node", "interface", "ofport"}),
        "tap_policies": frozenset({"id", "sender_port_id", "sender_is_port", "receiver_port_id", "receiver_is_port",
                                   "receiver_mac", "receiver_ip", "monitor_port_ids", "direction", "priority",
                                   "filters", "truncate", "rate_pps"}),
        "fabric": frozenset({"modes"}),
    },
    owners={"tap_policies": ck.KIND_TAP_POLICY},
    refs={"tap_policies": {"sender_port_id": "ports", "receiver_port_id": "ports", "monitor_port_ids": "ports"}},
    quiet=("tap_policies",),
    view=tenant_view,
)


def status(model, agents, views=None) -> list[Problem]:
    """A policy the compiler could not (wholly) install: its problems, in the order found."""
    if not model.tap_policies:
        return []
    return [Problem(("tap_policy", pid), plan.problems.severity, "; ".join(plan.problems))
            for pid, plan in plans(model, views)[1].items() if plan.problems]


APP = App("vtap", APP_VTAP, {BR_INT: ("classify", "tap-ingress", "tap-recovery")}, compile,
          touched=declared_touched(APP_VTAP, READS), compile_owners=compile_owners, reads=READS,
          status=status, reach=declared_reach(READS))
