"""Keystone token validation (optional): what an OpenStack client's token means to fathom.

When configured, a bearer token the controller did not issue is validated against Keystone's
identity API v3, as keystonemiddleware's auth_token does: `GET /v3/auth/tokens` with the
service's own token in `X-Auth-Token` and the caller's in `X-Subject-Token`. A 200 gives the
token's project id and role names; anything else means "not a valid token". Answers are cached
for `cache_seconds` (never past the token's own expiry), bounded to `cache_size` entries.

`login` asks Keystone for a project-scoped token with a user's name and password (`POST
/v3/auth/tokens`, password method: the console's Keystone login); the answer says the token's
project and roles, so the token is known (cached) without a second call.

Configuration (environment of the controller):
    FATHOM_KEYSTONE_URL            e.g. http://keystone:5000 (unset: Keystone is not consulted)
    FATHOM_KEYSTONE_TOKEN_FILE     a file holding the service token fathom validates with
    FATHOM_KEYSTONE_CACHE_SECONDS  how long a validation is trusted (default 60): a token revoked in
                                   Keystone is refused at most this long after
Role mapping: Keystone `admin` -> admin, `service` -> service, any other role -> member.
"""
from __future__ import annotations

import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from fathom.auth import Identity

ROLE_MAP = {"admin": "admin", "service": "service"}


class KeystoneValidator:
    def __init__(self, url: str, service_token: str, *, timeout: float = 5.0, cache_seconds: float = 60.0,
                 cache_size: int = 10_000, client=None):
        """`client`: an httpx.Client (default: a new one; httpx is loaded only with Keystone)."""
        import httpx
        self.url = url.rstrip("/")
        self.service_token = service_token
        self.http = client or httpx.Client(timeout=timeout)
        self.cache_seconds, self.cache_size = cache_seconds, cache_size
        self._cache: dict[str, tuple[float, Identity | None]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, env=os.environ) -> "KeystoneValidator | None":
        url = env.get("FATHOM_KEYSTONE_URL")
        if not url:
            return None
        token_file = env.get("FATHOM_KEYSTONE_TOKEN_FILE")
        if not token_file:
            raise ValueError("FATHOM_KEYSTONE_URL needs FATHOM_KEYSTONE_TOKEN_FILE (the service token)")
        return cls(url, Path(token_file).read_text().strip(),
                   cache_seconds=float(env.get("FATHOM_KEYSTONE_CACHE_SECONDS", "60")))

    def validate(self, token: str) -> Identity | None:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(token)
            if hit is not None and hit[0] > now:
                return hit[1]
        identity, valid_for = self._ask(token)
        self._remember(token, identity, now + min(self.cache_seconds, valid_for))
        return identity

    def _remember(self, token: str, identity: Identity | None, until: float) -> None:
        with self._lock:
            if len(self._cache) >= self.cache_size:
                self._cache.clear()
            self._cache[token] = (until, identity)

    def login(self, user: str, password: str, project: str, domain: str) -> "Login | None":
        """A token scoped to `project` for `user` (both named in `domain`), from one call to Keystone;
        None when Keystone refuses the credentials or the scope (or answers with no project scope).
        Raises KeystoneUnavailable when Keystone cannot be reached or fails."""
        import httpx
        body = {"auth": {"identity": {"methods": ["password"], "password": {
                    "user": {"name": user, "domain": {"name": domain}, "password": password}}},
                "scope": {"project": {"name": project, "domain": {"name": domain}}}}}
        try:
            r = self.http.post(f"{self.url}/v3/auth/tokens", json=body)
        except httpx.HTTPError as e:
            raise KeystoneUnavailable(f"Keystone did not answer: {type(e).__name__}") from None
        if r.status_code >= 500:
            raise KeystoneUnavailable(f"Keystone answered {r.status_code}")
        token = r.headers.get("X-Subject-Token", "")
        if r.status_code != 201 or not token:
            return None
        try:
            answer = r.json()["token"]
            identity, valid_for = _identity(answer)
        except (KeyError, TypeError, ValueError):
            return None
        if identity is None:
            return None
        self._remember(token, identity, time.monotonic() + min(self.cache_seconds, valid_for))
        return Login(token, identity, answer["expires_at"])

    def _ask(self, token: str) -> tuple[Identity | None, float]:
        import httpx
        try:
            r = self.http.get(f"{self.url}/v3/auth/tokens",
                              headers={"X-Auth-Token": self.service_token, "X-Subject-Token": token})
        except httpx.HTTPError:
            return None, 0.0          # Keystone unreachable: refuse, and ask again next time
        if r.status_code != 200:
            return None, self.cache_seconds if r.status_code == 404 else 0.0
        try:
            return _identity(r.json()["token"])
        except (KeyError, TypeError, ValueError):
            return None, 0.0          # a token without a project scope (or a malformed answer)


def _identity(body: dict) -> tuple[Identity | None, float]:
    """What a token Keystone describes (`body`: its answer's "token") means to fathom, and for how
    many seconds it is valid. KeyError, TypeError, ValueError: no project scope, or malformed."""
    project = body["project"]["id"]
    names = {role["name"] for role in body.get("roles", [])}
    expires = datetime.fromisoformat(body["expires_at"].replace("Z", "+00:00"))
    left = (expires if expires.tzinfo else expires.replace(tzinfo=timezone.utc)) - datetime.now(timezone.utc)
    if left.total_seconds() <= 0:
        return None, 0.0
    roles = frozenset(ROLE_MAP.get(n, "member") for n in names) or frozenset({"member"})
    return Identity(project=project, roles=roles), left.total_seconds()


class Login(NamedTuple):
    token: str
    identity: Identity
    expires_at: str          # as Keystone says it (ISO 8601, UTC)


class KeystoneUnavailable(Exception):
    pass
