"""What every route of the API shares: the caller's identity, the store's transactions, the
error shape.

Routes get them as FastAPI dependencies (`Depends(caller)`, `Depends(store)`, `Depends(engine)`);
`create_app` puts the one `Store` of the process on `app.state.store`.

Identity: a bearer token on every call (fathom/api/auth.py says who may do what). Admins see
and manage everything; others see their project only. Lists are paginated (`Limit`, `Marker`).

Every error, whatever raised it (a store operation, request validation, an unknown path or
method), has one shape: `{"detail": [{"loc": [...], "msg": "...", "type": "..."}]}`.
"""
from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Annotated, Any, Callable, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError, InternalError, OperationalError
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import ObjectDeletedError, StaleDataError
from starlette.exceptions import HTTPException as StarletteHTTPException

from fathom.api import request_ids
from fathom.api.auth import admin_caller, caller
from fathom.api.commits import after_commit
from fathom.api.limits import MAX_LOC, short
from fathom.api.schemas import ErrorOut
from fathom.store.db import AT_ONCE, READ_ONLY, AtOnceSession, NeedsTransaction
from fathom.store.errors import Busy, Conflict, Forbidden, NotFound, StoreError, Unavailable
from fathom.store.ops import MAX_LIMIT, Caller, Settings

log = logging.getLogger(__name__)

# The documented error responses of every route (OpenAPI): a reference to ErrorOut's schema. With
# {"model": ErrorOut} FastAPI would build a pydantic adapter per route and status (some 900, a large
# part of every controller's start) that only the OpenAPI document reads. ErrorOut is in the
# document's components through the routes whose 429 names it as their model (tests/unit/test_api.py
# checks that every reference resolves).
ERROR_REF = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}
ERRORS: dict[int | str, dict[str, Any]] = {code: {"content": ERROR_REF} for code in (401, 403, 404, 409, 413, 415, 422, 503)}

# Pagination of every list: `limit` (at most MAX_LIMIT, also the default) and `marker`.
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="at most this many (pagination)")]
Marker = Annotated[int | None, Query(ge=0, description="the last id of the previous page")]


# Long-poll of one object: `GET /v1/<collection>/<id>?wait=<status>&timeout=<s>` answers once the
# object's status is `wait` (or `error`) as decided by a pass that saw every write committed before
# the request (and the write its `X-Fathom-Commit` names: fathom.api.commits), or after `timeout`
# seconds with the object as it is (fathom.controller.board).
MAX_WAIT = 60.0
Wait = Annotated[Literal["pending", "active", "error", "down"] | None,
                 Query(description="answer once the object's status is this (or error), at most `timeout` s")]
WaitTimeout = Annotated[float, Query(gt=0, le=MAX_WAIT, description="seconds a `wait` may take")]


async def shown(request: Request, read: Callable[[], Any], kinds: tuple[str, ...], object_id: int,
                wait: str | None, timeout: float, check: Callable[[], Any] | None = None):
    """The answer of a GET of one object (`read()`, run in the thread pool: it checks the caller may
    see it), after waiting for `wait` on the controller's status board when asked. Without a
    controller in this process (no board) it answers at once. Waiting holds no thread and reads
    nothing: the object is read once the wait ends; before it, `check()` (where it is cheaper than
    `read`: only whether the caller may see the object) or `read()` tells a missing one at once.
    A status already on the board is answered with `read()` alone."""
    board = getattr(request.app.state, "status_board", None)
    keys = tuple((k, object_id) for k in kinds)
    after = after_commit(request) if wait is not None else None
    if wait is None or board is None or board.answer(keys, wait, board.requested, after) is not None:
        return await run_in_threadpool(read)   # nothing to wait for: `read` alone tells a missing one
    await run_in_threadpool(check or read)
    await board.wait(keys, wait, timeout, after)
    return await run_in_threadpool(read)


def gateway_node_admin(c: Caller, gateway_node: str | None) -> None:
    """Which node routes is the operator's choice (and naming one would tell which nodes exist)."""
    if gateway_node is not None and not c.admin:
        raise Forbidden("only an admin can choose a router's gateway_node", "gateway_node")


class Store:
    """The store's transactions for requests: `read(fn)` and `write(fn)` run `fn(session)` in one
    transaction each; after a committed write `on_change()` is called (the controller wakes its
    reconciler with it)."""

    def __init__(self, engine: Engine, settings: Settings, on_change: Callable[[], None] | None):
        self.engine = engine
        self.settings = settings
        self.on_change = on_change
        self._at_once = engine.execution_options(**AT_ONCE) if engine.dialect.name == "postgresql" else None

    def read(self, fn):
        with Session(self.engine) as session, session.begin():
            session.connection(execution_options=READ_ONLY)
            return fn(session)

    def write(self, fn, attempts: int = 3, notify: bool = True, answer: Callable[[Any], Response] | None = None,
              at_once: bool = False):
        """Run `fn(session)` in one transaction; its result must be fully serialised inside.
        `answer(result)`: the route's response, made inside the transaction and recorded there with
        the request's Idempotency-Key (request_ids.ANSWERED_BY_WRITE); returned instead of the result.
        A result that is a request_ids.Recorded is that response already, recorded by `fn`.

        `at_once`: `fn` writes with one statement (the request's key and answer in it: a Recorded
        result, where the request has a key), or raises db.NeedsTransaction before it writes. On
        PostgreSQL it then runs without a transaction, given a db.AtOnceSession (its connection, no ORM;
        db.AT_ONCE: no BEGIN and COMMIT round trips;
        its reads see what committed before each, as in a read-committed transaction; the change
        feed's notice, where there is one, written by that statement: changes.notice_in_statement);
        NeedsTransaction runs it again in one.

        A concurrent writer may get in between our reads and our writes (PostgreSQL, read
        committed; SQLite serialises writers):
        - a unique constraint fires: the request is run again, and then either it succeeds (e.g.
          the next free address) or our checks see the other write and name the field in a 409;
        - an UPDATE matches no row (StaleDataError) or a row read is gone (ObjectDeletedError):
          the object was deleted meanwhile; run again, the request finds it gone (404).
        An address taken meanwhile is run again up to ADDRESS_RACE_ATTEMPTS times (`attempts` for
        anything else): under many writers on one network a write can lose that race several times
        in a row, and an address the request did not name is never the client's conflict.
        """
        engine = self._at_once if at_once and self._at_once is not None else self.engine
        attempt, limit = 0, attempts
        while attempt < limit:
            attempt += 1
            try:
                if engine is self._at_once:
                    with engine.connect() as connection:
                        result = _written(fn, AtOnceSession(connection), answer)
                else:
                    with Session(engine) as session, session.begin():
                        result = _written(fn, session, answer)
                request_ids.claimed(answered=answer is not None)
                break
            except NeedsTransaction:
                engine, attempt = self.engine, attempt - 1
            except IntegrityError as e:
                if request_ids.is_key_conflict(e):
                    raise request_ids.RequestIdRunning(f"a request with this {request_ids.HEADER} is being run: "
                                                       "retry") from None
                if _address_race(e):
                    limit = max(attempts, ADDRESS_RACE_ATTEMPTS)
                if attempt >= limit:
                    raise _conflict_from(e) from None
            except (StaleDataError, ObjectDeletedError):
                if attempt >= limit:
                    raise NotFound("the object was deleted by another request meanwhile") from None
        if self.on_change is not None and notify:
            try:
                self.on_change()
            except Exception:  # the write is committed; a failing hook must not turn it into a 500
                log.exception("on_change hook failed")
        return result


def _written(fn, session, answer: Callable[[Any], Response] | None):
    """Store.write's `fn(session)`, its answer made, and the request's key taken, in its transaction."""
    result = fn(session)
    if not isinstance(result, request_ids.Recorded):   # else its key is taken already
        if answer is not None:
            result = answer(result)
        # the request's Idempotency-Key, taken with the write, last: its row's time is the commit's
        # (request_ids.RUNNING_AT_MOST)
        request_ids.claim(session, None if answer is None else (
            result.status_code, result.media_type, bytes(result.body)))
    return result


def answer_with(model, status: int) -> Callable[[Any], Response]:
    """An `answer` for Store.write: the result as the route's `response_model` and `status_code`
    would render it (JSON of the model, application/json)."""

    def render(result) -> Response:
        return Response(model.model_validate(result).model_dump_json().encode(), status_code=status,
                        media_type="application/json")
    return render


async def store(request: Request) -> Store:   # a coroutine: no thread-pool hop (fathom.api.auth)
    return request.app.state.store


async def engine(request: Request) -> Engine:
    return request.app.state.store.engine


# Route parameters: `def handler(..., c: CallerDep, db: StoreDep)`.
CallerDep = Annotated[Caller, Depends(caller)]
AdminDep = Annotated[Caller, Depends(admin_caller)]
StoreDep = Annotated[Store, Depends(store)]
EngineDep = Annotated[Engine, Depends(engine)]


# Runs of a write that lost the race for a free address to another writer: the address each chose
# was free in what its statement saw, and the other's commit came before its own claim (PostgreSQL,
# read committed). Run again, it sees that commit and chooses another. Neutron retries its database
# writes up to 10 times for the same kind of race.
ADDRESS_RACE_ATTEMPTS = 10


def _address_race(e: IntegrityError) -> bool:
    """Whether `e` is an address's uniqueness in its network (ip_allocations)."""
    text = str(e.orig)
    return "ip_allocations" in text and "ip_address" in text


def _conflict_from(e: IntegrityError) -> Conflict:
    text = str(e.orig)
    for hint, field in (("mac_address", "mac_address"), ("ip_address", "fixed_ips"),
                        ("segmentation_id", "segmentation_id"), ("interface_name", "interface_name"),
                        ("nodes.name", "name"), ("uq_nodes_name", "name")):
        if hint in text:
            return Conflict(f"{field} is in use (changed concurrently): retry", field)
    return Conflict("the request conflicts with the store (an object is in use)")


def utc(value: datetime) -> datetime:
    """SQLite hands back naive datetimes; every time we store is UTC."""
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


# ---------------------------------------------------------------------------------------------- errors


def error_body(loc: list, msg: str, kind: str) -> dict:
    """Messages and locations are cut short: an error never echoes a large input back."""
    loc = [p if isinstance(p, int) else short(str(p), MAX_LOC) for p in loc]
    return {"detail": [{"loc": loc, "msg": short(msg), "type": kind}]}


def store_error_response(exc: StoreError) -> JSONResponse:
    loc: list[str | int] = []
    if exc.field:
        loc = ["body", *(int(p) if p.isdigit() else p for p in exc.field.split("."))]
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    if isinstance(exc, Busy):
        headers = {"Retry-After": str(Busy.RETRY_AFTER)}
    return JSONResponse(status_code=exc.status, content=error_body(loc, exc.message, exc.kind), headers=headers)


_HTTP_KINDS = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 409: "conflict", 422: "invalid"}


def http_error_response(exc: StarletteHTTPException) -> JSONResponse:
    """An HTTPException (raised by a route or by routing itself: unknown path, wrong method).
    A route may give `detail` as the list of items already; a string becomes one item."""
    if isinstance(exc.detail, list):
        items = [error_body(d.get("loc", []), str(d.get("msg", "")),
                            str(d.get("type", _HTTP_KINDS.get(exc.status_code, "error"))))["detail"][0]
                 for d in exc.detail]
    else:
        items = error_body([], str(exc.detail), _HTTP_KINDS.get(exc.status_code, "error"))["detail"]
    return JSONResponse(status_code=exc.status_code, content={"detail": items},
                        headers=getattr(exc, "headers", None))


def validation_error_response(exc: RequestValidationError) -> JSONResponse:
    """pydantic's errors, reduced to loc/msg/type (no echo of the input)."""
    items = [error_body(e.get("loc", ()), str(e.get("msg", "")), short(str(e.get("type", "invalid")), MAX_LOC))["detail"][0]
             for e in exc.errors()[:20]]
    return JSONResponse(status_code=422, content={"detail": items})


IDLE_IN_TRANSACTION_TIMEOUT = "25P03"     # PostgreSQL's SQLSTATE


def install_error_handlers(app: FastAPI) -> None:
    async def on_store_error(_request: Request, exc: StoreError):
        return store_error_response(exc)

    async def on_http_error(_request: Request, exc: StarletteHTTPException):
        return http_error_response(exc)

    async def on_validation_error(_request: Request, exc: RequestValidationError):
        return validation_error_response(exc)

    async def on_store_unavailable(request: Request, exc: OperationalError):
        log.warning("%s %s: store unavailable: %s", request.method, request.url.path, str(exc.orig)[:200])
        if "database is locked" in str(exc.orig):
            # SQLite: a writer waited out busy_timeout for the write lock, before writing anything
            return store_error_response(Busy("the store is busy; nothing was changed: retry"))
        return store_error_response(Unavailable("the store failed the request (database unreachable?); "
                                                "read the objects before retrying a write"))

    async def on_session_ended(request: Request, exc: InternalError):
        # PostgreSQL ended a session left idle in a transaction (a stalled process: 25P03); the
        # transaction was rolled back
        if getattr(exc.orig, "sqlstate", None) != IDLE_IN_TRANSACTION_TIMEOUT:
            raise exc
        log.warning("%s %s: %s", request.method, request.url.path, str(exc.orig)[:200])
        return store_error_response(Busy("the store ended this request's transaction; nothing was changed: retry"))

    app.add_exception_handler(StoreError, on_store_error)
    app.add_exception_handler(InternalError, on_session_ended)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(OperationalError, on_store_unavailable)
