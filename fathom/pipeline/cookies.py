"""Who owns a flow, group or meter: the cookie and id layouts every app uses.

Every flow carries a cookie `| app (8) | kind (8) | object id (48) |`, every group and meter an id
`| app (8) | object id (24) |`. The reconciler owns exactly what carries a known app (one rule for
every switch), and maps a flow back to the store object it realises by its cookie.
"""
from __future__ import annotations

# Cookie layout (64 bits): | app (8) | kind (8) | object id (48) |
APP_SHIFT = 56
KIND_SHIFT = 48
OBJECT_MASK = (1 << KIND_SHIFT) - 1
APP_MASK = 0xFF << APP_SHIFT

# Apps: who compiled a flow. 0 is never used, so flows with cookie 0 are never ours.
APP_PIPELINE = 0x01   # the stage skeleton (table-miss flows)
APP_TENANT = 0x02     # tenant networking (fathom/apps/tenant/compiler.py)
APP_VTAP = 0x03
APP_FABRIC = 0x04
APP_SFC = 0x05
APP_SECGROUPS = 0x06
APP_EXTERNAL = 0x07   # external networks, router gateways, floating IPs (fathom/apps/external)
APPS = {APP_PIPELINE: "pipeline", APP_TENANT: "tenant", APP_VTAP: "vtap", APP_FABRIC: "fabric",
        APP_SFC: "sfc", APP_SECGROUPS: "secgroups", APP_EXTERNAL: "external"}

# Kinds: which store object a flow realises, so a failed flow marks only its object as error.
KIND_STAGE = 0x01           # object id = table number (skeleton flows)
KIND_NODE = 0x02
KIND_NETWORK = 0x03
KIND_SUBNET = 0x04
KIND_PORT = 0x05
KIND_ROUTER = 0x06
KIND_ROUTER_INTERFACE = 0x07  # object id = the router interface's port id
KIND_TAP_POLICY = 0x08
KIND_SECURITY_GROUP = 0x09
KIND_SECURITY_GROUP_RULE = 0x0A
KIND_PORT_CHAIN = 0x0B
KIND_FLOATING_IP = 0x0C
# A clause flow of security groups shared by every rule with the same match (a remote address, a
# port range): object id = a digest of the match, so its owner is the same whichever rules use it
KIND_SECURITY_GROUP_CLAUSE = 0x0D
KINDS = {KIND_STAGE: "stage", KIND_NODE: "node", KIND_NETWORK: "network", KIND_SUBNET: "subnet",
         KIND_PORT: "port", KIND_ROUTER: "router", KIND_ROUTER_INTERFACE: "router_interface",
         KIND_TAP_POLICY: "tap_policy", KIND_SECURITY_GROUP: "security_group",
         KIND_SECURITY_GROUP_RULE: "security_group_rule", KIND_PORT_CHAIN: "port_chain",
         KIND_FLOATING_IP: "floating_ip", KIND_SECURITY_GROUP_CLAUSE: "security_group_clause"}


def cookie(app: int, kind: int, object_id: int) -> int:
    if not 0 < app <= 0xFF or not 0 < kind <= 0xFF:
        raise ValueError(f"app {app} and kind {kind} must be 1..255")
    if not 0 <= object_id <= OBJECT_MASK:
        raise ValueError(f"object id {object_id} does not fit in 48 bits")
    return (app << APP_SHIFT) | (kind << KIND_SHIFT) | object_id


def parse_cookie(value: int) -> tuple[int, int, int]:
    """(app, kind, object id) of a cookie made by `cookie()`."""
    return value >> APP_SHIFT, (value >> KIND_SHIFT) & 0xFF, value & OBJECT_MASK


def app_cookie_mask(app: int) -> tuple[int, int]:
    """(cookie, mask) selecting every flow of one app, e.g. for a flow-stats request or a delete."""
    return app << APP_SHIFT, APP_MASK


# Group ids (32 bits, below OFPG_MAX=0xffffff00): | app (8) | object id (24) |
GROUP_APP_SHIFT = 24
GROUP_OBJECT_MASK = (1 << GROUP_APP_SHIFT) - 1


def group_id(app: int, object_id: int) -> int:
    if not 0 < app < 0xFF:
        raise ValueError(f"app {app} must be 1..254 in a group id")
    if not 0 < object_id <= GROUP_OBJECT_MASK:
        raise ValueError(f"object id {object_id} does not fit in a group id (24 bits)")
    return (app << GROUP_APP_SHIFT) | object_id


def parse_group_id(value: int) -> tuple[int, int]:
    return value >> GROUP_APP_SHIFT, value & GROUP_OBJECT_MASK


# The one ownership rule, for every switch: a flow, group or meter is fathom's when its cookie (or
# id) names a known app. Anything else on a switch (cookie 0: OVS's own NORMAL flow, an operator's
# flow) is never touched.


def owns_cookie(value: int) -> bool:
    return parse_cookie(value)[0] in APPS


def owns_id(group_or_meter_id: int) -> bool:
    return parse_group_id(group_or_meter_id)[0] in APPS
