"""Who may call the controller: bearer tokens it issues (tokens.py), optionally Keystone tokens
(keystone.py), and the identity a verified token gives (Identity)."""
from __future__ import annotations

from dataclasses import dataclass

ROLES = ("admin", "member", "service", "agent", "replica")
# "replica": a token a cluster's replica issues itself for one request to another replica (a trace
# of a node's tables whose agent polls that replica: fathom.api.traces), naming the node, valid for
# that request's time only and removed after it; never issued through the API.


@dataclass(frozen=True)
class Identity:
    """What a verified credential says: the project it belongs to, its roles, and for an agent
    token the node it speaks for."""
    project: str
    roles: frozenset[str]
    node: str | None = None
    token_id: int | None = None     # controller-issued tokens: their id (None for Keystone)
