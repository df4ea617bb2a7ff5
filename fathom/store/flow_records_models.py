"""Store tables of the flow records: the sampling rates (fathom.model.flow_records): one row per project
(`port_id` NULL) and per port that has its own. `scope` ("project:<id>" or "port:<id>") is unique,
so a project or port has one row whichever way it was written (NULLs are distinct in a unique
constraint). A port's row goes with the port (ON DELETE CASCADE)."""
from __future__ import annotations

from sqlalchemy import ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from fathom.store.base import Base


class FlowSampling(Base):
    __tablename__ = "flow_sampling"
    __table_args__ = (UniqueConstraint("scope"), {"sqlite_autoincrement": True})
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    scope: Mapped[str] = mapped_column(String(80))
    project_id: Mapped[str] = mapped_column(String(64), index=True)
    port_id: Mapped[int | None] = mapped_column(ForeignKey("ports.id", ondelete="CASCADE"), nullable=True,
                                                index=True)
    ingress: Mapped[int] = mapped_column(Integer, default=0)
    admit: Mapped[int] = mapped_column(Integer, default=0)
    drop: Mapped[int] = mapped_column(Integer, default=0)


class FlowRecordExport(Base):
    """The external IPFIX collector the controller forwards filed records to (one row, id 1, or
    none: no export). `host` is an IP address literal (the controller resolves no names)."""
    __tablename__ = "flow_record_export"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(String(45))
    port: Mapped[int] = mapped_column(Integer)
