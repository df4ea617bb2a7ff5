"""/v1/tokens: the controller's API tokens (admin only). A token's secret is in the answer to its
creation and nowhere else: the store keeps a SHA-256 digest (fathom/auth/tokens.py)."""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from fathom.api.deps import ERRORS, AdminDep, Limit, Marker, StoreDep, utc
from fathom.auth import ROLES
from fathom.auth import tokens as tk
from fathom.store.ops import MAX_LIMIT

router = APIRouter(prefix="/tokens", tags=["tokens"], responses=ERRORS)


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(default="", max_length=255)
    project_id: str = Field(min_length=1, max_length=64)
    # a replica's role is issued by a replica for itself, never through the API
    roles: list[Literal["admin", "member", "service", "agent"]] = Field(min_length=1, max_length=len(ROLES) - 1)
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


def token_out(row, cls=TokenOut, **extra) -> TokenOut:
    return cls(id=row.id, name=row.name, project_id=row.project_id, roles=row.roles.split(","), node=row.node,
               created_at=utc(row.created_at), expires_at=row.expires_at and utc(row.expires_at),
               revoked_at=row.revoked_at and utc(row.revoked_at), **extra)


@router.post("", response_model=TokenCreated, status_code=201)
def create_token(body: TokenCreate, c: AdminDep, db: StoreDep):
    def run(s):
        row, secret = tk.issue(s, project=body.project_id, roles=body.roles, name=body.name, node=body.node,
                               expires_at=body.expires_at)
        return token_out(row, TokenCreated, token=secret)
    return db.write(run, notify=False)


@router.get("", response_model=list[TokenOut])
def list_tokens(c: AdminDep, db: StoreDep, limit: Limit = MAX_LIMIT, marker: Marker = None):
    return db.read(lambda s: [token_out(t) for t in tk.list_tokens(s, limit=limit, marker=marker)])


@router.delete("/{token_id}", status_code=204)
def revoke_token(token_id: int, c: AdminDep, db: StoreDep, request: Request):
    db.write(lambda s: tk.revoke(s, token_id), notify=False)
    request.app.state.authenticator.forget()
    return Response(status_code=204)
