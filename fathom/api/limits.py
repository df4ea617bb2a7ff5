"""Bounded input: what the API reads from a client, and for how long.

- `BoundedInput` (ASGI middleware) reads a request body up to `max_body` bytes (FATHOM_API_MAX_BODY,
  default 1 MiB) and answers 413 as soon as more arrives, without buffering the rest; a body whose
  last byte has not arrived `read_timeout` s after the head (FATHOM_API_BODY_TIMEOUT, 10) gets a
  408. A JSON body is checked before any route sees it: NaN, Infinity, lone surrogates, NUL
  characters, duplicate keys in an object, a body that is not UTF-8 (RFC 8259; a UTF-16 or UTF-32
  body), malformed JSON and pathologically deep nesting are a 422. A NUL in the path or the query
  is a 422 too. A body in a `Content-Encoding` other than identity (nothing here decodes gzip) or a
  JSON `charset` other than UTF-8 is a 415.
- `short` cuts error messages and locations (fathom.api.deps renders every error with it), so
  an error never echoes a large input.
- Connections (how many, from where, the request head's deadline): fathom.api.connections.
"""
from __future__ import annotations

import asyncio
import json
import os

from fastapi.responses import JSONResponse

DEFAULT_MAX_BODY = 1 << 20
MAX_MSG = 300        # characters of an error message
MAX_LOC = 64         # characters of one element of an error location
MAX_DEPTH = 64       # nesting of a JSON body


def short(text: str, limit: int = MAX_MSG) -> str:
    text = text.encode("utf-8", "replace").decode("utf-8")     # no lone surrogate reaches a response
    return text if len(text) <= limit else text[:limit] + "…"


def error_body(msg: str, loc: list | None = None, kind: str = "invalid") -> dict:
    return {"detail": [{"loc": loc or [], "msg": short(msg), "type": kind}]}


class _Refused(Exception):
    def __init__(self, status: int, msg: str, loc: list | None = None):
        self.status, self.msg, self.loc = status, msg, loc or ["body"]


def _check_json(value, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise _Refused(422, f"the JSON body nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        if "\x00" in value:
            raise _Refused(422, "text may not contain NUL characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _Refused(422, "text may not contain lone surrogates") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_json(k, depth + 1)
            _check_json(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _check_json(v, depth + 1)


def _constant(name: str):
    raise _Refused(422, f"{name} is not a number JSON allows")


def _object(pairs: list) -> dict:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _Refused(422, f"the key {short(key, MAX_LOC)!r} is given twice in one JSON object")
    return value


def check_json_body(body: bytes):
    """The JSON value of `body`, refused (_Refused) as the module says."""
    try:
        # bytes given to json.loads would be taken as UTF-16 or UTF-32 too: JSON is UTF-8 only
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Refused(422, f"the body is not UTF-8: {e}") from None
    try:
        value = json.loads(text, parse_constant=_constant, object_pairs_hook=_object)
    except _Refused:
        raise
    except RecursionError:
        raise _Refused(422, "the JSON body nests too deeply") from None
    except ValueError as e:
        raise _Refused(422, f"the body is not valid JSON: {e}") from None
    _check_json(value)
    return value


# The scope's key of a JSON body's value as BoundedInput read it (json.loads's, once checked), for
# the app inside not to parse it again (fathom.api.direct); it is not to be changed.
JSON_BODY = "fathom.json_body"


async def whole_body(receive) -> bytes | None:
    """A request's body, read whole from `receive` (bounded where BoundedInput read it first);
    None: the client went away."""
    parts, more = [], True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return None
        parts.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(parts)


def replaying(body: bytes, receive):
    """An ASGI `receive` for the app inside that gives `body` whole, then what `receive` gives
    (a disconnect)."""
    delivered = False

    async def replay():
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replay


class BoundedInput:
    def __init__(self, app, max_body: int | None = None, read_timeout: float | None = None):
        self.app = app
        self.max_body = max_body if max_body is not None else int(os.environ.get("FATHOM_API_MAX_BODY", DEFAULT_MAX_BODY))
        self.read_timeout = (read_timeout if read_timeout is not None
                             else float(os.environ.get("FATHOM_API_BODY_TIMEOUT", 10.0)))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            self._check_target(scope)
            self._check_encoding(scope)
            body = await self._read(scope, receive)
        except _Refused as e:
            response = JSONResponse(status_code=e.status, content=error_body(e.msg, e.loc),
                                    headers={"Connection": "close"} if e.status in (408, 413, 415) else None)
            return await response(scope, receive, send)
        if body is None:          # the client went away
            return
        await self.app(scope, replaying(body, receive), send)

    @staticmethod
    def _check_target(scope) -> None:
        raw = scope.get("raw_path") or b""
        if "\x00" in scope.get("path", "") or b"%00" in raw:
            raise _Refused(422, "the path may not contain NUL characters", ["path"])
        if b"%00" in scope.get("query_string", b"") or b"\x00" in scope.get("query_string", b""):
            raise _Refused(422, "the query may not contain NUL characters", ["query"])

    @staticmethod
    def _check_encoding(scope) -> None:
        """A body comes as it is (no Content-Encoding but identity), JSON in UTF-8."""
        for name, value in scope.get("headers", []):
            name = name.lower()
            if name == b"content-encoding" and any(v.strip() not in (b"", b"identity")
                                                    for v in value.lower().split(b",")):
                raise _Refused(415, "a body is read as it is sent: Content-Encoding must be identity (or absent)",
                               ["header", "content-encoding"])
            if name == b"content-type":
                ctype, _, params = value.lower().partition(b";")
                ctype = ctype.strip()
                charset = [p.split(b"=", 1)[1].strip(b' "') for p in params.split(b";")
                           if p.strip().startswith(b"charset=")]
                if (ctype == b"application/json" or ctype.endswith(b"+json")) and \
                        any(c not in (b"utf-8", b"utf8") for c in charset):
                    raise _Refused(415, "a JSON body is UTF-8 (charset=utf-8 or none)", ["header", "content-type"])

    async def _read(self, scope, receive) -> bytes | None:
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit():
                raise _Refused(422, "Content-Length is not a number", ["header", "content-length"])
            if int(length) > self.max_body:
                raise _Refused(413, f"the body is larger than {self.max_body} bytes")
        chunks, size = [], 0
        try:
            # for the whole body (a deadline, not wait_for: no task and no handle of its own per message)
            async with asyncio.timeout_at(asyncio.get_running_loop().time() + self.read_timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_body:
                        raise _Refused(413, f"the body is larger than {self.max_body} bytes")
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise _Refused(408, f"the body did not arrive within {self.read_timeout:g} s") from None
        body = b"".join(chunks)
        ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if body and (ctype == b"application/json" or ctype.endswith(b"+json") or not ctype):
            scope[JSON_BODY] = check_json_body(body)
        return body
