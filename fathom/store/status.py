"""Status write-back for the controller: what the switches really hold, per store object.

Kinds are the names of fathom.pipeline.stages.KINDS ("node", "network", "subnet", "port", "router",
"router_interface"), so a status can be set straight from a flow's cookie. Writing a status does not
change any desired state, so it must not wake the reconciler.
"""
from __future__ import annotations

from typing import Iterable

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from fathom.store import models as m

MODELS = {
    "node": m.Node, "network": m.Network, "subnet": m.Subnet, "port": m.Port,
    "router": m.Router, "router_interface": m.Port,   # a router interface is a port of the router
}


def set_status(session: Session, kind: str, object_id: int, status: str,
               reason: str | None = None) -> bool:
    """Set one object's status ("pending", "active", "error") and reason; False if it is gone."""
    if status not in m.STATUSES:
        raise ValueError(f"status {status!r} is not one of {m.STATUSES}")
    obj = session.get(MODELS[kind], object_id)
    if obj is None:
        return False
    if obj.status != status or obj.status_reason != reason:
        obj.status, obj.status_reason = status, reason
    return True


def set_node_state(session: Session, node_id: int, state: str, reason: str | None = None) -> bool:
    """Bootstrap state of a node (init, device_created, complete, error). `error` also sets the
    node's status to error with `reason`; `complete` makes it active; others leave it pending."""
    if state not in m.NODE_STATES:
        raise ValueError(f"node state {state!r} is not one of {m.NODE_STATES}")
    node = session.get(m.Node, node_id)
    if node is None:
        return False
    node.state = state
    node.status = {"error": "error", "complete": "active"}.get(state, "pending")
    node.status_reason = reason
    return True


def set_statuses(engine: Engine, updates: Iterable[tuple[str, int, str, str | None]]) -> None:
    """Apply many (kind, id, status, reason) updates in one transaction."""
    with Session(engine) as session, session.begin():
        for kind, object_id, status, reason in updates:
            set_status(session, kind, object_id, status, reason)
