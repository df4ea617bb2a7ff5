"""Errors of store operations. Each names the request field at fault, so the API can answer with a
field-level error (`detail[].loc`) and the CLI can print it on one line."""
from __future__ import annotations


class StoreError(Exception):
    status = 400
    kind = "error"

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class Invalid(StoreError):
    """Well-formed but unacceptable input (an IP outside its subnet, a VLAN id > 4094, ...)."""
    status = 422
    kind = "invalid"


class NotFound(StoreError):
    status = 404
    kind = "not_found"


class Conflict(StoreError):
    """The request contradicts what the store holds (duplicate address, object still in use, ...)."""
    status = 409
    kind = "conflict"


class Forbidden(StoreError):
    status = 403
    kind = "forbidden"


class Busy(StoreError):
    """The store could not take the request now (a writer waited out the write lock): nothing was
    applied; the client may make it again after RETRY_AFTER seconds."""
    status = 503
    kind = "busy"
    RETRY_AFTER = 1


class Unavailable(StoreError):
    """The database failed the request (unreachable, connection dropped): whether a write was
    applied before it failed cannot be told, so the client reads before it retries."""
    status = 503
    kind = "unavailable"
