"""Writes' request ids (the `Idempotency-Key` header, fathom.api.request_ids): one row per write a
client named, so that the same write sent again (to this controller or another replica) is answered
with the recorded response instead of being run twice. Rows older than RETENTION are deleted."""
from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import DateTime, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from fathom.store.base import Base, utcnow

RETENTION = timedelta(hours=24)   # how long a request id is remembered


class RequestId(Base):
    """`scope`: SHA-256 of the caller's credential (a request id is the caller's own); `key`: the
    request id; `fingerprint`: SHA-256 of the method, path, query, X-Project and body. The row is
    inserted in the write's own transaction; `status`/`body` are the response, recorded once it is
    sent (None while the write runs, or if the controller that ran it stopped before recording)."""
    __tablename__ = "request_ids"
    scope: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    content_type: Mapped[str | None] = mapped_column(String(128), nullable=True)
    body: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
