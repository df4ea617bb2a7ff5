"""Every kind of object the drivers map, one module each (security groups, floating IPs, service
chains: add a module with a Mapping subclass and list it here).

`MAPPINGS` is in creation order (a full sync deletes in the reverse order); `BY_JOURNAL_TYPE` says
which mappings replay a journal entry of each type: a Neutron port is a fathom port or a router
interface depending on its owner, and a port that changes owner moves from one to the other.
"""
from .base import Mapping, Refs, Unmapped, apply_delete, apply_set, project_of  # noqa: F401
from .network import Network
from .port import Port
from .router import Router
from .router_interface import RouterInterface
from .subnet import Subnet
from .tap_flow import TapFlow

MAPPINGS: list[Mapping] = sorted([Network(), Subnet(), Router(), Port(), RouterInterface(), TapFlow()], key=lambda m: m.order)
BY_KIND = {m.kind: m for m in MAPPINGS}
BY_JOURNAL_TYPE: dict[str, list[Mapping]] = {
    "network": [BY_KIND["network"]],
    "subnet": [BY_KIND["subnet"]],
    "router": [BY_KIND["router"]],
    "port": [BY_KIND["port"], BY_KIND["router_interface"]],
    "tap_flow": [BY_KIND["tap_flow"]],
}
