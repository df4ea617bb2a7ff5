"""br-int's table numbers by stage name, its registers, and the cookie layout, as compilers use them.

Everything here is derived from the declaration in fathom/pipeline/catalogue.py (tables) and
fathom/pipeline/cookies.py (cookies, group ids); docs/pipeline.md explains each stage.
"""
from __future__ import annotations

from fathom.openflow.spec import FlowSpec
from fathom.pipeline.catalogue import (  # noqa: F401
    BR_INT, REG_CHAIN_HOP, REG_CT_ZONE, REG_DST_PORT, REG_NETWORK, REG_OUT_PORT, REG_SRC_PORT, REG_TAP,
    SECGROUP_ZONE_MAX,
)
from fathom.pipeline.cookies import (  # noqa: F401 - the cookie vocabulary compilers name through `st`
    APP_EXTERNAL, APP_FABRIC, APP_MASK, APP_PIPELINE, APP_SECGROUPS, APP_SFC, APP_TENANT, APP_VTAP, APPS,
    KIND_FLOATING_IP, KIND_NETWORK, KIND_NODE, KIND_PORT, KIND_PORT_CHAIN, KIND_ROUTER, KIND_ROUTER_INTERFACE,
    KIND_SECURITY_GROUP, KIND_SECURITY_GROUP_CLAUSE, KIND_SECURITY_GROUP_RULE, KIND_STAGE, KIND_SUBNET,
    KIND_TAP_POLICY, KINDS,
    app_cookie_mask, cookie,
    group_id, parse_cookie, parse_group_id,
)

# Stages in the order a frame from a local port visits them.
STAGES: dict[str, int] = {t.name: t.number for t in BR_INT.tables}
TABLE_STAGE: dict[int, str] = {t: s for s, t in STAGES.items()}

CLASSIFY = STAGES["classify"]
TAP_INGRESS = STAGES["tap-ingress"]
SECURITY = STAGES["security"]
ARP = STAGES["arp"]
EGRESS_CONNTRACK = STAGES["egress-conntrack"]
EGRESS_ACL = STAGES["egress-acl"]
SFC = STAGES["sfc"]
SFC_SELECT = STAGES["sfc-select"]
SFC_DELIVER = STAGES["sfc-deliver"]
NAT_IN = STAGES["nat-in"]
NAT_ROUTE = STAGES["nat-route"]
L3 = STAGES["l3"]
L3_NEIGHBOR = STAGES["l3-neighbor"]
SNAT = STAGES["snat"]
L2 = STAGES["l2"]
TAP_EGRESS = STAGES["tap-egress"]
TAP_RECOVERY = STAGES["tap-recovery"]
INGRESS_CONNTRACK = STAGES["ingress-conntrack"]
INGRESS_ACL = STAGES["ingress-acl"]
OUTPUT = STAGES["output"]


def skeleton_flows() -> frozenset[FlowSpec]:
    """The table-miss flow of every br-int table (pass-through tables go on, deciding ones drop)."""
    return BR_INT.skeleton()
