"""vTAP: TAP policies as group tables at the sender's edge and recovery rules at the monitor's.

Incremental: every flow, group and meter belongs to one policy, compiled alone; a change touches
the policies that changed and those whose sender, receiver or monitor ports changed (bound,
plugged, moved, deleted). A change of nodes, networks, subnets or routers (the routes a copy
takes) is not handled while there are policies: the app is compiled whole.
"""
from __future__ import annotations

from dataclasses import replace

from fathom.apps.base import BR_INT, App, Owner, Problem, SwitchKey
from fathom.apps.incremental import changed_ports, node_facts
from fathom.apps.vtap.compiler import compile_vtap_plans
from fathom.model.routers import tenant_view
from fathom.pipeline import cookies as ck
from fathom.pipeline.cookies import APP_VTAP


def plans(model):
    """(desired state per node, plan per policy), once per model: the status model reads the plans."""
    return model.memo("vtap_plans", lambda m: compile_vtap_plans(tenant_view(m)))


def compile(model) -> dict:
    return {SwitchKey(BR_INT, node): state for node, state in plans(model)[0].items()}


def compile_owners(model, owners) -> dict:
    ids = {o.id for o in owners if o.app == APP_VTAP and o.kind == ck.KIND_TAP_POLICY}
    view = tenant_view(model)
    only = replace(view, tap_policies=tuple(p for p in view.tap_policies if p.id in ids))
    if not only.tap_policies:
        return {}
    return {SwitchKey(BR_INT, node): state for node, state in compile_vtap_plans(only)[0].items()}


def _ports(p) -> tuple:
    return (p.sender_port_id, p.receiver_port_id if p.receiver_is_port else None, *p.monitor_port_ids)


def touched(before, after):
    if not before.tap_policies and not after.tap_policies:
        return set()
    b, a = tenant_view(before), tenant_view(after)
    if node_facts(b) != node_facts(a):
        return "nodes changed"
    if b.networks != a.networks or b.subnets != a.subnets or b.router_interfaces != a.router_interfaces:
        return "networks, subnets or routers changed"
    pb, pa = {p.id: p for p in b.tap_policies}, {p.id: p for p in a.tap_policies}
    ids = {i for i in set(pb) | set(pa) if pb.get(i) != pa.get(i)}
    for i, p in pa.items():
        if i not in ids and changed_ports(b, a, _ports(p)):
            ids.add(i)
    return {Owner(APP_VTAP, ck.KIND_TAP_POLICY, i) for i in ids}


def status(model, agents) -> list[Problem]:
    """A policy the compiler could not (wholly) install: its problems, in the order found."""
    if not model.tap_policies:
        return []
    return [Problem(("tap_policy", pid), plan.problems.severity, "; ".join(plan.problems))
            for pid, plan in plans(model)[1].items() if plan.problems]


APP = App("vtap", APP_VTAP, {BR_INT: ("classify", "tap-ingress", "tap-recovery")}, compile,
          touched=touched, compile_owners=compile_owners, status=status)
