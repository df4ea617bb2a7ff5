"""Store table of PPTMon records: what agents deliver to the controller.

One row per sampled packet as reported by a chain's sink. The hops stay a JSON list (they are
read back whole); `vnfs` repeats the VNF ids as ",1,2,3," so that "records through VNF k" is a
portable LIKE filter. `key` (fathom.pptmon.records.record_key) makes ingestion idempotent.
Rows are removed by retention (fathom.api.pptmon), never updated.

Records of a port chain measured through the API (its `pptmon`) carry `port_chain_id`, and each hop
names its port pair group, port pair and node: the controller maps the VNF ids to them from the
model when it stores the record (fathom.model.chains.chain_pptmon), it does not take them from
the record. Other records have `port_chain_id` null and hops with the VNF id only.
"""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, BigInteger, DateTime, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from fathom.store.base import Base, utcnow


class PptmonRecord(Base):
    __tablename__ = "pptmon_records"
    __table_args__ = (UniqueConstraint("key"),
                      Index("ix_pptmon_records_chain_time", "chain", "time_ns"),
                      {"sqlite_autoincrement": True})
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(32))
    chain: Mapped[str] = mapped_column(String(64))
    node: Mapped[str] = mapped_column(String(64), default="")
    vnf_ns: Mapped[str] = mapped_column(String(64))
    placement: Mapped[str] = mapped_column(String(16))
    sink_vnf: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)
    flags: Mapped[int] = mapped_column(Integer, default=0)
    ktime_ns: Mapped[int] = mapped_column(BigInteger)
    time_ns: Mapped[int] = mapped_column(BigInteger, index=True)
    vnfs: Mapped[str] = mapped_column(String(64))
    hops: Mapped[list] = mapped_column(JSON)
    port_chain_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    e2e_us: Mapped[int | None] = mapped_column(Integer, nullable=True)
    flow: Mapped[dict] = mapped_column(JSON)
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
