"""External networks: router gateways, SNAT and floating IPs on the gateway node (docs/external.md)."""
from __future__ import annotations

from fathom.apps.base import BR_INT, App, SwitchKey
from fathom.apps.external.compiler import compile_external
from fathom.pipeline.cookies import APP_EXTERNAL


def compile(model) -> dict:
    return {SwitchKey(BR_INT, node): state for node, state in compile_external(model).items()}


APP = App("external", APP_EXTERNAL,
          {BR_INT: ("classify", "nat-in", "nat-route", "l3", "snat", "l2", "output")}, compile)
