"""The journal: Neutron's writes toward fathom, kept in Neutron's own database.

An entry is written in the same transaction as the Neutron change it describes (precommit), so a
change Neutron commits is never lost, whether or not fathom answers; a rolled-back change leaves no
entry. One thread (networking_fathom.journal) replays the entries in order (`seq`).

An entry says what fathom should hold for one Neutron object: `set` (the object as Neutron has it
after the change, in `data`) or `delete`. Replaying a `set` makes fathom's object equal to `data`
(create, update, or delete and create), so replaying an entry twice, or after the full sync, is
harmless.
"""
from __future__ import annotations

import datetime
import json

import sqlalchemy as sa
from neutron_lib.db import api as db_api
from neutron_lib.db import model_base

PENDING, COMPLETED, FAILED = "pending", "completed", "failed"


class JournalEntry(model_base.BASEV2):
    __tablename__ = "fathom_journal"
    seq = sa.Column(sa.Integer, primary_key=True, autoincrement=True)
    object_type = sa.Column(sa.String(36), nullable=False)        # a networking_fathom.resources kind
    object_uuid = sa.Column(sa.String(36), nullable=False, index=True)
    operation = sa.Column(sa.String(16), nullable=False)          # set / delete
    data = sa.Column(sa.Text, nullable=False)                     # JSON: the Neutron object
    project_id = sa.Column(sa.String(255), nullable=True)
    state = sa.Column(sa.String(16), nullable=False, default=PENDING, index=True)
    attempts = sa.Column(sa.Integer, nullable=False, default=0)
    last_error = sa.Column(sa.String(1024), nullable=True)
    created_at = sa.Column(sa.DateTime, nullable=False, default=lambda: _now())
    updated_at = sa.Column(sa.DateTime, nullable=True)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)


def record(context, object_type: str, operation: str, data: dict) -> None:
    """Add an entry inside the caller's transaction (call it from a precommit hook)."""
    with db_api.CONTEXT_WRITER.using(context):
        context.session.add(JournalEntry(
            object_type=object_type, object_uuid=data["id"], operation=operation,
            data=json.dumps(data, default=str), project_id=data.get("project_id") or data.get("tenant_id"),
            state=PENDING, attempts=0))


def pending(context, limit: int = 100) -> list[JournalEntry]:
    with db_api.CONTEXT_READER.using(context):
        return (context.session.query(JournalEntry).filter_by(state=PENDING)
                .order_by(JournalEntry.seq).limit(limit).all())


def count_pending(context) -> int:
    with db_api.CONTEXT_READER.using(context):
        return context.session.query(JournalEntry).filter_by(state=PENDING).count()


def finish(context, seq: int, state: str, error: str | None = None, attempt: bool = True) -> None:
    with db_api.CONTEXT_WRITER.using(context):
        entry = context.session.get(JournalEntry, seq)
        if entry is None:
            return
        entry.state = state
        entry.attempts += 1 if attempt else 0
        entry.last_error = error[:1024] if error else None
        entry.updated_at = _now()


def projects(context) -> set[str]:
    """Projects the journal has named (the full sync also looks at these in fathom)."""
    with db_api.CONTEXT_READER.using(context):
        return {p for (p,) in context.session.query(JournalEntry.project_id).distinct() if p}


def purge_completed(context, older_than: float) -> int:
    cutoff = _now() - datetime.timedelta(seconds=older_than)
    with db_api.CONTEXT_WRITER.using(context):
        return (context.session.query(JournalEntry)
                .filter(JournalEntry.state == COMPLETED, JournalEntry.updated_at < cutoff)
                .delete(synchronize_session=False))


def counts(context) -> dict[str, int]:
    with db_api.CONTEXT_READER.using(context):
        return dict(context.session.query(JournalEntry.state, sa.func.count()).group_by(JournalEntry.state).all())
