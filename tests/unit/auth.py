"""Tokens for the unit tests: issued in the app's own store, as `fathom token create` would."""
from __future__ import annotations

from fathom.auth.client import bearer
from fathom.auth.tokens import issue_now


def headers_for(app, project: str = "admin", roles=("admin",), node: str | None = None) -> dict:
    """Authorization headers of a new token of `project` with `roles` (an agent token names its node)."""
    roles = roles.split(",") if isinstance(roles, str) else list(roles)
    return bearer(issue_now(app.state.engine, project=project, roles=roles, node=node))


class Identities:
    """Headers per (project, roles), issued once per app."""

    def __init__(self, app):
        self.app = app
        self._cache: dict = {}

    def __call__(self, who) -> dict | None:
        if who is None:
            return None
        if isinstance(who, dict):      # real headers, passed through
            return who
        if who not in self._cache:
            self._cache[who] = headers_for(self.app, *who)
        return self._cache[who]
