"""Service function chains: port chains steered through their VNF instances in every node's br-int
(docs/sfc.md).

Incremental: every flow and group belongs to one chain, compiled alone; a change touches the
chains that changed and those whose port pair groups, port pairs, flow classifiers or ports (the
VNF instances' and the classifiers') changed. A change of nodes or networks is not handled while
there are chains: the app is compiled whole.
"""
from __future__ import annotations

from dataclasses import replace

from fathom.apps.base import BR_INT, App, Owner, Problem, Severity, SwitchKey
from fathom.apps.incremental import changed_ports, node_facts
from fathom.apps.sfc.compiler import compile_sfc_plans
from fathom.model.chains import WARNING_KIND, chain_pptmon_status
from fathom.pipeline import cookies as ck
from fathom.pipeline.cookies import APP_SFC


def plans(model):
    """(desired state per node, plan per chain), once per model: the status model reads the plans."""
    return model.memo("sfc_plans", lambda m: compile_sfc_plans(m))


def compile(model) -> dict:
    return {SwitchKey(BR_INT, node): state for node, state in plans(model)[0].items()}


def compile_owners(model, owners) -> dict:
    ids = {o.id for o in owners if o.app == APP_SFC and o.kind == ck.KIND_PORT_CHAIN}
    only = replace(model, port_chains=tuple(c for c in model.port_chains if c.id in ids))
    if not only.port_chains:
        return {}
    return {SwitchKey(BR_INT, node): state for node, state in compile_sfc_plans(only)[0].items()}


def _inputs(model, chain) -> tuple:
    """What a chain's flows depend on besides nodes and networks: its groups, their pairs, its
    classifiers, and the ports of those."""
    groups = {g.id: g for g in model.port_pair_groups}
    pairs = {p.id: p for p in model.port_pairs}
    fcs = {f.id: f for f in model.flow_classifiers}
    gs = tuple(groups.get(g) for g in chain.port_pair_group_ids)
    ps = tuple(pairs.get(i) for g in gs if g is not None for i in g.port_pair_ids)
    cs = tuple(fcs.get(f) for f in chain.flow_classifier_ids)
    ports = {i for p in ps if p is not None for i in (p.ingress_port_id, p.egress_port_id)}
    ports |= {i for f in cs if f is not None for i in (f.logical_source_port_id, f.logical_destination_port_id)}
    return chain, gs, ps, cs, frozenset(ports - {None})


def touched(before, after):
    if not before.port_chains and not after.port_chains:
        return set()
    if node_facts(before) != node_facts(after):
        return "nodes changed"
    if before.networks != after.networks:
        return "networks changed"
    cb, ca = {c.id: c for c in before.port_chains}, {c.id: c for c in after.port_chains}
    ids = set()
    for i in set(cb) | set(ca):
        ib = _inputs(before, cb[i]) if i in cb else None
        ia = _inputs(after, ca[i]) if i in ca else None
        if ib != ia or changed_ports(before, after, ia[4]):
            ids.add(i)
    return {Owner(APP_SFC, ck.KIND_PORT_CHAIN, i) for i in ids}


def status(model, agents) -> list[Problem]:
    """A chain the compiler could not (wholly) steer: its problems (`error` when it cannot be
    compiled at all); a measured chain's PPTMon programs as their agents hold them, besides its
    flows; a warning when PPTMon measures it but not across some VNF (it terminates TCP)."""
    if not model.port_chains:
        return []
    out = []
    chain_plans = plans(model)[1]
    for chain in model.port_chains:
        about = ("port_chain", chain.id)
        plan = chain_plans.get(chain.id)
        if plan is not None and plan.problems:
            out.append(Problem(about, Severity.ERROR if plan.fatal else Severity.PENDING, "; ".join(plan.problems)))
        if chain.pptmon is not None:
            measured, reason = chain_pptmon_status(model, chain.id, agents)
            if measured != "active":
                out.append(Problem(about, Severity(measured), reason, replaces_flows=False))
            warning = agents.get((WARNING_KIND, chain.id))
            if warning is not None:
                out.append(Problem(about, Severity.WARNING, warning[1], replaces_flows=False))
    return out


APP = App("sfc", APP_SFC, {BR_INT: ("classify", "sfc", "sfc-select", "sfc-deliver")}, compile,
          touched=touched, compile_owners=compile_owners, status=status)
