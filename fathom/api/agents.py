"""/v1/agents: the node agents follow their node's host-local desired state and report back.

* `GET /v1/agents/{node}/desired?after=<revision>&timeout=<s>`: the node's desired host-local
  objects (fathom.model.hostlocal) and their revision. A long-poll: when the revision is still
  `after`, the answer waits until it moves on or `timeout` seconds pass (then it is the same
  revision again). The revision never goes back (it lives in the store).
* `POST /v1/agents/{node}/report`: the agent's facts (OVS version, datapath types, kernel, eBPF,
  interfaces), the revision it applied and the status of every object it holds. Agents report
  every few seconds; an agent silent for `STALE_AFTER` seconds is down (fathom.controller.status).
* `GET /v1/agents`, `GET /v1/agents/{node}` (admin): what every agent last reported.

Who may: the `agent` token bound to node N reads N's desired state and reports for N, nothing of
any other node; an admin may read everything and report for no one.
"""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from fathom.api.auth import identity
from fathom.api.deps import ERRORS, StoreDep
from fathom.api.schemas import IFNAME_RE, NODE_NAME_RE
from fathom.apps.hostlocal import desired as hostlocal_desired
from fathom.auth import Identity
from fathom.model.hostlocal import to_json
from fathom.store import agents as ag
from fathom.store import models as m
from fathom.store.errors import Forbidden
from fathom.store.snapshot import load_snapshot

STALE_AFTER, REPORT_INTERVAL = ag.STALE_AFTER, ag.REPORT_INTERVAL
MAX_WAIT = 60.0           # longest long-poll
RECHECK = 5.0             # a long-poll also re-reads the store this often (other controllers' writes)

router = APIRouter(prefix="/agents", tags=["agents"], responses=ERRORS)
NodeName = Annotated[str, Field(pattern=NODE_NAME_RE)]


class AgentHub:
    """Wakes long-polls when the store changed (the API's on_change, from any thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def changed(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:   # its loop is closed
                pass

    async def wait(self, seconds: float) -> None:
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            self._waiters.add(entry)
        try:
            await asyncio.wait_for(event.wait(), seconds)
        except asyncio.TimeoutError:
            pass
        finally:
            with self._lock:
                self._waiters.discard(entry)


def _may(who: Identity, node: str, write: bool) -> None:
    if "agent" in who.roles and who.node == node:
        return
    if "admin" in who.roles and not write:
        return
    raise Forbidden(f"only node {node[:64]!r}'s agent token may " + ("report for it" if write else
                                                                       "read its desired state"))


def compute_all(session) -> dict[str, list]:
    """Every node's desired host-local objects, from one read of the store."""
    return hostlocal_desired(load_snapshot(session), ag.attachments(session))


class Interface(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(pattern=IFNAME_RE)
    mac: str | None = Field(default=None, max_length=17)
    up: bool = False
    kind: str | None = Field(default=None, max_length=32)


class Facts(BaseModel):
    """What an agent says about its host (fields it cannot tell are null)."""
    model_config = ConfigDict(extra="forbid")
    hostname: str | None = Field(default=None, max_length=255)
    ovs_version: str | None = Field(default=None, max_length=64)
    datapath_types: list[Annotated[str, Field(max_length=32)]] = Field(default_factory=list, max_length=16)
    ovs_kernel_module: bool | None = None
    kernel: str | None = Field(default=None, max_length=255)
    ebpf: dict[Annotated[str, Field(max_length=32)], bool] = Field(default_factory=dict, max_length=16)
    interfaces: list[Interface] = Field(default_factory=list, max_length=4096)
    agent_version: str | None = Field(default=None, max_length=64)


class ObjectStatus(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: Literal["pending", "active", "error"]
    reason: str | None = Field(default=None, max_length=1024)
    applied: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$",
                                description="digest of the object as the agent applied it")
    counters: dict[Annotated[str, Field(pattern=r"^[a-z_]{1,32}$")], Annotated[int, Field(ge=0, lt=2**63)]] | None = \
        Field(default=None, max_length=32, description="what the object measured (a PPTMon loader's counters)")


OwnerKey = Annotated[str, Field(pattern=r"^[a-z_]{1,32}:[0-9]{1,10}$")]


class Report(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent_started: float | None = Field(default=None, ge=0, le=1e11)
    applied_revision: int | None = Field(default=None, ge=0, le=2**31 - 1)
    facts: Facts = Field(default_factory=Facts)
    objects: dict[OwnerKey, ObjectStatus] = Field(default_factory=dict, max_length=10_000)


class DesiredOut(BaseModel):
    node: str
    revision: int
    objects: list[dict]
    report_interval_s: float = REPORT_INTERVAL


class AgentOut(BaseModel):
    node: str
    state: Literal["up", "down", "never reported"]
    revision: int
    applied_revision: int | None
    reported_at: float | None
    agent_started: float | None
    facts: dict
    objects: dict


@router.get("/{node}/desired", response_model=DesiredOut,
            summary="The node's host-local desired state (long-poll with `after` and `timeout`)")
async def desired(node: NodeName, request: Request, db: StoreDep, who: Identity = Depends(identity),
                  after: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
                  timeout: Annotated[float, Query(ge=0, le=MAX_WAIT)] = 0.0):
    _may(who, node, write=False)
    hub: AgentHub = request.app.state.agent_hub

    def current():
        def fn(s):
            objects = compute_all(s).get(node)
            if objects is None:
                ag.node_by_name(s, node)   # 404 for an unknown node
                objects = []
            return ag.number_desired(s, node, objects), [to_json(o) for o in objects]
        return db.write(fn, notify=False)

    deadline = time.monotonic() + min(timeout, request.app.state.agent_max_wait)
    while True:
        revision, objects = await run_in_threadpool(current)
        left = deadline - time.monotonic()
        if after is None or revision != after or left <= 0:
            return DesiredOut(node=node, revision=revision, objects=objects)
        await hub.wait(min(left, RECHECK))


def _object(status: ObjectStatus) -> dict:
    """As stored: counters only where the agent gave some."""
    return status.model_dump(exclude={"counters"} if status.counters is None else None)


@router.post("/{node}/report", status_code=204, summary="The agent's facts and the status of what it holds")
def report(node: NodeName, body: Report, request: Request, db: StoreDep, who: Identity = Depends(identity)):
    _may(who, node, write=True)
    news = db.write(lambda s: ag.record_report(s, node, agent_started=body.agent_started,
                                                applied_revision=body.applied_revision,
                                                facts=body.facts.model_dump(mode="json"),
                                                objects={k: _object(v) for k, v in body.objects.items()}),
                    notify=False)
    if news and db.on_change:   # the reconciler reads it (statuses, new router ports); heartbeats wake nothing
        db.on_change()


def agent_out(view: ag.AgentView | None, node: str, now: float) -> AgentOut:
    if view is None or view.reported_at is None:
        return AgentOut(node=node, state="never reported", revision=view.revision if view else 0,
                        applied_revision=None, reported_at=None, agent_started=None, facts={}, objects={})
    return AgentOut(node=node, state="up" if now - view.reported_at <= STALE_AFTER else "down",
                    revision=view.revision, applied_revision=view.applied_revision, reported_at=view.reported_at,
                    agent_started=view.agent_started, facts=view.facts, objects=view.objects)


@router.get("", response_model=list[AgentOut], summary="Every node's agent: up or down, facts, object statuses")
def list_agents(db: StoreDep, who: Identity = Depends(identity)):
    if "admin" not in who.roles:
        raise Forbidden("only an admin can see the agents")

    def fn(s):
        views = ag.agents(s)
        now = time.time()
        return [agent_out(views.get(n), n, now) for n in s.scalars(select(m.Node.name).order_by(m.Node.id))]
    return db.read(fn)


@router.get("/{node}", response_model=AgentOut, summary="One node's agent")
def show_agent(node: NodeName, db: StoreDep, who: Identity = Depends(identity)):
    _may(who, node, write=False)
    return db.read(lambda s: agent_out(ag.agent_of(s, node), node, time.time()))
