"""SQLAlchemy models of service function chains, named as networking-sfc names them: port pairs
(a VNF instance's ingress and egress ports), port pair groups (interchangeable instances), flow
classifiers (which traffic enters a chain) and port chains (ordered groups + classifiers).

Membership is a column on the member, since each belongs to at most one parent (networking-sfc's
rule too): a port pair's `group_id`, a group's `chain_id` and `position` in that chain, a
classifier's `chain_id`. A port takes part in at most one port pair (unique ingress and egress;
fathom/store/sfc.py also refuses a port that is the ingress of one pair and the egress of another):
the steering knows where a packet is in a chain by the port it comes back from.

A chain's `pptmon` ({"period_ns": N}, or null = off) asks for PPTMon on every VNF of the chain: the
node agents attach its programs (fathom.model.hostlocal_desired derives where, from the model).
"""
from __future__ import annotations

from sqlalchemy import JSON, Boolean, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from fathom.store.base import Base, Resource
from fathom.store.models import External


class PortChain(Resource, External, Base):
    __tablename__ = "sfc_port_chains"
    __table_args__ = ({"sqlite_autoincrement": True},)
    symmetric: Mapped[bool] = mapped_column(Boolean, default=False)
    pptmon: Mapped[dict | None] = mapped_column(JSON, nullable=True)   # {"period_ns": N} or None (off)


class PortPairGroup(Resource, External, Base):
    __tablename__ = "sfc_port_pair_groups"
    __table_args__ = (UniqueConstraint("chain_id", "position"), {"sqlite_autoincrement": True})
    chain_id: Mapped[int | None] = mapped_column(ForeignKey("sfc_port_chains.id", ondelete="SET NULL"),
                                                 nullable=True, index=True)
    position: Mapped[int | None] = mapped_column(Integer, nullable=True)


class PortPair(Resource, External, Base):
    __tablename__ = "sfc_port_pairs"
    __table_args__ = (UniqueConstraint("ingress_port_id"), UniqueConstraint("egress_port_id"),
                      {"sqlite_autoincrement": True})
    ingress_port_id: Mapped[int] = mapped_column(ForeignKey("ports.id", ondelete="RESTRICT"))
    egress_port_id: Mapped[int] = mapped_column(ForeignKey("ports.id", ondelete="RESTRICT"))
    group_id: Mapped[int | None] = mapped_column(ForeignKey("sfc_port_pair_groups.id", ondelete="SET NULL"),
                                                 nullable=True, index=True)


class FlowClassifier(Resource, External, Base):
    __tablename__ = "sfc_flow_classifiers"
    __table_args__ = ({"sqlite_autoincrement": True},)
    logical_source_port_id: Mapped[int] = mapped_column(ForeignKey("ports.id", ondelete="RESTRICT"), index=True)
    logical_destination_port_id: Mapped[int | None] = mapped_column(
        ForeignKey("ports.id", ondelete="RESTRICT"), nullable=True, index=True)
    protocol: Mapped[int | None] = mapped_column(Integer, nullable=True)
    source_ip_prefix: Mapped[str | None] = mapped_column(String(64), nullable=True)
    destination_ip_prefix: Mapped[str | None] = mapped_column(String(64), nullable=True)
    source_port_range_min: Mapped[int | None] = mapped_column(Integer, nullable=True)
    source_port_range_max: Mapped[int | None] = mapped_column(Integer, nullable=True)
    destination_port_range_min: Mapped[int | None] = mapped_column(Integer, nullable=True)
    destination_port_range_max: Mapped[int | None] = mapped_column(Integer, nullable=True)
    chain_id: Mapped[int | None] = mapped_column(ForeignKey("sfc_port_chains.id", ondelete="SET NULL"),
                                                 nullable=True, index=True)
