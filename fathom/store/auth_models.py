"""Store table of API tokens: bearer credentials the controller issues (fathom/auth/tokens.py).

Only a SHA-256 digest of each token is kept; the token itself is shown once, when it is created.
A token carries its project, its roles (comma separated: admin, member, service, agent), for the
agent role the node it speaks for, an optional expiry and, once revoked, when.
"""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from fathom.store.base import Base, utcnow


class ApiToken(Base):
    __tablename__ = "api_tokens"
    __table_args__ = (UniqueConstraint("digest"), {"sqlite_autoincrement": True})
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255), default="")
    digest: Mapped[str] = mapped_column(String(64))          # sha256 hex of the token
    project_id: Mapped[str] = mapped_column(String(64))
    roles: Mapped[str] = mapped_column(String(255))          # "admin" / "member,service" ...
    node: Mapped[str | None] = mapped_column(String(64), nullable=True)   # agent tokens: its node
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
