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
fathom.trace.ofproto) and the conntrack state every ct action resumes with. A live trace
(fathom.trace.live) asks with `ask_live`: arm the node's observation points (the source node's
last, injecting the probe), collect what they saw; the agent answers with `live` (fathom.agent.livetrace).

In a cluster, a node's agent polls one replica, whose desk alone it reads: another replica asks
there (`POST /v1/agents/{node}/traces`) and waits for the answer (fathom.api.traces). It asks with
a token of its own (role `replica`, naming the node, valid for the hop's time and removed after
it), having checked the caller's right to the trace itself: the caller's token is never passed on,
and a member's trace crosses replicas as an admin's does. Admins may ask there too.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator

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
LIVE_KINDS = ("live-arm", "live-collect")
MAX_LIVE_REQUEST = 64 * 1024  # bytes of a live trace's request as JSON (a probe frame within the MTU, as hex)


class TooManyTraces(Exception):
    """The node has MAX_PENDING requests not answered yet."""


@dataclass(eq=False)
class Ask:
    id: int
    node: str
    bridge: str
    flow: str
    ct_next: list[str]
    live: dict | None = None        # a live trace's request (kind live-arm | live-collect, ...)
    handed: bool = False            # taken by the agent's long-poll
    output: str | None = None
    error: str | None = None
    answer: dict | None = None      # a live trace's answer
    done: threading.Event = field(default_factory=threading.Event)

    def to_json(self) -> dict:
        if self.live is not None:
            return {"id": self.id, **self.live}
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

    def ask_live(self, node: str, request: dict) -> Ask:
        """A live trace's request to the node's agent (fathom.trace.live builds them)."""
        if request.get("kind") not in LIVE_KINDS:
            raise ValueError(f"not a live trace request: {request.get('kind')!r}")
        return self._put(node, lambda ask_id: Ask(ask_id, node, "", "", [], live=dict(request)))

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

    def answer(self, node: str, ask_id: int, output: str | None, error: str | None, live: dict | None = None) -> bool:
        """The agent's answer; False when no such request of this node waits for one."""
        with self._lock:
            a = self._asks.get(ask_id)
            if a is None or a.node != node or not a.handed:
                return False
            del self._asks[ask_id]
        a.output, a.error, a.answer = output, error, live
        a.done.set()
        return True


class Vxlan(BaseModel):
    model_config = ConfigDict(extra="forbid")
    vni: int = Field(ge=0, lt=2 ** 24)
    src: str = Field(max_length=15)
    dst: str = Field(max_length=15)


class Seen(BaseModel):
    """One sighting of a live trace's probe by an observation point (native/pptmon/livetrace.c): an
    ICMP probe's with its `icmp_type`, a TCP probe's with its `tcp_flags`."""
    model_config = ConfigDict(extra="forbid")
    dev: str = Field(max_length=15)
    dir: Literal["ingress", "egress", "injected"]
    ktime_ns: int = Field(ge=0, lt=2 ** 64)
    icmp_type: Literal[0, 8] | None = None
    ttl: int = Field(ge=0, le=255)
    len: int = Field(ge=0, le=2 ** 20)
    src: str = Field(max_length=15)
    dst: str = Field(max_length=15)
    vlan: int | None = Field(default=None, ge=0, le=4095)
    vxlan: Vxlan | None = None
    tcp_flags: int | None = Field(default=None, ge=0, le=255)

    @model_validator(mode="after")
    def _icmp_or_tcp(self):
        if (self.icmp_type is None) == (self.tcp_flags is None):
            raise ValueError("a sighting is of an ICMP echo (icmp_type) or of a TCP segment (tcp_flags)")
        return self


class WatcherOut(BaseModel):
    """The node's watcher process (fathom.agent.livetrace): its number (a new one after an idle end) and
    the interfaces it attached its programs to for this trace (the others it watched already)."""
    model_config = ConfigDict(extra="forbid")
    number: int = Field(ge=0, lt=2 ** 63)
    attached: list[Annotated[str, Field(max_length=15)]] = Field(default_factory=list, max_length=64)


class LiveAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    watcher: WatcherOut | None = None
    injected: bool | None = None
    not_injected: str | None = Field(default=None, max_length=500)
    watched: list[Annotated[str, Field(max_length=15)]] | None = Field(default=None, max_length=64)
    not_watched: list[Annotated[str, Field(max_length=15)]] | None = Field(default=None, max_length=64)
    seen: list[Seen] | None = Field(default=None, max_length=256)
    realtime_offset_ns: int | None = Field(default=None, ge=-2 ** 63, lt=2 ** 63)
    watcher_error: str | None = Field(default=None, max_length=500)


class TraceAsk(BaseModel):
    """A request to the node's agent asked by another replica: a hop of a trace (`bridge`, `flow`,
    `ct_next`, as TraceDesk.ask) or a live trace's request (`live`, as TraceDesk.ask_live)."""
    model_config = ConfigDict(extra="forbid")
    bridge: Literal[BRIDGES] | None = None
    flow: str | None = Field(default=None, max_length=MAX_FLOW, pattern=FLOW_RE)
    ct_next: list[Literal[CT_NEXT]] = Field(default_factory=list, max_length=MAX_CT_NEXT)
    live: dict | None = Field(default=None, description="a live trace's request (fathom.trace.live)")
    timeout: float = Field(ge=0.1, le=20.0, description="seconds the agent has to answer")

    @model_validator(mode="after")
    def _one_kind(self):
        if (self.live is None) == (self.bridge is None or self.flow is None):
            raise ValueError("give bridge and flow (a hop), or live (a live trace's request)")
        if self.live is not None:
            if self.live.get("kind") not in LIVE_KINDS:
                raise ValueError(f"live: kind is one of {', '.join(LIVE_KINDS)}")
            if len(json.dumps(self.live)) > MAX_LIVE_REQUEST:
                raise ValueError(f"live: at most {MAX_LIVE_REQUEST} bytes")
        return self


class TraceAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    output: str | None = Field(default=None, max_length=MAX_OUTPUT, description="what ofproto/trace printed")
    error: str | None = Field(default=None, max_length=2048, description="why the agent could not trace")
    live: LiveAnswer | None = Field(default=None, description="a live trace's answer (fathom.agent.livetrace)")


router = APIRouter(prefix="/agents", tags=["agents"], responses=ERRORS)


@router.post("/{node}/traces", response_model=TraceAnswer,
             summary="Ask the node's agent, polling this replica, to trace a flow (another replica asks; admin)")
def ask_trace(node: Annotated[str, Field(pattern=NODE_NAME_RE)], body: TraceAsk, request: Request,
              who: Identity = Depends(identity)):
    if "admin" not in who.roles and not ("replica" in who.roles and who.node == node):
        raise Forbidden("only another replica (with its token for this node) or an admin may ask a node's agent "
                        "for a trace of its tables")
    desk: TraceDesk = request.app.state.trace_desk
    try:
        a = desk.ask_live(node, body.live) if body.live is not None else desk.ask(node, body.bridge, body.flow,
                                                                                   body.ct_next)
    except TooManyTraces as e:
        raise HTTPException(429, detail=[{"loc": [], "msg": str(e), "type": "rate_limited"}],
                            headers={"Retry-After": "1"}) from None
    if not desk.wait(a, body.timeout):
        return TraceAnswer(error=f"node {node}'s agent did not answer within {body.timeout:g} s")
    return TraceAnswer(output=a.output, error=a.error, live=a.answer)


@router.post("/{node}/traces/{ask_id}", status_code=204, summary="An agent's answer to a trace request")
def answer_trace(node: Annotated[str, Field(pattern=NODE_NAME_RE)], ask_id: Annotated[int, Field(ge=1, le=2**62)],
                 body: TraceAnswer, request: Request, who: Identity = Depends(identity)):
    if "agent" not in who.roles or who.node != node:
        raise Forbidden(f"only node {node[:64]!r}'s agent token may answer its trace requests")
    live = body.live.model_dump(exclude_none=True) if body.live is not None else None
    if not request.app.state.trace_desk.answer(node, ask_id, body.output, body.error, live):
        raise NotFound(f"no trace request {ask_id} of node {node[:64]!r} waits for an answer (it timed out?)")
