"""Every kind of object the drivers map, one module each (adding a kind is adding a module with a
Mapping subclass and listing it here).

`MAPPINGS` is in creation order (a full sync deletes in the reverse order); `BY_JOURNAL_TYPE` says
which mappings replay a journal entry of each type: a Neutron port is a fathom port or a router
interface depending on its owner, and a port that changes owner moves from one to the other.
"""
from .base import Mapping, Refs, Unmapped, apply_delete, apply_set, project_of  # noqa: F401
from .floating_ip import FloatingIp
from .network import Network
from .port import Port
from .router import Router
from .router_interface import RouterInterface
from .security_group import SecurityGroup, SecurityGroupRule
from .sfc import FlowClassifier, PortChain, PortPair, PortPairGroup
from .subnet import Subnet
from .tap_flow import TapFlow

MAPPINGS: list[Mapping] = sorted([Network(), Subnet(), SecurityGroup(), SecurityGroupRule(), Router(), Port(),
                                  RouterInterface(), TapFlow(), FloatingIp(), PortPair(), PortPairGroup(),
                                  FlowClassifier(), PortChain()], key=lambda m: m.order)
BY_KIND = {m.kind: m for m in MAPPINGS}
BY_JOURNAL_TYPE: dict[str, list[Mapping]] = {kind: [m] for kind, m in BY_KIND.items() if kind != "router_interface"}
BY_JOURNAL_TYPE["port"] = [BY_KIND["port"], BY_KIND["router_interface"]]
