"""Store tables of the node agents: what each agent last reported, and PPTMon attachments.

`node_agents`: one row per node whose agent has spoken: its facts (OVS version, datapath types,
kernel, eBPF, interfaces), the revision of host-local desired state it applied, the status of
each object it holds, and when it last reported (an agent that stops reporting is down). The
`revision`/`digest` pair numbers the node's desired state: the revision moves on whenever the
desired state's digest changes, so an agent can long-poll for "anything after revision N".

`pptmon_attachments`: the operator's PPTMon programs on a node's interfaces (admin resource).
"""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, BigInteger, DateTime, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from fathom.store.base import Base, Resource


class NodeAgent(Base):
    __tablename__ = "node_agents"
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True)
    revision: Mapped[int] = mapped_column(Integer, default=0)        # of the node's desired state
    digest: Mapped[str] = mapped_column(String(64), default="")      # of the desired state at `revision`
    applied_revision: Mapped[int | None] = mapped_column(Integer, nullable=True)
    facts: Mapped[dict] = mapped_column(JSON, default=dict)
    objects: Mapped[dict] = mapped_column(JSON, default=dict)        # "kind:id" -> {status, reason}
    agent_started: Mapped[float | None] = mapped_column(BigInteger, nullable=True)   # the agent's boot (ms)
    reported_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class PptmonAttachment(Resource, Base):
    """PPTMon eBPF programs on a node's interfaces: `ppt_in` at `in_interface`/`in_direction`,
    `ppt_out` at `out_interface`/`out_direction`, in `mode`, sampling every `period_ns`."""
    __tablename__ = "pptmon_attachments"
    __table_args__ = (UniqueConstraint("name"), {"sqlite_autoincrement": True})
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    chain: Mapped[str] = mapped_column(String(64))
    vnf_id: Mapped[int] = mapped_column(Integer, default=1)
    mode: Mapped[str] = mapped_column(String(16), default="source-sink")
    in_interface: Mapped[str] = mapped_column(String(15))
    in_direction: Mapped[str] = mapped_column(String(8), default="ingress")
    out_interface: Mapped[str] = mapped_column(String(15))
    out_direction: Mapped[str] = mapped_column(String(8), default="egress")
    period_ns: Mapped[int] = mapped_column(BigInteger, default=1_000_000_000)
