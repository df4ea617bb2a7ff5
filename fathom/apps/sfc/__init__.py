"""Service function chains: port chains steered through their VNF instances in every node's br-int
(docs/sfc.md).

Incremental: every flow and group belongs to one chain, compiled alone; a change touches the
chains that changed and those whose port pair groups, port pairs, flow classifiers or ports (the
VNF instances' and the classifiers') changed. A change of nodes or networks is not handled while
there are chains: the app is compiled whole.
"""
from __future__ import annotations

from dataclasses import replace

from fathom.apps.base import BR_INT, App, Owner, Problem, Reads, Severity, SwitchKey
from fathom.apps.incremental import declared_reach, declared_touched
from fathom.apps.sfc.compiler import compile_sfc_plans
from fathom.model.chains import WARNING_KIND, chain_pptmon_status
from fathom.model.views import get
from fathom.pipeline import cookies as ck
from fathom.pipeline.cookies import APP_SFC


def plans(model, views=None):
    """(desired state per node, plan per chain), once per model: the status model reads the plans."""
    return get(views, model, "sfc_plans", lambda m, _v: compile_sfc_plans(m))


def compile(model, views=None) -> dict:
    return {SwitchKey(BR_INT, node): state for node, state in plans(model, views)[0].items()}


def compile_owners(model, owners, views=None) -> dict:
    ids = {o.id for o in owners if o.app == APP_SFC and o.kind == ck.KIND_PORT_CHAIN}
    only = replace(model, port_chains=tuple(c for c in model.port_chains if c.id in ids))
    if not only.port_chains:
        return {}
    return {SwitchKey(BR_INT, node): state for node, state in compile_sfc_plans(only)[0].items()}


# What the chains' flows read: each chain owns its flows, and reaches its port pair groups, their
# port pairs, its flow classifiers and the ports of those; nodes and networks compile the app whole
# when they change.
READS = Reads(
    fields={
        "nodes": frozenset({"name", "tunnel_ip", "ofports"}),
        "networks": frozenset({"type", "segmentation_id"}),
        "ports": frozenset({"id", "mac_address", "node", "interface", "ofport"}),
        "port_pairs": frozenset({"id", "ingress_port_id", "egress_port_id"}),
        "port_pair_groups": frozenset({"id", "port_pair_ids"}),
        # every field: a symmetric chain's mirrored classifier is a copy of the whole classifier
        "flow_classifiers": frozenset({"id", "name", "project_id", "logical_source_port_id",
                                       "logical_destination_port_id", "protocol", "source_ip_prefix",
                                       "destination_ip_prefix", "source_port_range", "destination_port_range"}),
        "port_chains": frozenset({"id", "project_id", "port_pair_group_ids", "flow_classifier_ids", "symmetric"}),
        # the hops' sample actions: the chain's project's ingress rate (a change compiles the app whole)
        "flow_sampling": frozenset({"project_id", "port_id", "ingress"}),
    },
    owners={"port_chains": ck.KIND_PORT_CHAIN},
    refs={"port_chains": {"port_pair_group_ids": "port_pair_groups", "flow_classifier_ids": "flow_classifiers"},
          "port_pair_groups": {"port_pair_ids": "port_pairs"},
          "port_pairs": {"ingress_port_id": "ports", "egress_port_id": "ports"},
          "flow_classifiers": {"logical_source_port_id": "ports", "logical_destination_port_id": "ports"}},
    quiet=("port_chains",),
)


def status(model, agents, views=None) -> list[Problem]:
    """A chain the compiler could not (wholly) steer: its problems (`error` when it cannot be
    compiled at all); a measured chain's PPTMon programs as their agents hold them, besides its
    flows; a warning when PPTMon measures it but not across some VNF (it terminates TCP)."""
    if not model.port_chains:
        return []
    out = []
    chain_plans = plans(model, views)[1]
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
          touched=declared_touched(APP_SFC, READS), compile_owners=compile_owners, reads=READS,
          status=status, reach=declared_reach(READS))
