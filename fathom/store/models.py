"""SQLAlchemy 2 models of the tenant resources (the fabric's and PPTMon's tables are in
fabric_models.py and pptmon_models.py; fathom.store.tables gathers all). The schema itself is created by the Alembic migrations in
fathom/store/migrations (tests check that the two agree).

Ids are integers: they go into OpenFlow cookies, registers and group ids (fathom.pipeline.cookies).
Tables use AUTOINCREMENT on SQLite so an id is never reused after a delete; PostgreSQL sequences
never reuse ids anyway.
"""
from __future__ import annotations

import ipaddress
from datetime import datetime

from sqlalchemy import (
    JSON, Boolean, DateTime, ForeignKey, Integer, String, UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from fathom.store.base import Base, Resource, utcnow

STATUSES = ("pending", "active", "error", "down")
NODE_STATES = ("init", "device_created", "complete", "error")
NODE_ROLES = ("compute", "gateway")
DATAPATH_TYPES = ("system", "netdev")
NETWORK_TYPES = ("vxlan", "vlan", "flat")

class External:
    """The object's id in the cloud that drives fathom (Neutron's UUID), so its driver finds it again
    after a lost answer, a restart or a full sync; only the admin or the service identity sets it."""
    external_id: Mapped[str | None] = mapped_column(String(64), nullable=True, unique=True, index=True)


class Node(Resource, Base):
    __tablename__ = "nodes"
    __table_args__ = (UniqueConstraint("name"), {"sqlite_autoincrement": True})
    role: Mapped[str] = mapped_column(String(16), default="compute")
    tunnel_ip: Mapped[str | None] = mapped_column(String(64), nullable=True)
    management_ip: Mapped[str | None] = mapped_column(String(64), nullable=True)
    state: Mapped[str] = mapped_column(String(16), default="init")
    # the OVS datapath of the node's bridges, set by the operator; NULL: what its agent reports
    # (`system` where the kernel module is loaded, `netdev` otherwise)
    datapath_type: Mapped[str | None] = mapped_column(String(16), nullable=True)


class Network(Resource, External, Base):
    __tablename__ = "networks"
    # One VNI / VLAN id per network; flat networks have none (NULLs never collide).
    __table_args__ = (UniqueConstraint("type", "segmentation_id"), {"sqlite_autoincrement": True})
    type: Mapped[str] = mapped_column(String(16))
    segmentation_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # a provider network reaching the gateway nodes (Neutron's router:external); its upstream
    # router's MAC, the next hop of every router gateway on it (docs/external.md)
    external: Mapped[bool] = mapped_column(Boolean, default=False)
    upstream_mac: Mapped[str | None] = mapped_column(String(17), nullable=True)


class Subnet(Resource, External, Base):
    __tablename__ = "subnets"
    __table_args__ = ({"sqlite_autoincrement": True},)
    network_id: Mapped[int] = mapped_column(ForeignKey("networks.id", ondelete="CASCADE"), index=True)
    cidr: Mapped[str] = mapped_column(String(64))
    gateway_ip: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # DHCP (docs/dhcp.md): served on every node with ports of the network by its agent
    enable_dhcp: Mapped[bool] = mapped_column(Boolean, default=True)
    dns_nameservers: Mapped[list] = mapped_column(JSON, default=list)     # ["192.0.2.53", ...]
    host_routes: Mapped[list] = mapped_column(JSON, default=list)         # [{"destination", "nexthop"}, ...]
    # the DHCP servers' status, written by the controller: [{"node", "status", "reason"}, ...]
    dhcp_status: Mapped[list] = mapped_column(JSON, default=list)

    @property
    def prefix(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.cidr)

    def prefix_overlaps(self, other: ipaddress.IPv4Network) -> bool:
        return self.prefix.overlaps(other)


class Router(Resource, External, Base):
    __tablename__ = "routers"
    __table_args__ = ({"sqlite_autoincrement": True},)


class Port(Resource, External, Base):
    """A workload port, or a router interface when `router_id` is set."""
    __tablename__ = "ports"
    __table_args__ = (UniqueConstraint("network_id", "mac_address"),
                      UniqueConstraint("node_id", "interface_name"),
                      {"sqlite_autoincrement": True})
    # network_id and node_id have no index of their own: the unique constraints above lead with them
    network_id: Mapped[int] = mapped_column(ForeignKey("networks.id", ondelete="RESTRICT"))
    mac_address: Mapped[str] = mapped_column(String(17))
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="RESTRICT"), nullable=True)
    interface_name: Mapped[str | None] = mapped_column(String(64), nullable=True)
    port_security: Mapped[bool] = mapped_column(Boolean, default=True)
    router_id: Mapped[int | None] = mapped_column(ForeignKey("routers.id", ondelete="RESTRICT"),
                                                  nullable=True, index=True)

    fixed_ips: Mapped[list["IpAllocation"]] = relationship(
        back_populates="port", cascade="all, delete-orphan", order_by="IpAllocation.id")
    node: Mapped[Node | None] = relationship()
    security_group_links: Mapped[list["PortSecurityGroup"]] = relationship(
        cascade="all, delete-orphan", order_by="PortSecurityGroup.group_id")

    @property
    def security_group_ids(self) -> list[int]:
        return [link.group_id for link in self.security_group_links]


class IpAllocation(Base):
    """One fixed IP of a port. An address is unique within a network, not across networks."""
    __tablename__ = "ip_allocations"
    __table_args__ = (UniqueConstraint("network_id", "ip_address"), {"sqlite_autoincrement": True})
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    port_id: Mapped[int] = mapped_column(ForeignKey("ports.id", ondelete="CASCADE"), index=True)
    subnet_id: Mapped[int] = mapped_column(ForeignKey("subnets.id", ondelete="RESTRICT"), index=True)
    network_id: Mapped[int] = mapped_column(ForeignKey("networks.id", ondelete="RESTRICT"))
    ip_address: Mapped[str] = mapped_column(String(64))

    port: Mapped[Port] = relationship(back_populates="fixed_ips")


class TapPolicy(Resource, External, Base):
    """A vTAP policy (the vTAP paper, Fig. 4): copy sender -> receiver traffic to one or two monitors.

    Identifiers: monitors are always ports (given by id, name or MAC+IP); the sender is a port or "*"
    (anyone: `sender_is_port` False, the receiver then a port); the receiver is a port, a bare MAC+IP
    or "*" (anyone). A port deleted under a policy leaves its `*_port_id` NULL and the policy
    in error (fathom/store/taps.py says why). Filters are JSON: see docs/vtap.md.
    """
    __tablename__ = "tap_policies"
    __table_args__ = ({"sqlite_autoincrement": True},)
    sender_port_id: Mapped[int | None] = mapped_column(
        ForeignKey("ports.id", ondelete="SET NULL"), nullable=True, index=True)
    sender_is_port: Mapped[bool] = mapped_column(Boolean, default=True)
    receiver_port_id: Mapped[int | None] = mapped_column(
        ForeignKey("ports.id", ondelete="SET NULL"), nullable=True, index=True)
    receiver_is_port: Mapped[bool] = mapped_column(Boolean, default=True)
    receiver_mac: Mapped[str] = mapped_column(String(17))
    receiver_ip: Mapped[str] = mapped_column(String(64))
    monitor_port_id: Mapped[int | None] = mapped_column(
        ForeignKey("ports.id", ondelete="SET NULL"), nullable=True, index=True)
    monitor2_port_id: Mapped[int | None] = mapped_column(
        ForeignKey("ports.id", ondelete="SET NULL"), nullable=True, index=True)
    has_monitor2: Mapped[bool] = mapped_column(Boolean, default=False)
    direction: Mapped[str] = mapped_column(String(16), default="forward")
    priority: Mapped[int] = mapped_column(Integer, default=100)
    filters: Mapped[dict] = mapped_column(JSON, default=dict)
    truncate: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rate_pps: Mapped[int | None] = mapped_column(Integer, nullable=True)



class SecurityGroup(Resource, External, Base):
    """A security group (Neutron semantics): its rules say what its member ports may send and
    receive; fathom/apps/secgroups compiles them. Each project has one default group, made on first
    use (`DefaultSecurityGroup`)."""
    __tablename__ = "security_groups"
    __table_args__ = ({"sqlite_autoincrement": True},)
    description: Mapped[str] = mapped_column(String(255), default="")

    rules: Mapped[list["SecurityGroupRule"]] = relationship(
        back_populates="group", cascade="all, delete-orphan", passive_deletes=True,
        order_by="SecurityGroupRule.id", foreign_keys="SecurityGroupRule.group_id")


class SecurityGroupRule(External, Base):
    """One rule; rules are never changed, only created and deleted (as in Neutron). A rule whose
    remote group is deleted goes with it."""
    __tablename__ = "security_group_rules"
    __table_args__ = ({"sqlite_autoincrement": True},)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(String(64), index=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("security_groups.id", ondelete="CASCADE"), index=True)
    direction: Mapped[str] = mapped_column(String(16))
    ethertype: Mapped[str] = mapped_column(String(8), default="IPv4")
    protocol: Mapped[int | None] = mapped_column(Integer, nullable=True)
    port_range_min: Mapped[int | None] = mapped_column(Integer, nullable=True)
    port_range_max: Mapped[int | None] = mapped_column(Integer, nullable=True)
    remote_ip_prefix: Mapped[str | None] = mapped_column(String(64), nullable=True)
    remote_group_id: Mapped[int | None] = mapped_column(
        ForeignKey("security_groups.id", ondelete="CASCADE"), nullable=True, index=True)
    description: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    group: Mapped[SecurityGroup] = relationship(back_populates="rules", foreign_keys=[group_id])


class PortSecurityGroup(Base):
    """A port's membership of a group. A group with member ports cannot be deleted."""
    __tablename__ = "port_security_groups"
    port_id: Mapped[int] = mapped_column(ForeignKey("ports.id", ondelete="CASCADE"), primary_key=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("security_groups.id", ondelete="RESTRICT"),
                                          primary_key=True, index=True)


class DefaultSecurityGroup(Base):
    """The default group of each project (one per project: the primary key)."""
    __tablename__ = "default_security_groups"
    project_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("security_groups.id", ondelete="CASCADE"), unique=True)
