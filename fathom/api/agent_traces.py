"""Trace requests to the node agents: `ovs-appctl ofproto/trace` of one packet on one of the
node's bridges, for `POST /v1/traces` with `actual` (fathom.trace; docs/trace.md).

The controller never runs a command on a host: it puts a request on the desk (`TraceDesk.ask`),
the node's agent gets it with the answer to its desired-state long-poll (which the request wakes:
fathom.api.agents), runs the trace and posts the output back
(`POST /v1/agents/{node}/traces/{id}`, the node's agent token only). The caller waits for the
answer at most until its deadline; a request that was not answered by then is forgotten, and a
late answer finds nothing (404).

Bounded: at most MAX_PENDING requests per node and MAX_OUTPUT bytes of output per answer; the
request names one of BRIDGES, a flow of FLOW_RE (built by the controller from a trace's packet,
fathom.trace.ofproto) and the conntrack state every ct action resumes with.
"""
from __future__ import annotations

import asyncio
import itertools
import re
import threading
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from fathom.api.auth import identity
from fathom.api.deps import ERRORS
from fathom.api.schemas import NODE_NAME_RE
from fathom.auth import Identity
from fathom.store.errors import Forbidden, NotFound

MAX_PENDING = 16              # requests per node not answered yet
MAX_OUTPUT = 256 * 1024       # characters of ofproto/trace output per answer
BRIDGES = ("br-int", "br-phy")
CT_NEXT = ("trk,new", "trk,est")
MAX_CT_NEXT = 8               # ct actions a trace resumes (a packet meets at most a few per bridge)
# a br_flow as fathom.trace.ofproto writes it: field=value pairs of plain characters
FLOW_RE = r"^[a-z][a-z0-9_]*(=[0-9A-Za-z_.:/x]+)?(,[a-z][a-z0-9_]*(=[0-9A-Za-z_.:/x]+)?)*$"
MAX_FLOW = 1024


class TooManyTraces(Exception):
    """The node has MAX_PENDING requests not answered yet."""


@dataclass(eq=False)
class Ask:
    id: int
    node: str
    bridge: str
    flow: str
    ct_next: list[str]
    handed: bool = False            # taken by the agent's long-poll
    output: str | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def to_json(self) -> dict:
        return {"id": self.id, "bridge": self.bridge, "flow": self.flow, "ct_next": self.ct_next}


class TraceDesk:
    """The trace requests not answered yet, by id, and the long-polls waiting for a node's."""
    max_pending = MAX_PENDING

    def __init__(self):
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._asks: dict[int, Ask] = {}
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}

    def ask(self, node: str, bridge: str, flow: str, ct_next: list[str]) -> Ask:
        if bridge not in BRIDGES or len(flow) > MAX_FLOW or not re.match(FLOW_RE, flow) \
                or len(ct_next) > MAX_CT_NEXT or any(c not in CT_NEXT for c in ct_next):
            raise ValueError(f"not a trace fathom asks for: {bridge} {flow[:100]!r} {ct_next}")
        return self._put(node, lambda ask_id: Ask(ask_id, node, bridge, flow, list(ct_next)))

    def _put(self, node: str, make):
        """The request `make(its id)` on the desk, waking the node's long-polls; at most
        `max_pending` per node (TooManyTraces beyond)."""
        with self._lock:
            if sum(1 for a in self._asks.values() if a.node == node) >= self.max_pending:
                raise TooManyTraces(f"node {node} has {self.max_pending} requests not answered yet")
            a = make(next(self._ids))
            self._asks[a.id] = a
            for loop, event in self._waiters.get(node, ()):
                try:
                    loop.call_soon_threadsafe(event.set)
                except RuntimeError:   # its loop is closed
                    pass
        return a

    def wait(self, a: Ask, seconds: float) -> bool:
        """Until `a` is answered (True) or `seconds` pass (False: then it is forgotten)."""
        if a.done.wait(max(0.0, seconds)):
            return True
        self.forget(a)
        return a.done.is_set()

    def forget(self, a: Ask) -> None:
        with self._lock:
            self._asks.pop(a.id, None)

    def take(self, node: str) -> list[dict]:
        """The node's requests not handed out yet (now handed out)."""
        with self._lock:
            out = [a for a in self._asks.values() if a.node == node and not a.handed]
            for a in out:
                a.handed = True
        return [a.to_json() for a in out]

    async def arrival(self, node: str) -> None:
        """Returns once the node has a request not handed out (at once if it has one now)."""
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            if any(a.node == node and not a.handed for a in self._asks.values()):
                return
            self._waiters.setdefault(node, set()).add(entry)
        try:
            await event.wait()
        finally:
            with self._lock:
                waiting = self._waiters.get(node)
                if waiting is not None:
                    waiting.discard(entry)
                    if not waiting:
                        del self._waiters[node]

    def answer(self, node: str, ask_id: int, output: str | None, error: str | None) -> bool:
        """The agent's answer; False when no such request of this node waits for one."""
        with self._lock:
            a = self._asks.get(ask_id)
            if a is None or a.node != node or not a.handed:
                return False
            del self._asks[ask_id]
        a.output, a.error = output, error
        a.done.set()
        return True


class TraceAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    output: str | None = Field(default=None, max_length=MAX_OUTPUT, description="what ofproto/trace printed")
    error: str | None = Field(default=None, max_length=2048, description="why the agent could not trace")


router = APIRouter(prefix="/agents", tags=["agents"], responses=ERRORS)


@router.post("/{node}/traces/{ask_id}", status_code=204, summary="An agent's answer to a trace request")
def answer_trace(node: Annotated[str, Field(pattern=NODE_NAME_RE)], ask_id: Annotated[int, Field(ge=1, le=2**62)],
                 body: TraceAnswer, request: Request, who: Identity = Depends(identity)):
    if "agent" not in who.roles or who.node != node:
        raise Forbidden(f"only node {node[:64]!r}'s agent token may answer its trace requests")
    if not request.app.state.trace_desk.answer(node, ask_id, body.output, body.error):
        raise NotFound(f"no trace request {ask_id} of node {node[:64]!r} waits for an answer (it timed out?)")
