"""vTAP: TAP policies as group tables at the sender's edge and recovery rules at the monitor's."""
from __future__ import annotations

from fathom.apps.base import BR_INT, App, SwitchKey
from fathom.apps.vtap.compiler import compile_vtap_plans
from fathom.model.routers import tenant_view
from fathom.pipeline.cookies import APP_VTAP


def plans(model):
    """(desired state per node, plan per policy), once per model: the status model reads the plans."""
    return model.memo("vtap_plans", lambda m: compile_vtap_plans(tenant_view(m)))


def compile(model) -> dict:
    return {SwitchKey(BR_INT, node): state for node, state in plans(model)[0].items()}


APP = App("vtap", APP_VTAP, {BR_INT: ("classify", "tap-ingress", "tap-recovery")}, compile)
