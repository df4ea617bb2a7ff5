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
    agent    for its own node only: reads its host-local desired state, reports its facts and
             statuses (fathom.api.agents), delivers its PPTMon records; nothing else
    replica  a cluster's replica asking another for its own caller (fathom.auth.tokens.ReplicaToken):
             naming a node, that node's trace desk; naming none, the replica's own flow records

Routes take the caller with `Depends(caller)` (admin, member or service), `Depends(admin_caller)`,
`Depends(caller_or_replica)` (flow records) or `Depends(agent_identity)` (PPTMon ingestion).
"""
from __future__ import annotations

import threading
import time

from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from fathom.auth import Identity
from fathom.auth import tokens as tk
from fathom.auth.keystone import KeystoneValidator
from fathom.store.db import READ_ONLY
from fathom.store.errors import Forbidden, StoreError
from fathom.store.ops import Caller, require_admin

bearer = HTTPBearer(auto_error=False, description="a token from `fathom token create` (or Keystone)")


class Unauthenticated(StoreError):
    status = 401
    kind = "unauthenticated"


class Authenticator:
    """Turns a bearer token into an Identity: the store's tokens first, then Keystone if set.

    A valid token of the store is remembered for CACHE_SECONDS (never past its expiry), so a
    client's calls do not each read the store: a token revoked through this process's API is
    refused at once (`forget`), one revoked in the store by another process within CACHE_SECONDS.
    Unknown, revoked and expired tokens are not remembered."""
    CACHE_SECONDS = 5.0
    CACHE_SIZE = 4096

    def __init__(self, engine: Engine, keystone: KeystoneValidator | None = None):
        self.engine = engine
        self.keystone = keystone
        self._known: dict[str, tuple[Identity, float]] = {}   # token digest -> (identity, valid until)
        self._lock = threading.Lock()

    def known(self, token: str) -> Identity | None:
        """The identity of a token verified within CACHE_SECONDS (no store access), else None."""
        if not token.startswith(tk.PREFIX) or len(token) > 128:
            return None
        hit = self._known.get(tk.digest(token))
        return hit[0] if hit is not None and time.time() < hit[1] else None

    def identify(self, token: str) -> Identity | None:
        key = tk.digest(token) if token.startswith(tk.PREFIX) and len(token) <= 128 else None
        if key is not None:
            hit = self._known.get(key)
            if hit is not None and time.time() < hit[1]:
                return hit[0]
        with Session(self.engine) as s, s.begin():
            s.connection(execution_options=READ_ONLY)
            identity, expires = tk.verify_until(s, token)
        if identity is not None and key is not None:
            until = time.time() + self.CACHE_SECONDS
            if expires is not None:
                until = min(until, expires.timestamp())
            with self._lock:
                if len(self._known) >= self.CACHE_SIZE:
                    self._known.clear()
                self._known[key] = (identity, until)
        if identity is None and self.keystone is not None and not token.startswith(tk.PREFIX):
            identity = self.keystone.validate(token)
        return identity

    def forget(self) -> None:
        """A token was revoked: verify every token again."""
        with self._lock:
            self._known.clear()


# the longest X-Project (a project id) a service's call may name
MAX_PROJECT = 64


# The dependencies are coroutines: FastAPI runs a plain function dependency in its thread pool, a
# hop per dependency per call; only a token not verified lately goes there (to read the store).
async def identity(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Identity:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthenticated("give a token: Authorization: Bearer <token> (see `fathom token`)")
    auth: Authenticator = request.app.state.authenticator
    found = auth.known(credentials.credentials) or await run_in_threadpool(auth.identify, credentials.credentials)
    if found is None:
        raise Unauthenticated("the token is unknown, expired or revoked")
    return found


async def caller(who: Identity = Depends(identity),
           x_project: str | None = Header(None, min_length=1, max_length=MAX_PROJECT,
                                          description="service role only: the project to act for")) -> Caller:
    """The caller of a resource route (admin, member or service)."""
    if "admin" in who.roles:
        return Caller(project=who.project, admin=True)
    if "service" in who.roles:
        return Caller(project=x_project or who.project, admin=False, service=True)
    if "member" in who.roles:
        return Caller(project=who.project, admin=False)
    raise Forbidden("this token's role may not use this endpoint")


async def caller_or_replica(who: Identity = Depends(identity),
                            x_project: str | None = Header(None, min_length=1, max_length=MAX_PROJECT,
                                                           description="service role only: the project to act for")
                            ) -> Caller | None:
    """The caller of a route another replica also calls for its own caller: None for that
    replica's token naming no node (the route decides what it may ask), else as `caller`."""
    if "replica" in who.roles:
        if who.node is not None:
            raise Forbidden("this replica token is for a node's trace desk only")
        return None
    return await caller(who, x_project)


async def admin_caller(c: Caller = Depends(caller)) -> Caller:
    require_admin(c, "use this endpoint")
    return c


async def agent_identity(who: Identity = Depends(identity)) -> Identity:
    """An agent token (PPTMon ingestion): the node it speaks for is `who.node`."""
    if "agent" not in who.roles or not who.node:
        raise Forbidden("only a node's agent token may deliver its records")
    return who
