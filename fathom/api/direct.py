"""The API's most frequent call answered without FastAPI's routing and dependency solving.

`DirectRoutes` (ASGI middleware, the innermost of the API's: inside fathom.api.request_ids.RequestIds)
takes `POST /v1/ports` (a port's creation: the API's most frequent write) when it is what a client
usually sends: a bearer token verified lately (Authenticator.known), at most one X-Project of 1 to
64 characters, a JSON body (Content-Type application/json) that is a valid PortCreate. It then
calls the route's own function (fathom.api.ports.create_port) with the caller
(fathom.api.auth.caller), the body and the store, as FastAPI would, and an error it raises is
answered by the app's exception handlers, as FastAPI's would be. Anything else goes to FastAPI
as it came (its body given again): another path or method, a missing, unknown or malformed
token, a role the route refuses, a header, content type or body FastAPI would refuse (its 401,
403, 422 are FastAPI's own), so every answer is the one the route gives through FastAPI.
FastAPI's route stays the one documented (OpenAPI).
"""
from __future__ import annotations

import json

from starlette.requests import Request

from fathom.api import ports
from fathom.api.auth import MAX_PROJECT, caller
from fathom.api.limits import JSON_BODY, replaying, whole_body
from fathom.api.schemas import PortCreate

_PATH = "/v1/ports"
ROUTES = frozenset({("POST", _PATH)})       # (method, path) of the calls DirectRoutes may take
_UNREAD = object()


class DirectRoutes:
    def __init__(self, app, api):
        self.app, self.api = app, api       # the app inside (FastAPI's stack), the FastAPI app

    async def __call__(self, scope, receive, send):
        if (scope["type"] != "http" or scope["path"] != _PATH or scope["method"] != "POST"
                or scope.get("root_path")):
            return await self.app(scope, receive, send)
        body = await whole_body(receive)
        if body is None:
            return   # the client went away
        arguments = await self._create_arguments(scope, body)
        if arguments is None:
            return await self.app(scope, replaying(body, receive), send)
        try:
            response = await ports.create_port(*arguments)
        except Exception as e:
            handler = self._handler(e)
            if handler is None:
                raise
            response = await handler(Request(scope, receive), e)
        await response(scope, receive, send)

    async def _create_arguments(self, scope, body: bytes):
        """create_port's arguments (body, caller, store) as FastAPI would solve them; None where
        this request is left to FastAPI."""
        authorization = project = content_type = None
        projects = 0
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value if authorization is None else authorization
            elif name == b"x-project":
                project, projects = value, projects + 1
            elif name == b"x_project":      # a name FastAPI's header aliases may take too
                return None
            elif name == b"content-type":
                content_type = value if content_type is None else content_type
        if authorization is None or content_type != b"application/json" or projects > 1 or not body:
            return None
        # fastapi.security.HTTPBearer: the scheme, one space, the credentials stripped
        scheme, _, token = authorization.decode("latin-1").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        who = self.api.state.authenticator.known(token)
        if who is None:
            return None
        x_project = None
        if project is not None:
            x_project = project.decode("latin-1")
            if not 1 <= len(x_project) <= MAX_PROJECT:
                return None
        try:
            c = await caller(who, x_project)
            value = scope.get(JSON_BODY, _UNREAD)
            value = PortCreate.model_validate(json.loads(body) if value is _UNREAD else value, from_attributes=True)
        except Exception:     # ValidationError, json's ValueError, caller's Forbidden: FastAPI answers
            return None
        return value, c, self.api.state.store

    def _handler(self, error: Exception):
        """The app's exception handler of `error` (its class or the nearest base), as Starlette
        looks it up; None: none (a 500, as through FastAPI)."""
        handlers = self.api.exception_handlers
        for cls in type(error).__mro__:
            if cls in handlers:
                return handlers[cls]
        return None
