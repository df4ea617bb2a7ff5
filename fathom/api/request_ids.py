"""Request ids: a write sent twice (a client's retry on another replica after a lost answer) runs once.

A client names a write with the `Idempotency-Key` header (1 to 64 of `A-Z a-z 0-9 . _ : -`, made
once per logical call and sent again with each retry of it). The key belongs to the caller's
credential (its scope is the SHA-256 of the Authorization header). The first request with a key
runs; the store's write (fathom.api.deps.Store.write) inserts the key's row last in its own
transaction, so the key is taken if and only if the write committed. The response is recorded in
that row before it is sent (by the write's own transaction for the writes in ANSWERED_BY_WRITE).
A later request with the same key and the same method, path, query, X-Project and body
gets the recorded response (header `Idempotent-Replayed: true`) and runs nothing; with anything
different it is refused (422). While the first still runs, a repeat is answered 503 with
Retry-After; a repeat of a write whose response held a credential (a token's creation) is
refused (409), and so is, RUNNING_AT_MOST after its commit, a repeat of a key whose write committed
but whose response was never recorded (the controller that ran it stopped in between). Keys are
remembered for RETENTION (24 h).

The writes in ANSWERED_BY_WRITE (a port's creation: the API's most frequent write) cost no statement
and no thread hop of their own: their route's one effect is one store write, which inserts the key
with the response it makes (`Store.write(..., answer=...)`; a port's creation on PostgreSQL, in the
statement that writes its rows: `Recorded`), and the key is looked up only when the request did not
take it: a repeat runs, finds its key taken by the commit it repeats (or its checks fail against
what that commit made), rolls back, and gets the recorded response.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Row
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from fathom.api.limits import replaying, whole_body
from fathom.store.base import utcnow
from fathom.store.db import READ_ONLY, driver_sql, run_prepared
from fathom.store.errors import Busy
from fathom.store.request_models import RETENTION, RequestId

LOG = logging.getLogger(__name__)
HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
VALID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# a key's row is inserted last in its write's transaction and its response recorded right after the
# commit: a row still without response after this long lost it (the controller that ran it stopped)
RUNNING_AT_MOST = timedelta(seconds=10)
SWEEP_EVERY = 60.0                          # seconds between deletions of expired keys (per process)
SECRET_PATHS = ("/v1/tokens",)              # responses holding a credential: not kept, a repeat is refused
# (method, path) of the writes whose only effect is one Store.write that records its own response
ANSWERED_BY_WRITE = frozenset({("POST", "/v1/ports")})


@dataclass
class Pending:
    """The key of the request being run: claimed by the first committed store write."""
    scope: str
    key: str
    fingerprint: str
    claimed: bool = False
    recorded: bool = False      # the response was recorded with the key, in the write's transaction


PENDING: ContextVar[Pending | None] = ContextVar("fathom_request_id", default=None)
# The table's rows are read and written with SQLAlchemy Core, not the ORM: one row by primary key
# on every write request, where the ORM's unit of work and bulk-statement machinery cost more CPU
# than the statement itself.
_ROWS = RequestId.__table__
_INSERT = insert(_ROWS)      # its values as parameters: one statement compiled once
_INSERT_SQL = driver_sql(_INSERT, postgresql.psycopg.dialect())[0]


class RequestIdRunning(Busy):
    """Another request with this key is being run: its response will be there shortly."""


def unclaimed() -> Pending | None:
    """The running request's key, if it has one not taken yet."""
    pending = PENDING.get()
    return None if pending is None or pending.claimed else pending


class Recorded(Response):
    """A write's response that its own statement recorded with the request's key, in its transaction
    (fathom.api.ports: a port's creation, with fathom.store.ops.AnswerRow): Store.write records it no
    more."""


def claim(session: Session, answer: tuple[int, str, bytes] | None = None) -> bool:
    """Take the running request's key in the store write's transaction (fathom.api.deps.Store.write):
    a second request with the same key then fails this insert on the primary key. `answer` (status,
    content type, body): the response, recorded with the key. Whether a key was taken."""
    pending = PENDING.get()
    if pending is None or pending.claimed:
        return False
    status, content_type, body = answer or (None, None, None)
    row = {"scope": pending.scope, "key": pending.key, "fingerprint": pending.fingerprint, "created": utcnow(),
           "status": status, "content_type": content_type, "body": body}
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        run_prepared(conn, _INSERT_SQL, row, rows=False)   # the key's row is no part of the model: not told
    else:
        conn.execute(_INSERT, row)
    return True


def claimed(answered: bool = False) -> None:
    """The write that claimed the key committed (`answered`: with the response)."""
    pending = PENDING.get()
    if pending is not None:
        pending.claimed = True
        pending.recorded = answered


def is_key_conflict(error: Exception) -> bool:
    return "request_ids" in str(getattr(error, "orig", error))


def _error(status: int, msg: str, kind: str, headers: list | None = None) -> tuple[int, list, bytes]:
    body = json.dumps({"detail": [{"loc": ["header", HEADER], "msg": msg, "type": kind}]}).encode()
    return status, [(b"content-type", b"application/json"), *(headers or [])], body


class RequestIds:
    """ASGI middleware of the API (inside fathom.api.limits.BoundedInput, which bounds the body)."""

    def __init__(self, app, engine: Engine):
        self.app, self.engine = app, engine
        # On PostgreSQL the lookup and the recording are one statement each, run without a
        # transaction around it (no BEGIN and COMMIT round trips); SQLite's connections begin
        # their own (fathom.store.db), and keep them.
        self._single = (engine.execution_options(isolation_level="AUTOCOMMIT")
                        if engine.dialect.name == "postgresql" else None)
        self._swept = 0.0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in WRITES:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        raw = headers.get(HEADER.lower().encode())
        if raw is None:
            return await self.app(scope, receive, send)
        key = raw.decode("latin-1")
        if not VALID.fullmatch(key):
            return await self._send(send, *_error(
                422, f"{HEADER} must be 1 to 64 of A-Z a-z 0-9 . _ : -", "invalid"))
        body = await whole_body(receive)
        if body is None:
            return   # the client went away
        who = hashlib.sha256(headers.get(b"authorization", b"")).hexdigest()
        fingerprint = hashlib.sha256(b"\0".join((
            scope["method"].encode(), scope["path"].encode(), scope.get("query_string", b""),
            headers.get(b"x-project", b""), body))).hexdigest()
        answered_by_write = (scope["method"], scope["path"]) in ANSWERED_BY_WRITE
        if not answered_by_write:
            try:
                row = await run_in_threadpool(self._lookup, who, key)
            except OperationalError as e:
                LOG.warning("%s %s: request id not looked up: %s", scope["method"], scope["path"], e)
                return await self._send(send, *_error(503, "the store could not be read: retry", "busy",
                                                      [(b"retry-after", str(Busy.RETRY_AFTER).encode())]))
            if row is not None:
                return await self._send(send, *self._recorded(row, fingerprint))

        pending = Pending(who, key, fingerprint)
        token = PENDING.set(pending)
        start: dict = {}
        chunks: list[bytes] = []

        async def capture(message):
            # the response is held until complete: it is recorded before the client can see it
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] != "http.response.body":
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            if answered_by_write and not pending.claimed:
                # the request took no key: a repeat of a write that did (it rolled back), or it failed
                try:
                    row = await run_in_threadpool(self._lookup, who, key)
                except OperationalError as e:   # nothing was written: its own answer goes out
                    LOG.warning("%s %s: request id not looked up: %s", scope["method"], scope["path"], e)
                    row = None
                if row is not None:
                    return await self._send(send, *self._recorded(row, fingerprint))
            if pending.claimed and not pending.recorded:
                kept = None if scope["path"].startswith(SECRET_PATHS) else b"".join(chunks)
                content_type = dict(start.get("headers", [])).get(b"content-type", b"").decode("latin-1")
                try:
                    await run_in_threadpool(self._record, pending, start["status"], content_type, kept)
                except OperationalError as e:   # the write is done: its answer goes out all the same
                    LOG.warning("%s %s: response not recorded: %s", scope["method"], scope["path"], e)
            await send(start)
            await send({"type": "http.response.body", "body": b"".join(chunks)})
        try:
            await self.app(scope, replaying(body, receive), capture)
        finally:
            PENDING.reset(token)

    @staticmethod
    async def _send(send, status: int, headers: list, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def _lookup(self, who: str, key: str) -> Row | None:
        query = select(_ROWS).where(_ROWS.c.scope == who, _ROWS.c.key == key)
        if self._single is not None:
            with self._single.connect() as conn:
                return conn.execute(query).first()
        with self.engine.connect().execution_options(**READ_ONLY) as conn, conn.begin():
            return conn.execute(query).first()

    @staticmethod
    def _recorded(row: Row, fingerprint: str) -> tuple[int, list, bytes]:
        if row.fingerprint != fingerprint:
            return _error(422, f"this {HEADER} was used for a different request (method, path, query, "
                               "project or body): use a new one", "invalid")
        if row.status is not None and row.body is None:
            return _error(409, f"the write with this {HEADER} was run (status {row.status}); its response held a "
                               "credential and was not kept: list the objects instead", "conflict")
        if row.status is not None:
            headers = [(REPLAYED.lower().encode(), b"true")]
            if row.content_type:
                headers.append((b"content-type", row.content_type.encode("latin-1")))
            return row.status, headers, row.body or b""
        created = row.created if row.created.tzinfo else row.created.replace(tzinfo=utcnow().tzinfo)
        if utcnow() - created < RUNNING_AT_MOST:
            return _error(503, f"a request with this {HEADER} is being run: retry", "busy",
                          [(b"retry-after", str(RequestIdRunning.RETRY_AFTER).encode())])
        return _error(409, f"the write with this {HEADER} was committed but its response was not recorded "
                           "(the controller that ran it stopped): read the object instead", "conflict")

    def _record(self, pending: Pending, status: int, content_type: str, body: bytes | None) -> None:
        # the key's row is no part of the model: these writes are not counted as changes
        # (fathom.store.changes), so an API worker's recording sends no change-feed notice that
        # would wake the controller's reconciler (fathom.cluster.feed)
        with (self._single or self.engine).connect().execution_options(model_unchanged=True) as conn:
            conn.execute(update(_ROWS).where(_ROWS.c.scope == pending.scope, _ROWS.c.key == pending.key)
                         .values(status=status, content_type=content_type[:128] or None, body=body))
            if time.monotonic() - self._swept > SWEEP_EVERY:
                self._swept = time.monotonic()
                conn.execute(delete(_ROWS).where(_ROWS.c.created < utcnow() - RETENTION))
            conn.commit()
