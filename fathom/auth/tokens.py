"""Bearer tokens issued by the controller.

A token is `fth_` + 43 URL-safe characters (32 random bytes from `secrets`). The store keeps only
its SHA-256 digest: 256 bits of entropy make a salted slow hash unnecessary, and a digest lets a
request be checked with one indexed look-up. The digest found is compared again with
`hmac.compare_digest`, so no byte-by-byte comparison of secret material depends on the input.

The admin credential: at its first start the controller creates an admin token and writes it to
`<state dir>/admin-token`, mode 0600 in a 0700 directory (`ensure_admin_token`). A later start
keeps the file as long as its token is still valid in the store, and writes a new one otherwise.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import Engine, delete, select
from sqlalchemy.orm import Session

from fathom.auth import ROLES, Identity
from fathom.store.auth_models import ApiToken
from fathom.store.errors import Invalid, NotFound

PREFIX = "fth_"
ADMIN_TOKEN_FILE = "admin-token"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_secret() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def check_roles(roles: list[str] | tuple[str, ...], node: str | None) -> frozenset[str]:
    """Validated roles of a new token: known ones, at least one; an agent token names its node
    and has no other role (it may only deliver its node's records); a replica's has no other role
    and names a node or none (ReplicaToken)."""
    out = frozenset(r.strip() for r in roles if r.strip())
    unknown = sorted(out - set(ROLES))
    if unknown:
        raise Invalid(f"unknown role(s) {', '.join(unknown)}: give {', '.join(ROLES)}", "roles")
    if not out:
        raise Invalid("give at least one role", "roles")
    if "agent" in out and (node is None or len(out) > 1):
        raise Invalid("an agent token has the role agent alone and names its node", "node")
    if "replica" in out and len(out) > 1:
        raise Invalid("a replica token has the role replica alone", "roles")
    if node is not None and not out & {"agent", "replica"}:
        raise Invalid("only an agent (or a replica's) token names a node", "node")
    return out


def issue(session: Session, *, project: str, roles, name: str = "", node: str | None = None,
          expires_at: datetime | None = None) -> tuple[ApiToken, str]:
    """A new token: (its row, the secret to hand out once)."""
    checked = check_roles(list(roles), node)
    if expires_at is not None and _utc(expires_at) <= datetime.now(timezone.utc):
        raise Invalid("the expiry is in the past", "expires_at")
    secret = new_secret()
    row = ApiToken(name=name, digest=digest(secret), project_id=project,
                   roles=",".join(sorted(checked)), node=node, expires_at=expires_at)
    session.add(row)
    session.flush()
    return row, secret


def issue_now(engine: Engine, **kw) -> str:
    """Issue a token in its own transaction and return the secret (tests, the lab, the controller)."""
    with Session(engine) as s, s.begin():
        return issue(s, **kw)[1]


class ReplicaToken:
    """A token a cluster's replica issues itself for one request to another replica, valid
    `seconds` and removed after it (role `replica`, fathom.auth.ROLES): naming `node`, it may ask
    that node's trace desk (fathom.api.agent_traces); naming none, the other replica's own flow
    records (fathom.api.flow_records, `scope=local`). The replica that took the call checked its
    caller's right before; the caller's own token is never passed on.

        with ReplicaToken(engine, 5.0, node="c1") as secret: ...     # blocking code
        async with ReplicaToken(engine, 2.0) as secret: ...          # the store's work off the loop
    """

    def __init__(self, engine: Engine, seconds: float, node: str | None = None, name: str = "replica request"):
        self.engine, self.seconds, self.node, self.name = engine, seconds, node, name
        self.id: int | None = None

    def __enter__(self) -> str:
        with Session(self.engine) as s, s.begin():
            row, secret = issue(s, project="admin", roles=("replica",), node=self.node, name=self.name,
                                expires_at=datetime.now(timezone.utc) + timedelta(seconds=self.seconds))
            self.id = row.id
        return secret

    def __exit__(self, *_exc) -> None:
        with Session(self.engine) as s, s.begin():
            s.execute(delete(ApiToken).where(ApiToken.id == self.id))

    async def __aenter__(self) -> str:
        return await asyncio.to_thread(self.__enter__)

    async def __aexit__(self, *exc) -> None:
        await asyncio.to_thread(self.__exit__, *exc)


def verify(session: Session, token: str, now: datetime | None = None) -> Identity | None:
    """The identity of a valid token; None for an unknown, expired or revoked one."""
    return verify_until(session, token, now)[0]


def verify_until(session: Session, token: str, now: datetime | None = None) -> tuple[Identity | None, datetime | None]:
    """verify(), and when the valid token expires (None: it does not)."""
    if not token.startswith(PREFIX) or len(token) > 128:
        return None, None
    want = digest(token)
    row = session.scalar(select(ApiToken).where(ApiToken.digest == want))
    if row is None or not hmac.compare_digest(row.digest, want):
        return None, None
    now = now or datetime.now(timezone.utc)
    if row.revoked_at is not None or (row.expires_at is not None and _utc(row.expires_at) <= now):
        return None, None
    return Identity(project=row.project_id, roles=frozenset(row.roles.split(",")), node=row.node,
                    token_id=row.id), _utc(row.expires_at)


def list_tokens(session: Session, *, limit: int, marker: int | None = None) -> list[ApiToken]:
    q = select(ApiToken).order_by(ApiToken.id).limit(limit)
    if marker is not None:
        q = q.where(ApiToken.id > min(marker, 2 ** 31 - 1))   # ids are 32-bit columns on PostgreSQL
    return list(session.scalars(q))


def revoke(session: Session, token_id: int) -> ApiToken:
    row = session.get(ApiToken, token_id) if 0 < token_id < 2 ** 31 else None
    if row is None:
        raise NotFound(f"token {token_id} does not exist")
    if row.revoked_at is None:
        row.revoked_at = datetime.now(timezone.utc)
    session.flush()
    return row


def write_secret(path: Path, secret: str) -> None:
    """Write a token file readable by its owner only (0600), replacing any old one atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (secret + "\n").encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def ensure_admin_token(engine: Engine, state_dir: Path) -> Path:
    """The admin credential file of this controller, created (or renewed) when its token is not
    valid in the store. Returns its path."""
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state_dir / ADMIN_TOKEN_FILE
    try:
        current = path.read_text().strip()
    except OSError:
        current = ""
    with Session(engine) as s, s.begin():
        if current and verify(s, current) is not None:
            os.chmod(path, 0o600)
            return path
        _row, secret = issue(s, project="admin", roles=["admin"], name="admin (controller start)")
    write_secret(path, secret)
    return path
