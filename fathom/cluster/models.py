"""The cluster's tables: the replicas (controller processes sharing one PostgreSQL store), one
lease per switch and the keys they share. Every time in them is PostgreSQL's clock
(`clock_timestamp()`), written by the statements of fathom.cluster.leases, never a replica's."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, Float, LargeBinary, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from fathom.store.base import Base


class Replica(Base):
    """A controller process of the cluster. It is live while its heartbeat is younger than the
    lease time (fathom.cluster.leases.Timing.lease)."""
    __tablename__ = "cluster_replicas"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    address: Mapped[str] = mapped_column(String(255), default="")        # where its API answers
    started: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    heartbeat: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    schema_version: Mapped[str] = mapped_column(String(64))              # the store's Alembic head it runs
    pki_fingerprint: Mapped[str] = mapped_column(String(64))             # SHA-256 of its CA certificates
    # its OpenFlow listener as host:port (host empty: the address its peers reach the switches from,
    # i.e. replicas on one host); every switch is given every live replica's as a controller
    openflow: Mapped[str] = mapped_column(String(255), default="", server_default="")
    # seconds from a write's commit to its notification reaching this replica (the last one it got)
    feed_lag: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the switches it has an OpenFlow connection to, comma-separated (null: it may master any)
    reaches: Mapped[str | None] = mapped_column(Text, nullable=True)
    # JSON: the nodes whose agents it hears now (holding a long-poll, or heard lately) -> seconds since
    agents: Mapped[str | None] = mapped_column(Text, nullable=True)
    # JSON: what the switches it masters say that is not simply `ok` (fathom.cluster.leases.Round.reports)
    switch_states: Mapped[str | None] = mapped_column(Text, nullable=True)


class Lease(Base):
    """Who is master of a switch, until when. `epoch` grows by one at every change of holder and is
    the OpenFlow generation_id the holder sends with its master role request."""
    __tablename__ = "cluster_leases"
    switch: Mapped[str] = mapped_column(String(64), primary_key=True)    # e.g. a datapath id in hex
    holder: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    epoch: Mapped[int] = mapped_column(BigInteger, default=0)
    expires: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    renewed: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class SharedKey(Base):
    """A secret every replica uses alike, made by the first that needs it (fathom.cluster.leases.shared_key):
    `lldp` signs the LLDP probes, so one replica verifies a probe another sent."""
    __tablename__ = "cluster_keys"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    key: Mapped[bytes] = mapped_column(LargeBinary)
