"""Store models of the fabric: fabric switches, their discovered links, router modes.

- `FabricSwitch`: a managed fabric switch (an OVS bridge reached over OVSDB at `management_ip`, bridge
  `bridge`). Its VLAN range bounds the VLAN ids of tenant networks while it exists.
- `FabricLink`: which fabric switch port faces which node. `source` is `lldp` (learned by the controller's
  LLDP probes) or `declared` (given by the operator or the lab, used only until LLDP has spoken).
- `RouterMode`: where a router runs: `distributed` (no row needed), `fabric`, `network-node`.
"""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from fathom.store.base import Base, Resource, utcnow

ROUTER_MODES = ("distributed", "fabric", "network-node")
LINK_SOURCES = ("lldp", "declared")


class FabricSwitch(Resource, Base):
    __tablename__ = "fabric_switches"
    __table_args__ = (UniqueConstraint("name"), {"sqlite_autoincrement": True})
    management_ip: Mapped[str] = mapped_column(String(64))
    bridge: Mapped[str] = mapped_column(String(64), default="br-fabric")
    vlan_min: Mapped[int] = mapped_column(Integer, default=100)
    vlan_max: Mapped[int] = mapped_column(Integer, default=999)


class FabricLink(Base):
    __tablename__ = "fabric_links"
    __table_args__ = (UniqueConstraint("switch_id", "port_name", "source"), {"sqlite_autoincrement": True})
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    switch_id: Mapped[int] = mapped_column(ForeignKey("fabric_switches.id", ondelete="CASCADE"), index=True)
    port_name: Mapped[str] = mapped_column(String(64))
    ofport: Mapped[int | None] = mapped_column(Integer, nullable=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    source: Mapped[str] = mapped_column(String(16))
    last_seen: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class RouterMode(Base):
    __tablename__ = "router_modes"
    router_id: Mapped[int] = mapped_column(ForeignKey("routers.id", ondelete="CASCADE"), primary_key=True)
    mode: Mapped[str] = mapped_column(String(16), default="distributed")
    # network-node mode: the node whose router namespace forwards (a node of role gateway)
    gateway_node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="RESTRICT"),
                                                        nullable=True, index=True)
