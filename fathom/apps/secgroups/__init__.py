"""Security groups: stateful filtering (OVS conntrack) of what every port with port security sends
and receives, with Neutron's semantics; docs/security-groups.md."""
from __future__ import annotations

from fathom.apps.base import BR_INT, App, SwitchKey
from fathom.apps.secgroups.compiler import compile_secgroups
from fathom.pipeline.cookies import APP_SECGROUPS


def compile(model) -> dict:
    return {SwitchKey(BR_INT, node): state for node, state in compile_secgroups(model).items()}


APP = App("secgroups", APP_SECGROUPS,
          {BR_INT: ("egress-conntrack", "egress-acl", "ingress-conntrack", "ingress-acl")}, compile)
