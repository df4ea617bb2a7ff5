"""The br-int pipeline in one place: stage names -> table numbers, registers, cookies and group ids.

Every flow a compiler emits sits in one of these tables and carries a cookie made by `cookie()`, so
the reconciler can tell which flows are ours (and which app and object owns each) by cookie alone.
docs/pipeline.md explains each stage.
"""
from __future__ import annotations

from fathom.openflow.spec import FlowSpec, GotoTable

# Stages in the order a frame from a local port visits them. Tables leave gaps so a stage can grow
# into several tables later without renumbering the others.
STAGES: dict[str, int] = {
    "classify": 0,        # in_port / tunnel id / VLAN -> network and source-port registers
    "tap-ingress": 10,    # vTAP rewriting rules for frames sent by local ports
    "security": 20,       # port security: a port sends only from its own MAC and IPs
    "arp": 30,            # ARP requests for known addresses answered in the switch
    "sfc": 40,            # service-chain steering
    "l3": 50,             # distributed routing: dst MAC = gateway MAC -> route by destination subnet
    "l3-neighbor": 55,    # routed frames: destination IP -> destination MAC in the new network
    "l2": 60,             # dst MAC -> local port, remote node (tunnel / uplink), or flood group
    "tap-recovery": 70,   # vTAP copies arriving for a local monitor get their original headers back
    "output": 80,         # output to the port chosen by l2 (REG_OUT_PORT)
}
TABLE_STAGE: dict[int, str] = {t: s for s, t in STAGES.items()}

CLASSIFY = STAGES["classify"]
TAP_INGRESS = STAGES["tap-ingress"]
SECURITY = STAGES["security"]
ARP = STAGES["arp"]
SFC = STAGES["sfc"]
L3 = STAGES["l3"]
L3_NEIGHBOR = STAGES["l3-neighbor"]
L2 = STAGES["l2"]
TAP_RECOVERY = STAGES["tap-recovery"]
OUTPUT = STAGES["output"]

# Registers (os-ken field names). Set in classify, read by later stages.
REG_SRC_PORT = "reg5"   # fathom id of the local port the frame came from; 0 if it came from remote
REG_NETWORK = "reg6"    # fathom id of the network the frame is in (changed by routing)
REG_OUT_PORT = "reg7"   # OpenFlow port chosen by l2, output by the output stage
REG_TAP = "reg8"        # vTAP: marker of the policy copy a frame is (fathom/apps/vtap/compiler.py); 0 = none

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
APPS = {APP_PIPELINE: "pipeline", APP_TENANT: "tenant", APP_VTAP: "vtap", APP_FABRIC: "fabric",
        APP_SFC: "sfc"}

# Kinds: which store object a flow realises, so a failed flow marks only its object as error.
KIND_STAGE = 0x01           # object id = table number (skeleton flows)
KIND_NODE = 0x02
KIND_NETWORK = 0x03
KIND_SUBNET = 0x04
KIND_PORT = 0x05
KIND_ROUTER = 0x06
KIND_ROUTER_INTERFACE = 0x07  # object id = the router interface's port id
KIND_TAP_POLICY = 0x08
KINDS = {KIND_STAGE: "stage", KIND_NODE: "node", KIND_NETWORK: "network", KIND_SUBNET: "subnet",
         KIND_PORT: "port", KIND_ROUTER: "router", KIND_ROUTER_INTERFACE: "router_interface",
         KIND_TAP_POLICY: "tap_policy"}


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


def skeleton_flows() -> frozenset[FlowSpec]:
    """The table-miss flow of every stage: pass-through stages go on, deciding stages drop.

    classify, security, l3-neighbor, l2 and output drop what no flow claims; the others continue to
    the next stage, so an app with nothing to do in a stage costs no flow there.
    """
    def miss(stage: str, goto: str | None) -> FlowSpec:
        table = STAGES[stage]
        actions = (GotoTable(STAGES[goto]),) if goto else ()
        return FlowSpec(table, 0, {}, actions, cookie(APP_PIPELINE, KIND_STAGE, table))

    return frozenset({
        miss("classify", None),
        miss("tap-ingress", "security"),
        miss("security", None),
        miss("arp", "sfc"),
        miss("sfc", "l3"),
        miss("l3", "l2"),
        miss("l3-neighbor", None),
        miss("l2", None),
        miss("tap-recovery", "output"),
        miss("output", None),
    })
