"""SQLAlchemy models of external connectivity: router gateways and floating IPs (fathom/store/external.py
holds their operations; docs/external.md the design).

Each holds its address on the external network through a port of that network that no node binds
(`address_port_id`, named `router-gateway-<id>` / `floating-ip-<id>`): the address is then unique in
the network by the same constraint as every fixed IP, and ports cannot take it.
"""
from __future__ import annotations

from sqlalchemy import Boolean, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from fathom.pipeline.catalogue import SECGROUP_ZONE_MAX
from fathom.store.base import Base, Resource
from fathom.store.models import External

# Conntrack zones of routers' SNAT and of floating IPs: the upper half of the 16-bit zone space, above
# the security groups' per-network zones (1..SECGROUP_ZONE_MAX): the two never share a zone.
CT_ZONE_MIN, CT_ZONE_MAX = SECGROUP_ZONE_MAX + 1, 0xFFFF


class RouterGateway(Base):
    """A router's external gateway: one per router."""
    __tablename__ = "router_gateways"
    __table_args__ = (UniqueConstraint("ct_zone"),)
    router_id: Mapped[int] = mapped_column(ForeignKey("routers.id", ondelete="CASCADE"), primary_key=True)
    network_id: Mapped[int] = mapped_column(ForeignKey("networks.id", ondelete="RESTRICT"), index=True)
    address_port_id: Mapped[int] = mapped_column(ForeignKey("ports.id", ondelete="RESTRICT"), index=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="RESTRICT"), index=True)
    ct_zone: Mapped[int] = mapped_column(Integer)
    snat: Mapped[bool] = mapped_column(Boolean, default=True)


class FloatingIp(Resource, External, Base):
    """An address of an external network, mapped 1:1 to a port's fixed IP while `port_id` is set."""
    __tablename__ = "floating_ips"
    __table_args__ = (UniqueConstraint("ct_zone"), UniqueConstraint("port_id"), {"sqlite_autoincrement": True})
    network_id: Mapped[int] = mapped_column(ForeignKey("networks.id", ondelete="RESTRICT"), index=True)
    address_port_id: Mapped[int] = mapped_column(ForeignKey("ports.id", ondelete="RESTRICT"), index=True)
    ip_address: Mapped[str] = mapped_column(String(64))
    port_id: Mapped[int | None] = mapped_column(ForeignKey("ports.id", ondelete="SET NULL"), nullable=True)
    fixed_ip: Mapped[str | None] = mapped_column(String(64), nullable=True)
    router_id: Mapped[int | None] = mapped_column(ForeignKey("routers.id", ondelete="RESTRICT"), nullable=True,
                                                  index=True)
    ct_zone: Mapped[int] = mapped_column(Integer)
