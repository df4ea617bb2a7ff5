"""What every route of the API shares: the caller's identity, the store's transactions, the
error shape.

Routes get them as FastAPI dependencies (`Depends(caller)`, `Depends(store)`, `Depends(engine)`);
`create_app` puts the one `Store` of the process on `app.state.store`.

Identity is deliberately simple: header `X-Project` (default "admin") and `X-Roles` (comma
separated, default "admin"). Admins see and manage everything; others see their project only.

Every error, whatever raised it (a store operation, request validation, an unknown path or
method), has one shape: `{"detail": [{"loc": [...], "msg": "...", "type": "..."}]}`.
"""
from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Annotated, Any, Callable

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException as StarletteHTTPException

from fathom.api.schemas import ErrorOut
from fathom.store.db import READ_ONLY
from fathom.store.errors import Conflict, StoreError
from fathom.store.ops import Caller, Settings

log = logging.getLogger(__name__)

# The documented error responses of every route (OpenAPI).
ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorOut} for code in (403, 404, 409, 422)}


def caller(x_project: str = Header("admin", max_length=64),
           x_roles: str = Header("admin")) -> Caller:
    roles = {r.strip() for r in x_roles.split(",")}
    return Caller(project=x_project, admin="admin" in roles)


class Store:
    """The store's transactions for requests: `read(fn)` and `write(fn)` run `fn(session)` in one
    transaction each; after a committed write `on_change()` is called (the controller wakes its
    reconciler with it)."""

    def __init__(self, engine: Engine, settings: Settings, on_change: Callable[[], None] | None):
        self.engine = engine
        self.settings = settings
        self.on_change = on_change

    def read(self, fn):
        with Session(self.engine) as session, session.begin():
            session.connection(execution_options=READ_ONLY)
            return fn(session)

    def write(self, fn, attempts: int = 3):
        """Run `fn(session)` in one transaction; its result must be fully serialised inside.

        A unique constraint that fires means a concurrent writer got in between our checks and
        the commit (PostgreSQL; SQLite serialises writers). The request is run again: then either
        it succeeds (e.g. the next free address) or our checks see the other write and name the
        field in a proper 409.
        """
        for attempt in range(attempts):
            try:
                with Session(self.engine) as session, session.begin():
                    result = fn(session)
                break
            except IntegrityError as e:
                if attempt == attempts - 1:
                    raise _conflict_from(e) from None
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:  # the write is committed; a failing hook must not turn it into a 500
                log.exception("on_change hook failed")
        return result


def store(request: Request) -> Store:
    return request.app.state.store


def engine(request: Request) -> Engine:
    return request.app.state.store.engine


# Route parameters: `def handler(..., c: CallerDep, db: StoreDep)`.
CallerDep = Annotated[Caller, Depends(caller)]
StoreDep = Annotated[Store, Depends(store)]
EngineDep = Annotated[Engine, Depends(engine)]


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
    return {"detail": [{"loc": list(loc), "msg": msg, "type": kind}]}


def store_error_response(exc: StoreError) -> JSONResponse:
    loc: list[str | int] = []
    if exc.field:
        loc = ["body", *(int(p) if p.isdigit() else p for p in exc.field.split("."))]
    return JSONResponse(status_code=exc.status, content=error_body(loc, exc.message, exc.kind))


_HTTP_KINDS = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 409: "conflict", 422: "invalid"}


def http_error_response(exc: StarletteHTTPException) -> JSONResponse:
    """An HTTPException (raised by a route or by routing itself: unknown path, wrong method).
    A route may give `detail` as the list of items already; a string becomes one item."""
    if isinstance(exc.detail, list):
        items = [{"loc": list(d.get("loc", [])), "msg": str(d.get("msg", "")),
                  "type": str(d.get("type", _HTTP_KINDS.get(exc.status_code, "error")))} for d in exc.detail]
    else:
        items = error_body([], str(exc.detail), _HTTP_KINDS.get(exc.status_code, "error"))["detail"]
    return JSONResponse(status_code=exc.status_code, content={"detail": items},
                        headers=getattr(exc, "headers", None))


def validation_error_response(exc: RequestValidationError) -> JSONResponse:
    """pydantic's errors, reduced to loc/msg/type (no echo of the input)."""
    items = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", "invalid"))}
             for e in exc.errors()]
    return JSONResponse(status_code=422, content={"detail": items})


def install_error_handlers(app: FastAPI) -> None:
    async def on_store_error(_request: Request, exc: StoreError):
        return store_error_response(exc)

    async def on_http_error(_request: Request, exc: StarletteHTTPException):
        return http_error_response(exc)

    async def on_validation_error(_request: Request, exc: RequestValidationError):
        return validation_error_response(exc)

    app.add_exception_handler(StoreError, on_store_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
