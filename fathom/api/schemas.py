"""Request and response bodies of the REST API (pydantic). Requests reject unknown fields."""
from __future__ import annotations

import ipaddress
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fathom.addresses import parse_mac

NAME = Field(default="", max_length=255)
# the object's id in the cloud that drives fathom (Neutron's UUID); admin and service identity only
EXTERNAL_ID = Field(default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
NODE_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
# OVS interface names are Linux interface names: at most 15 characters.
IFNAME_RE = r"^[A-Za-z0-9_.-]{1,15}$"
Status = Literal["pending", "active", "error", "down"]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def given(self) -> dict:
        """The fields the client sent (for partial updates)."""
        return {k: getattr(self, k) for k in self.model_fields_set}


# ---------------------------------------------------------------------------------------------- nodes


DatapathType = Literal["system", "netdev"]
DATAPATH_DOC = "OVS datapath of the node's bridges; null: what its agent reports (system with the kernel module)"


class NodeCreate(_Request):
    name: str = Field(pattern=NODE_NAME_RE)
    role: Literal["compute", "gateway"] = "compute"
    tunnel_ip: ipaddress.IPv4Address | None = None
    management_ip: ipaddress.IPv4Address | None = None
    datapath_type: DatapathType | None = Field(default=None, description=DATAPATH_DOC)


class NodeUpdate(_Request):
    role: Literal["compute", "gateway"] = "compute"
    tunnel_ip: ipaddress.IPv4Address | None = None
    management_ip: ipaddress.IPv4Address | None = None
    datapath_type: DatapathType | None = Field(default=None, description=DATAPATH_DOC)


class NodeOut(BaseModel):
    id: int
    name: str
    role: str
    tunnel_ip: str | None
    management_ip: str | None
    datapath_type: str | None
    state: str
    status: Status
    status_reason: str | None
    project_id: str
    created_at: datetime


# ---------------------------------------------------------------------------------------------- networks


class NetworkCreate(_Request):
    external_id: str | None = EXTERNAL_ID
    name: str = NAME
    type: Literal["vxlan", "vlan", "flat"] = "vxlan"
    segmentation_id: int | None = Field(default=None, ge=1, le=(1 << 24) - 1)
    project_id: str | None = Field(default=None, min_length=1, max_length=64)
    # a provider network reaching the gateway nodes (router:external; admin only; flat or vlan)
    external: bool = False
    # external networks: MAC of the upstream (provider) router at the subnet's gateway_ip
    upstream_mac: str | None = None

    @field_validator("upstream_mac")
    @classmethod
    def _upstream_mac(cls, value):
        return None if value is None else parse_mac(value, unicast_for="the upstream router")


class NetworkUpdate(_Request):
    name: str = NAME


class NetworkOut(BaseModel):
    id: int
    external_id: str | None = None
    name: str
    project_id: str
    type: str
    segmentation_id: int | None
    subnets: list[int]
    external: bool = False
    upstream_mac: str | None = None
    status: Status
    status_reason: str | None
    created_at: datetime


# ---------------------------------------------------------------------------------------------- subnets


MAX_DNS_NAMESERVERS = 5
MAX_HOST_ROUTES = 20


def _strict_network(value):
    """An IPv4 network from a string, saying why not ("has host bits set", "not an IPv4 network")."""
    if isinstance(value, str):
        try:
            return ipaddress.IPv4Network(value)
        except ValueError as e:
            raise ValueError(str(e)) from None
    return value


class HostRoute(_Request):
    """A route a DHCP client installs (option 121): `destination` via `nexthop` (in the subnet)."""
    destination: ipaddress.IPv4Network
    nexthop: ipaddress.IPv4Address

    @field_validator("destination", mode="before")
    @classmethod
    def _destination(cls, value):
        return _strict_network(value)


def _unique(values: list, what: str) -> list:
    seen = set()
    for v in values:
        if v in seen:
            raise ValueError(f"{what} {v} is given twice")
        seen.add(v)
    return values


class _SubnetDhcp(_Request):
    """The DHCP fields of a subnet (docs/dhcp.md)."""
    enable_dhcp: bool = True
    dns_nameservers: list[ipaddress.IPv4Address] = Field(default_factory=list, max_length=MAX_DNS_NAMESERVERS)
    host_routes: list[HostRoute] = Field(default_factory=list, max_length=MAX_HOST_ROUTES)

    @field_validator("dns_nameservers")
    @classmethod
    def _dns(cls, value):
        return _unique(value, "DNS server")

    @field_validator("host_routes")
    @classmethod
    def _routes(cls, value):
        _unique([r.destination for r in value], "destination")
        return value


class SubnetCreate(_SubnetDhcp):
    external_id: str | None = EXTERNAL_ID
    network_id: int
    cidr: ipaddress.IPv4Network
    # Absent: the first host address; null: no gateway.
    gateway_ip: ipaddress.IPv4Address | None = None
    name: str = NAME
    project_id: str | None = Field(default=None, min_length=1, max_length=64)

    @field_validator("cidr", mode="before")
    @classmethod
    def _cidr(cls, value):
        # Say why ("has host bits set", "not an IPv4 network"), not only that it is invalid.
        return _strict_network(value)


class SubnetUpdate(_SubnetDhcp):
    """Only the fields given change; the DHCP servers follow in place (a renewing client gets the
    new options)."""
    name: str = NAME


class HostRouteOut(BaseModel):
    destination: str
    nexthop: str


class DhcpServerStatus(BaseModel):
    """The subnet's DHCP server on one node (one per node with ports of the network)."""
    node: str
    status: Status
    reason: str | None


class SubnetOut(BaseModel):
    id: int
    external_id: str | None = None
    name: str
    project_id: str
    network_id: int
    cidr: str
    gateway_ip: str | None
    enable_dhcp: bool = True
    dns_nameservers: list[str] = []
    host_routes: list[HostRouteOut] = []
    status: Status
    status_reason: str | None
    # the subnet's DHCP servers, per node: their own statuses, not the subnet's (docs/dhcp.md)
    dhcp_status: list[DhcpServerStatus] = []
    created_at: datetime


# ---------------------------------------------------------------------------------------------- ports


class FixedIpIn(_Request):
    subnet_id: int | None = None
    ip_address: ipaddress.IPv4Address | None = None


class FixedIpOut(BaseModel):
    subnet_id: int
    ip_address: str


def _check_mac(value: str | None) -> str | None:
    return None if value is None else parse_mac(value, unicast_for="a port")


# A port's addresses (Neutron's max_fixed_ips_per_port is 5 by default): without a bound one call
# could take thousands of addresses of a subnet, each allocated and compiled.
MAX_FIXED_IPS = 16


class PortCreate(_Request):
    external_id: str | None = EXTERNAL_ID
    network_id: int
    name: str = NAME
    mac_address: str | None = None
    # Absent: one address from the network's first subnet; []: no address. At most MAX_FIXED_IPS.
    fixed_ips: list[FixedIpIn] | None = Field(default=None, max_length=MAX_FIXED_IPS)
    node: str | None = Field(default=None, pattern=NODE_NAME_RE)
    interface_name: str | None = Field(default=None, pattern=IFNAME_RE)
    port_security: bool = True
    # Absent: the project's default group (none when port_security is false); []: no group.
    security_groups: list[int] | None = Field(default=None, max_length=32)
    project_id: str | None = Field(default=None, min_length=1, max_length=64)

    @field_validator("mac_address")
    @classmethod
    def _mac(cls, value):
        return _check_mac(value)


class PortUpdate(_Request):
    name: str = NAME
    node: str | None = Field(default=None, pattern=NODE_NAME_RE)
    interface_name: str | None = Field(default=None, pattern=IFNAME_RE)
    port_security: bool = True
    security_groups: list[int] = Field(default_factory=list, max_length=32)


class PortOut(BaseModel):
    id: int
    external_id: str | None = None
    name: str
    project_id: str
    network_id: int
    mac_address: str
    fixed_ips: list[FixedIpOut]
    node: str | None
    interface_name: str | None
    port_security: bool
    security_groups: list[int] = []
    router_id: int | None
    status: Status
    status_reason: str | None
    created_at: datetime


# ---------------------------------------------------------------------------------------------- routers


RouterMode = Literal["distributed", "fabric", "network-node"]   # where a router runs: docs/fabric.md


class ExternalGatewayIn(_Request):
    """A router's external gateway (Neutron's external_gateway_info): docs/external.md."""
    network_id: int
    # Absent: allocated from the external network's subnet (admins may choose one)
    ip_address: ipaddress.IPv4Address | None = None
    enable_snat: bool = True
    # the gateway node hosting the router's NAT (admin); absent: the first node of role gateway
    node: str | None = Field(default=None, pattern=NODE_NAME_RE)


class ExternalGatewayOut(BaseModel):
    network_id: int
    ip_address: str
    mac_address: str
    enable_snat: bool
    node: str


class RouterCreate(_Request):
    external_id: str | None = EXTERNAL_ID
    name: str = NAME
    project_id: str | None = Field(default=None, min_length=1, max_length=64)
    mode: RouterMode = "distributed"
    gateway_node: str | None = None   # network-node mode: default the first node of role gateway
    external_gateway: ExternalGatewayIn | None = None


class RouterUpdate(_Request):
    name: str = NAME
    mode: RouterMode | None = None
    gateway_node: str | None = None
    # given: set (an object) or clear (null) the external gateway; absent: unchanged
    external_gateway: ExternalGatewayIn | None = None


class RouterInterfaceCreate(_Request):
    external_id: str | None = EXTERNAL_ID
    subnet_id: int
    # Absent: generated (02:fd:...); a cloud that allocated the interface's MAC gives it here.
    mac_address: str | None = None

    @field_validator("mac_address")
    @classmethod
    def _mac(cls, value):
        return _check_mac(value)

    # Absent: the subnet's gateway_ip.
    ip_address: ipaddress.IPv4Address | None = None


class RouterInterfaceOut(BaseModel):
    id: int                 # the id of the port that holds the interface's address
    external_id: str | None = None
    router_id: int
    subnet_id: int
    network_id: int
    ip_address: str
    mac_address: str
    status: Status
    status_reason: str | None


class RouterOut(BaseModel):
    id: int
    external_id: str | None = None
    name: str
    project_id: str
    interfaces: list[RouterInterfaceOut]
    mode: RouterMode = "distributed"
    gateway_node: str | None = None
    external_gateway: ExternalGatewayOut | None = None
    status: Status
    status_reason: str | None
    created_at: datetime


# ---------------------------------------------------------------------------------------------- floating IPs


class FloatingIpCreate(_Request):
    external_id: str | None = EXTERNAL_ID
    floating_network_id: int
    # admin or the service identity (the driving cloud allocated it); absent: allocated
    floating_ip_address: ipaddress.IPv4Address | None = None
    port_id: int | None = None
    fixed_ip_address: ipaddress.IPv4Address | None = None      # which of the port's fixed IPs; absent: the first
    name: str = NAME
    project_id: str | None = Field(default=None, min_length=1, max_length=64)


class FloatingIpUpdate(_Request):
    """`port_id` null disassociates; another port moves the floating IP there."""
    port_id: int | None = None
    fixed_ip_address: ipaddress.IPv4Address | None = None
    name: str = NAME


class FloatingIpOut(BaseModel):
    id: int
    external_id: str | None = None
    name: str
    project_id: str
    floating_network_id: int
    floating_ip_address: str
    port_id: int | None
    fixed_ip_address: str | None
    router_id: int | None
    status: Status
    status_reason: str | None
    created_at: datetime


# ---------------------------------------------------------------------------------------------- status


class StatusOut(BaseModel):
    kind: str
    id: int
    status: Status
    status_reason: str | None
    state: str | None = None   # nodes only: the bootstrap state


class ErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorOut(BaseModel):
    detail: list[ErrorItem]
