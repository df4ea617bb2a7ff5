"""The node agents in the store: desired-state revisions, reports, and PPTMon attachments.

`number_desired` numbers a node's host-local desired state (fathom.model.hostlocal_desired, a pure function
of the model): the revision moves on whenever the state's digest changes, and is kept in the
store, so it survives a controller restart and is the same on every controller of a store.
`record_report` keeps what the node's agent says: its facts, the revision it applied, the status of
each object it holds, and when it said it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from sqlalchemy import select
from sqlalchemy.orm import Session

from fathom.model.hostlocal import PptmonAttach, digest
from fathom.store import models as m
from fathom.store.agent_models import NodeAgent, PptmonAttachment
from fathom.store.errors import Conflict, Invalid, NotFound
from fathom.store.ops import Caller, get, node_by_name, require_admin

PPT_MODES = ("source", "transit", "sink", "source-sink")
REPORT_INTERVAL = 300.0   # an agent reports when something changed, else this often (a liveness beat)
STALE_AFTER = 15.0        # seconds without a word (a report, or its long-poll held or renewed): down


@dataclass(frozen=True)
class AgentView:
    """What the controller knows of one node's agent (plain values, for the status model)."""
    node: str
    revision: int
    applied_revision: int | None
    facts: dict
    objects: dict            # "kind:id" -> {"status": ..., "reason": ...}
    reported_at: float | None    # epoch seconds
    agent_started: float | None


def attachments(session: Session) -> list[tuple[str, PptmonAttach]]:
    """Every PPTMon attachment as (node name, model object)."""
    names = dict(session.execute(select(m.Node.id, m.Node.name)).all())
    return [(names[a.node_id], attach_model(a))
            for a in session.scalars(select(PptmonAttachment).order_by(PptmonAttachment.id)) if a.node_id in names]


def attach_model(a: PptmonAttachment) -> PptmonAttach:
    return PptmonAttach(a.id, a.chain, a.vnf_id, a.mode, f"{a.in_interface}:{a.in_direction}",
                        f"{a.out_interface}:{a.out_direction}", a.period_ns)


def number_desired(session: Session, node: str, state: list | str) -> int:
    """The revision of a node's desired host-local state `state` (its objects, computed by the caller
    with fathom.model.hostlocal_desired, or their digest): moved on when the state changed since it was last
    numbered. Call in a write transaction."""
    row = node_by_name(session, node)
    agent = session.get(NodeAgent, row.id)
    if agent is None:
        agent = NodeAgent(node_id=row.id, revision=0, digest="", facts={}, objects={})
        session.add(agent)
    d = state if isinstance(state, str) else digest(state)
    if agent.digest != d:
        agent.revision, agent.digest = (agent.revision or 0) + 1, d
    session.flush()
    return agent.revision


def record_report(session: Session, node: str, *, agent_started: float | None, applied_revision: int | None,
                  facts: dict, objects: dict) -> bool:
    """Keep an agent's report; True when it says something new (not just "still here"). A report
    that says nothing new is written only when the stored one is older than REPORT_INTERVAL / 2
    (liveness the store keeps for readers in other processes)."""
    row = node_by_name(session, node)
    agent = session.get(NodeAgent, row.id)
    if agent is None:
        agent = NodeAgent(node_id=row.id, revision=0, digest="", facts={}, objects={})
        session.add(agent)
    started = int(agent_started * 1000) if agent_started is not None else None
    news = (agent.facts != facts or _states(agent.objects) != _states(objects)
            or agent.applied_revision != applied_revision
            or agent.agent_started != started or agent.reported_at is None)
    if not news and agent.objects == objects and time.time() - _epoch(agent.reported_at) < REPORT_INTERVAL / 2:
        return False   # nothing new, not even counters, and the last beat is recent: no write
    agent.facts, agent.objects, agent.applied_revision = facts, objects, applied_revision
    agent.agent_started = started
    agent.reported_at = datetime.now(timezone.utc)
    session.flush()
    return news


def _epoch(at: datetime | None) -> float | None:
    if at is None:
        return None
    if at.tzinfo is None:   # SQLite gives naive UTC back
        at = at.replace(tzinfo=timezone.utc)
    return at.timestamp()


def _states(objects: dict | None) -> dict:
    """The objects' statuses without their counters (counters move on with every report: news for
    the status model only when the statuses change)."""
    return {k: {f: x for f, x in v.items() if f != "counters"} if isinstance(v, dict) else v
            for k, v in (objects or {}).items()}


def _view(name: str, a: NodeAgent) -> AgentView:
    return AgentView(name, a.revision or 0, a.applied_revision, dict(a.facts or {}), dict(a.objects or {}),
                     _epoch(a.reported_at), a.agent_started / 1000 if a.agent_started else None)


def heard(view: AgentView, last_heard: float | None) -> AgentView:
    """`view` with `reported_at` moved to `last_heard` when the agent was heard later than its
    stored report (its long-poll: fathom.api.agents.AgentHub.last_heard). An agent that never
    reported stays so."""
    if view.reported_at is None or last_heard is None or last_heard <= view.reported_at:
        return view
    return replace(view, reported_at=last_heard)


def agents(session: Session) -> dict[str, AgentView]:
    """node name -> what its agent last reported (nodes whose agent never spoke are absent)."""
    names = dict(session.execute(select(m.Node.id, m.Node.name)).all())
    return {names[a.node_id]: _view(names[a.node_id], a) for a in session.scalars(select(NodeAgent))
            if a.node_id in names}


def agent_of(session: Session, node: str) -> AgentView | None:
    row = node_by_name(session, node)
    a = session.get(NodeAgent, row.id)
    return _view(node, a) if a is not None else None


def recommended_datapath(facts: dict) -> str | None:
    """The datapath a node's agent facts call for: `system` where OVS has it and the kernel module is
    loaded, `netdev` otherwise; None without facts."""
    if not facts:
        return None
    if facts.get("ovs_kernel_module") and "system" in (facts.get("datapath_types") or []):
        return "system"
    return "netdev"


# ---------------------------------------------------------------------------------------------- attachments

def create_attachment(session: Session, caller: Caller, *, name: str, node: str, chain: str, vnf_id: int,
                      mode: str, in_interface: str, in_direction: str, out_interface: str, out_direction: str,
                      period_ns: int) -> PptmonAttachment:
    require_admin(caller, "manage PPTMon attachments")
    n = node_by_name(session, node)
    if mode not in PPT_MODES:
        raise Invalid(f"mode is one of {PPT_MODES}", "mode")
    if session.scalar(select(PptmonAttachment).where(PptmonAttachment.name == name)):
        raise Conflict(f"a PPTMon attachment named {name!r} exists", "name")
    taken = {(a.in_interface, a.in_direction) for a in session.scalars(
        select(PptmonAttachment).where(PptmonAttachment.node_id == n.id))} | {
        (a.out_interface, a.out_direction) for a in session.scalars(
            select(PptmonAttachment).where(PptmonAttachment.node_id == n.id))}
    for field, point in (("in_interface", (in_interface, in_direction)), ("out_interface", (out_interface, out_direction))):
        if point in taken:
            raise Conflict(f"{point[0]}:{point[1]} on node {node!r} already holds a PPTMon program", field)
    if (in_interface, in_direction) == (out_interface, out_direction):
        raise Invalid("the in and out points must differ", "out_interface")
    a = PptmonAttachment(name=name, node_id=n.id, chain=chain, vnf_id=vnf_id, mode=mode, in_interface=in_interface,
                         in_direction=in_direction, out_interface=out_interface, out_direction=out_direction,
                         period_ns=period_ns, project_id=caller.project, status="pending",
                         status_reason=f"waiting for the agent on {node}")
    session.add(a)
    session.flush()
    return a


def update_attachment(session: Session, caller: Caller, attachment_id: int, period_ns: int) -> PptmonAttachment:
    require_admin(caller, "manage PPTMon attachments")
    a = get(session, caller, PptmonAttachment, attachment_id)
    a.period_ns = period_ns
    session.flush()
    return a


def delete_attachment(session: Session, caller: Caller, attachment_id: int) -> None:
    require_admin(caller, "manage PPTMon attachments")
    session.delete(get(session, caller, PptmonAttachment, attachment_id))
    session.flush()


def node_name_of(session: Session, node_id: int) -> str:
    n = session.get(m.Node, node_id)
    if n is None:
        raise NotFound(f"node {node_id} does not exist")
    return n.name
