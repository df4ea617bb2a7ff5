"""Service function chains: port chains steered through their VNF instances in every node's br-int
(docs/sfc.md)."""
from __future__ import annotations

from fathom.apps.base import BR_INT, App, SwitchKey
from fathom.apps.sfc.compiler import compile_sfc_plans
from fathom.pipeline.cookies import APP_SFC


def plans(model):
    """(desired state per node, plan per chain), once per model: the status model reads the plans."""
    return model.memo("sfc_plans", lambda m: compile_sfc_plans(m))


def compile(model) -> dict:
    return {SwitchKey(BR_INT, node): state for node, state in plans(model)[0].items()}


APP = App("sfc", APP_SFC, {BR_INT: ("classify", "sfc", "sfc-select", "sfc-deliver")}, compile)
