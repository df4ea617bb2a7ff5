"""Authentication and authorisation of every API call.

Every request carries `Authorization: Bearer <token>`: a token the controller issued
(fathom.auth.tokens) or, when configured, a Keystone token (fathom.auth.keystone). A missing,
unknown, expired or revoked token is a 401. Nothing else identifies a caller: no header alone
grants anything.

What a verified token's roles allow (docs/security.md):
    admin    everything, every project; the only role for nodes, the fabric, tokens and runtime
             endpoints (node flows, /v1/sync, /v1/health, switch status and flows, /metrics)
    member   the objects of its own project
    service  acts for the project named in `X-Project` (its own when absent), and may set a
             port's binding (node, interface_name) as Neutron's binding:host_id
    agent    delivers the PPTMon records of its own node, and nothing else

Routes take the caller with `Depends(caller)` (admin, member or service), `Depends(admin_caller)`,
or `Depends(agent_identity)` (PPTMon ingestion).
"""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from fathom.auth import ROLES, Identity
from fathom.auth import tokens as tk
from fathom.auth.keystone import KeystoneValidator
from fathom.store.db import READ_ONLY
from fathom.store.errors import Forbidden, StoreError
from fathom.store.ops import MAX_ID, MAX_LIMIT, Caller, require_admin

bearer = HTTPBearer(auto_error=False, description="a token from `fathom token create` (or Keystone)")


class Unauthenticated(StoreError):
    status = 401
    kind = "unauthenticated"


class Authenticator:
    """Turns a bearer token into an Identity: the store's tokens first, then Keystone if set."""

    def __init__(self, engine: Engine, keystone: KeystoneValidator | None = None):
        self.engine = engine
        self.keystone = keystone

    def identify(self, token: str) -> Identity | None:
        with Session(self.engine) as s, s.begin():
            s.connection(execution_options=READ_ONLY)
            identity = tk.verify(s, token)
        if identity is None and self.keystone is not None and not token.startswith(tk.PREFIX):
            identity = self.keystone.validate(token)
        return identity


def identity(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Identity:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthenticated("give a token: Authorization: Bearer <token> (see `fathom token`)")
    found = request.app.state.authenticator.identify(credentials.credentials)
    if found is None:
        raise Unauthenticated("the token is unknown, expired or revoked")
    return found


def caller(who: Identity = Depends(identity),
           x_project: str | None = Header(None, min_length=1, max_length=64,
                                          description="service role only: the project to act for")) -> Caller:
    """The caller of a resource route (admin, member or service)."""
    if "admin" in who.roles:
        return Caller(project=who.project, admin=True)
    if "service" in who.roles:
        return Caller(project=x_project or who.project, admin=False, service=True)
    if "member" in who.roles:
        return Caller(project=who.project, admin=False)
    raise Forbidden("this token's role may not use this endpoint")


def admin_caller(c: Caller = Depends(caller)) -> Caller:
    require_admin(c, "use this endpoint")
    return c


def agent_identity(who: Identity = Depends(identity)) -> Identity:
    """An agent token (PPTMon ingestion): the node it speaks for is `who.node`."""
    if "agent" not in who.roles or not who.node:
        raise Forbidden("only a node's agent token may deliver its records")
    return who


# ---------------------------------------------------------------------------------------------- /v1/tokens


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(default="", max_length=255)
    project_id: str = Field(min_length=1, max_length=64)
    roles: list[Literal["admin", "member", "service", "agent"]] = Field(min_length=1, max_length=len(ROLES))
    node: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$",
                             description="agent tokens: the node whose records it delivers")
    expires_at: datetime | None = Field(default=None, description="absent: never expires")


class TokenOut(BaseModel):
    id: int
    name: str
    project_id: str
    roles: list[str]
    node: str | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenCreated(TokenOut):
    token: str = Field(description="the secret: shown once, stored only as a SHA-256 digest")


def _utc(value):
    return tk._utc(value)


def token_out(row, cls=TokenOut, **extra) -> TokenOut:
    return cls(id=row.id, name=row.name, project_id=row.project_id, roles=row.roles.split(","), node=row.node,
               created_at=_utc(row.created_at), expires_at=_utc(row.expires_at),
               revoked_at=_utc(row.revoked_at), **extra)


def tokens_router(store) -> APIRouter:
    """Admin-only management of API tokens. `store` is the API's transaction helper."""
    from fathom.api.app import ERRORS
    r = APIRouter(tags=["tokens"], responses=ERRORS)

    @r.post("/tokens", response_model=TokenCreated, status_code=201)
    def create_token(body: TokenCreate, c: Caller = Depends(admin_caller)):
        def run(s):
            row, secret = tk.issue(s, project=body.project_id, roles=body.roles, name=body.name, node=body.node,
                                   expires_at=body.expires_at)
            return token_out(row, TokenCreated, token=secret)
        return store.write(run, notify=False)

    @r.get("/tokens", response_model=list[TokenOut])
    def list_tokens(c: Caller = Depends(admin_caller), limit: int = Query(MAX_LIMIT, ge=1, le=MAX_LIMIT),
                    marker: int | None = Query(None, ge=0, le=MAX_ID)):
        return store.read(lambda s: [token_out(t) for t in tk.list_tokens(s, limit=limit, marker=marker)])

    @r.delete("/tokens/{token_id}", status_code=204)
    def revoke_token(token_id: int, c: Caller = Depends(admin_caller)):
        store.write(lambda s: tk.revoke(s, token_id), notify=False)
        return Response(status_code=204)

    return r
