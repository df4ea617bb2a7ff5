"""The journal: Neutron's writes toward fathom, kept in Neutron's own database.

An entry is written in the same transaction as the Neutron change it describes (precommit), so a
change Neutron commits is never lost, whether or not fathom answers; a rolled-back change leaves no
entry. A thread in each API worker (networking_fathom.journal) replays the entries in order (`seq`).

An entry says what fathom should hold for one Neutron object: `set` (the object as Neutron has it
after the change, in `data`) or `delete`. Replaying a `set` makes fathom's object equal to `data`
(create, update, or delete and create), so replaying an entry twice, or after the full sync, is
harmless.

Every Neutron API worker runs a journal thread. A thread claims all pending entries of one object
before it sends any of them (`claim`: state `processing`, in a transaction of its own) and no
thread claims entries of an object while another holds some: one object's entries reach fathom
one claim at a time, in `seq` order, so an older write is never sent after a newer one. A claim
older than `[fathom] claim_timeout` (its worker died) is taken over.
"""
from __future__ import annotations

import datetime
import json

import sqlalchemy as sa
from neutron_lib.db import api as db_api
from neutron_lib.db import model_base

from .config import conf

PENDING, PROCESSING, COMPLETED, FAILED = "pending", "processing", "completed", "failed"


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
    claimed_at = sa.Column(sa.DateTime, nullable=True)            # when a journal thread took it (processing)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)


def record(context, object_type: str, operation: str, data: dict) -> None:
    """Add an entry inside the caller's transaction (call it from a precommit hook)."""
    with db_api.CONTEXT_WRITER.using(context):
        context.session.add(JournalEntry(
            object_type=object_type, object_uuid=data["id"], operation=operation,
            data=json.dumps(data, default=str), project_id=data.get("project_id") or data.get("tenant_id"),
            state=PENDING, attempts=0))


def _claimable(stale: datetime.datetime):
    return sa.or_(JournalEntry.state == PENDING,
                  sa.and_(JournalEntry.state == PROCESSING, JournalEntry.claimed_at < stale))


def _stale() -> datetime.datetime:
    return _now() - datetime.timedelta(seconds=conf().claim_timeout)


def pending(context, limit: int = 100) -> list[JournalEntry]:
    """The oldest entries no journal thread holds (pending, or claimed by a worker that died)."""
    with db_api.CONTEXT_READER.using(context):
        return (context.session.query(JournalEntry).filter(_claimable(_stale()))
                .order_by(JournalEntry.seq).limit(limit).all())


def count_pending(context) -> int:
    with db_api.CONTEXT_READER.using(context):
        return context.session.query(JournalEntry).filter_by(state=PENDING).count()


class _Taken(Exception):
    """Another journal thread claimed some of the entries first (the claim is rolled back)."""


def claim(context, object_uuid: str, seqs: list[int]) -> bool:
    """Take `seqs`, every claimable entry of one object this thread read, for this thread; False
    (nothing taken) when another thread holds entries of the object or took one of these first.
    The count of updated rows is the lock: two threads reading the same entries cannot both
    update all of them (the second's UPDATE finds them `processing`, whatever the database's
    isolation level)."""
    stale = _stale()
    try:
        with db_api.CONTEXT_WRITER.using(context):
            held = (context.session.query(JournalEntry.seq)
                    .filter(JournalEntry.object_uuid == object_uuid, JournalEntry.state == PROCESSING,
                            JournalEntry.claimed_at >= stale, JournalEntry.seq.notin_(seqs)).first())
            if held is not None:
                raise _Taken()
            taken = (context.session.query(JournalEntry)
                     .filter(JournalEntry.seq.in_(seqs), _claimable(stale))
                     .update({"state": PROCESSING, "claimed_at": _now()}, synchronize_session=False))
            if taken != len(seqs):
                raise _Taken()
    except _Taken:
        return False
    return True


def finish(context, seqs: list[int], state: str, error: str | None = None, attempted: int | None = None) -> None:
    """Leave claimed entries in `state` (pending again: claimable by any thread); `attempted` is
    the one that was sent (its attempts count up)."""
    with db_api.CONTEXT_WRITER.using(context):
        for entry in context.session.query(JournalEntry).filter(JournalEntry.seq.in_(seqs)):
            entry.state = state
            entry.attempts += 1 if entry.seq == attempted else 0
            entry.last_error = error[:1024] if error else None
            entry.updated_at = _now()
            entry.claimed_at = None


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
