"""Tenant networking: networks, subnets, ports and distributed routers in every node's br-int."""
from __future__ import annotations

from fathom.apps.base import BR_INT, App, SwitchKey
from fathom.apps.tenant.compiler import compile_tenant
from fathom.model.routers import tenant_view
from fathom.pipeline.cookies import APP_TENANT


def compile(model) -> dict:
    return {SwitchKey(BR_INT, node): state for node, state in compile_tenant(tenant_view(model)).items()}


APP = App("tenant", APP_TENANT,
          {BR_INT: ("classify", "security", "arp", "l3", "l3-neighbor", "l2", "output")}, compile)
