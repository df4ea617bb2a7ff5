"""/v1/agents: the node agents follow their node's host-local desired state and report back.

* `GET /v1/agents/{node}/desired?after=<revision>&timeout=<s>`: the node's desired host-local
  objects (fathom.model.hostlocal) and their revision. A long-poll: when the revision is still
  `after`, the answer waits until it moves on or `timeout` seconds pass (then it is the same
  revision again). The revision never goes back (it lives in the store). With `keepalive=<s>`, a
  poll still waiting after `s` seconds is answered at once and its body streamed: a space every
  `s` seconds, then the JSON (header `X-Fathom-Keepalive`), so that an agent tells a controller
  that stopped (paused, hung) from one with nothing new, and asks another replica.
* `POST /v1/agents/{node}/report`: the agent's facts (OVS version, datapath types, kernel, eBPF,
  interfaces), the revision it applied and the status of every object it holds. Agents report
  when something changed (and rarely otherwise, every `REPORT_INTERVAL` seconds).
* `GET /v1/agents`, `GET /v1/agents/{node}` (admin): what every agent last reported.

What an idle cloud costs: an agent's long-poll is its heartbeat. While it holds one, or for
`STALE_AFTER` seconds after its last call, it is present (`AgentHub`, in memory: no store access);
an agent whose connection closes, or that stops calling, is down `STALE_AFTER` seconds later
(fathom.controller.hostlocal). The desired state of every node is computed from one read of the
store per store change (its parts that were written: fathom.store.changes), shared by all long-polls
(`DesiredCache`); a change wakes only the long-polls of the nodes whose state moved, and a node's
revision is written only when its state changed.

Who may: the `agent` token bound to node N reads N's desired state and reports for N, nothing of
any other node; an admin may read everything and report for no one.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from fathom.api.auth import identity
from fathom.api.deps import ERRORS, StoreDep
from fathom.api.schemas import IFNAME_RE, NODE_NAME_RE
from fathom.model.hostlocal_desired import Desired
from fathom.auth import Identity
from fathom.model.hostlocal import KEEPALIVE_HEADER, DatapathFlush, digest_json, to_json
from fathom.store import agents as ag
from fathom.store import models as m
from fathom.store.changes import TableChanges
from fathom.store.errors import Forbidden, NotFound, StoreError
from fathom.store.snapshot import StoreReader

log = logging.getLogger(__name__)

STALE_AFTER, REPORT_INTERVAL = ag.STALE_AFTER, ag.REPORT_INTERVAL
MAX_WAIT = 60.0           # longest long-poll
# a long-poll's keepalive (`keepalive=`): seconds between the spaces of a streamed answer, at least and at most
KEEPALIVE_MIN, KEEPALIVE_MAX = 1.0, 30.0
# the store is read again at least this often, for rows written past this API (as the reconciler's
# audit, 300 s by default, reads it whole): each read loads the whole model, whose cost grows with the cloud
RECHECK = 300.0
COALESCE = 0.5            # during a burst of writes, the desired state is recomputed at most this often

router = APIRouter(prefix="/agents", tags=["agents"], responses=ERRORS)
NodeName = Annotated[str, Field(pattern=NODE_NAME_RE)]


class AgentHub:
    """Wakes an agent's long-poll when its node's desired state moved, numbers the store's changes
    (`generation`), and keeps which agents are present: holding a long-poll now, or heard from
    within the last seconds (`last_heard`).

    A store change (the API's on_change, from any thread) wakes one refresher thread, not the
    long-polls: after the cache's holdoff it works out the desired state once (`DesiredCache.refresh`)
    and wakes the long-polls of the nodes whose state moved. So a change costs the nodes it
    touches, not every agent's long-poll (a burst of writes to one node at 100 nodes: one wake-up
    a refresh, not a hundred)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}   # node -> long-polls
        self.generation = 0
        self.refreshes = 0                    # refreshes done (a long-poll that saw fewer looks again)
        self.woken = 0                        # long-polls woken by a refresh
        self._held: dict[str, int] = {}       # node -> long-polls it holds now
        self._heard: dict[str, float] = {}    # node -> epoch seconds of its last call (or hang-up)
        self.flushes: dict[str, DatapathFlush] = {}   # node -> the datapath flush the controller asks of it
        self.flushes_asked = 0                # counts the controller's requests
        self._refresh = lambda: set()         # () -> nodes whose state moved (set by `follow`)
        self._holdoff = lambda: 0.0
        self._dirty = threading.Event()
        self._refresher: threading.Thread | None = None
        # in a cluster (fathom.controller.cluster): node -> when another replica last heard its
        # agent, and the API address of the replica it polls (None: none does)
        self.heard_elsewhere = lambda node: None
        self.polls_elsewhere = lambda node: None
        self.closing = False                  # the API stops: held long-polls answer now

    def close(self) -> None:
        """The API is stopping: every held long-poll answers at once (the agents ask again, of
        another replica if there is one), and none waits from now on."""
        with self._lock:
            self.closing = True
            self._wake(list(self._waiters))

    def follow(self, refresh, holdoff) -> None:
        """Wake long-polls by node: `refresh()` works out the desired state and returns the nodes
        whose state moved since its last call; `holdoff()` is how long to wait before it."""
        self._refresh, self._holdoff = refresh, holdoff

    def ask_flush(self, flushes: dict) -> None:
        """The controller asks these nodes to flush their datapaths (fathom.model.hostlocal.DatapathFlush,
        by node): part of their desired state from now on, served at once (no coalescing)."""
        with self._lock:
            self.flushes = dict(flushes)
            self.flushes_asked += 1
        self.changed()

    def changed(self) -> None:
        with self._lock:
            self.generation += 1
        self._dirty.set()

    def _refreshing(self) -> None:
        while True:
            self._dirty.wait()
            self._dirty.clear()
            time.sleep(self._holdoff())
            try:
                moved = self._refresh()
            except Exception:    # the store is unreachable: the long-polls look (and answer 503) themselves
                log.exception("working out the agents' desired state failed")
                moved = None
            with self._lock:
                self.refreshes += 1
                self._wake(list(self._waiters) if moved is None else moved)

    def _wake(self, nodes) -> None:
        """Under the lock: wake the long-polls of `nodes`."""
        for node in nodes:
            for loop, event in self._waiters.get(node, ()):
                self.woken += 1
                try:
                    loop.call_soon_threadsafe(event.set)
                except RuntimeError:   # its loop is closed
                    pass

    async def wait(self, node: str, seconds: float, seen: int, *also) -> None:
        """Until `node`'s desired state moves, `seconds` pass, or one of the awaitables `also`
        completes; at once if a refresh ended since the caller read `refreshes` (`seen`) before
        it looked at the state."""
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            if self.refreshes != seen or self.closing:
                return
            self._waiters.setdefault(node, set()).add(entry)
            if self._refresher is None:   # started with the first long-poll: none runs in a cloud without agents
                self._refresher = threading.Thread(target=self._refreshing, daemon=True, name="agent-desired")
                self._refresher.start()
        woken = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait([woken, *also], timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            with self._lock:
                waiting = self._waiters.get(node)
                if waiting is not None:
                    waiting.discard(entry)
                    if not waiting:
                        del self._waiters[node]

    def heard(self, node: str) -> None:
        self._heard[node] = time.time()

    def hold(self, node: str) -> None:
        with self._lock:
            self._held[node] = self._held.get(node, 0) + 1
            self._heard[node] = time.time()

    def release(self, node: str) -> None:
        with self._lock:
            self._held[node] = self._held.get(node, 1) - 1
            self._heard[node] = time.time()

    def last_heard(self, node: str) -> float | None:
        """Now while the node's agent holds a long-poll, else when it was last heard, by this
        process or another replica (None: never)."""
        return max(filter(None, (self.heard_here(node), self.heard_elsewhere(node))), default=None)

    def heard_here(self, node: str) -> float | None:
        """Now while the node's agent holds a long-poll here, else when this process last heard it."""
        if self._held.get(node, 0) > 0:
            return time.time()
        return self._heard.get(node)

    def present(self) -> dict[str, float]:
        """node -> seconds since this process heard its agent (0 while it holds a long-poll), for
        the agents heard within STALE_AFTER: what a replica tells the others."""
        now = time.time()
        with self._lock:
            out = {n: 0.0 for n, held in self._held.items() if held > 0}
            out.update((n, round(now - t, 3)) for n, t in self._heard.items()
                       if n not in out and now - t <= STALE_AFTER)
        return out


class DesiredCache:
    """Every node's host-local desired state, computed from one read of the store when the store
    changed (shared by every agent's long-poll; during a burst of writes at most every COALESCE
    seconds), and the revision numbering each node's state, written to the store only when that
    node's state changed. A read reads again only the parts of the store whose tables were written
    since the read before (and those of that read: a write committing while it was taken is read
    by the next), the whole store the first time and every RECHECK seconds.

    `db` (fathom.api.deps.Store) is read by the hub's refresher (`refresh`), which wakes the
    long-polls of the nodes whose state moved."""

    def __init__(self, hub: AgentHub, db):
        self.hub = hub
        self._db = db
        self._lock = threading.Lock()
        self._generation: int | None = None
        self._read_at = 0.0
        self._nodes: dict[str, tuple[tuple, str, list[dict]]] = {}   # node -> (objects, digest, as JSON)
        self._desired = Desired()                             # kept from one read to the next
        self._numbered: dict[str, tuple[str, int]] = {}      # node -> (digest, its revision in the store)
        self._reader = StoreReader()
        # made now, not at the first agent's call: adding an engine's event listeners while other
        # threads commit on it breaks their commits (SQLAlchemy iterates the listeners unlocked)
        self._changes = TableChanges(db.engine)
        self._written_last: set = set()
        self._whole_at = 0.0
        self._flushes_asked = 0
        self._moved: set[str] = set()                        # nodes whose state moved since `refresh` last said
        hub.follow(self.refresh, self.holdoff)

    def stale(self) -> bool:
        return self._generation != self.hub.generation or time.monotonic() - self._read_at > RECHECK

    def holdoff(self) -> float:
        """Seconds to wait before recomputing (a burst of writes is read once per COALESCE; a
        datapath flush the controller asks for is served at once: a router waits for it)."""
        if self._flushes_asked != self.hub.flushes_asked:
            return 0.0
        return max(0.0, self._read_at + COALESCE - time.monotonic()) if self.stale() else 0.0

    def get(self, node: str) -> tuple[int, list[dict]]:
        """(revision, objects) of `node`'s desired state (NotFound for an unknown node). Blocking:
        run it in the thread pool."""
        with self._lock:
            self._follow()
            entry = self._nodes.get(node)
            if entry is None:
                raise NotFound(f"node {node[:64]!r} does not exist")
            _, d, objects = entry
            known = self._numbered.get(node)
            if known is None or known[0] != d:
                revision = self._db.write(lambda s: _numbered(s, node, d), notify=False)
                known = self._numbered[node] = (d, revision)
            return known[1], objects

    def refresh(self) -> set[str]:
        """The nodes whose desired state moved since the last call (worked out again if stale)."""
        with self._lock:
            self._follow()
            moved, self._moved = self._moved, set()
            return moved

    def _follow(self) -> None:
        """Under the lock: work the desired state out again if the store changed since."""
        if not self.stale():
            return
        generation, self._flushes_asked = self.hub.generation, self.hub.flushes_asked
        nodes = self._db.read(self._compute)
        for n, flush in self.hub.flushes.items():
            if n in nodes:
                nodes[n] = [*nodes[n], flush]
        before, self._nodes = self._nodes, self._entries(nodes)
        self._moved |= {n for n, entry in self._nodes.items() if before.get(n) is not entry} | (set(before) - set(self._nodes))
        self._generation, self._read_at = generation, time.monotonic()

    def _entries(self, nodes: dict[str, list]) -> dict[str, tuple[tuple, str, list[dict]]]:
        """Each node's (objects, digest, JSON): the last read's where its objects are the same, and
        the JSON of an object the last read held (the same object: fathom.model.hostlocal_desired.Desired
        keeps those that did not change) taken from it, so a read costs what changed, not every
        node's digest and encoding afresh."""
        known = {id(o): j for objects, _, jsons in self._nodes.values() for o, j in zip(objects, jsons)}
        out = {}
        for n, objects in nodes.items():
            objects = tuple(objects)
            last = self._nodes.get(n)
            if last is not None and last[0] == objects:
                out[n] = last
                continue
            jsons = [known.get(id(o)) or to_json(o) for o in objects]
            out[n] = (objects, digest_json(jsons), jsons)
        return out

    def _compute(self, session) -> dict[str, list]:
        taken = self._changes.take()
        # the first read is whole: what was written before it need not be read again by the next
        first = self._whole_at == 0.0
        whole = time.monotonic() - self._whole_at > RECHECK
        written = None if whole else taken | self._written_last
        self._written_last = set() if first else taken
        if whole:
            self._whole_at = time.monotonic()
        return self._desired(self._reader.read(session, None, written), ag.attachments(session))


def _may(who: Identity, node: str, write: bool) -> None:
    if "agent" in who.roles and who.node == node:
        return
    if "admin" in who.roles and not write:
        return
    raise Forbidden(f"only node {node[:64]!r}'s agent token may " + ("report for it" if write else
                                                                       "read its desired state"))


def _numbered(session, node: str, d: str) -> int:
    """The revision of `node`'s desired state of digest `d` (fathom.store.agents.number_desired):
    a write the reconciler and the readers of written tables need not read again (the revision
    is no part of the model, and this cache made it)."""
    session.connection(execution_options={"model_unchanged": True})
    return ag.number_desired(session, node, d)


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
    objects: list[dict] = Field(description="the revision's objects; none when a trace or capture request woke a "
                                            "long-poll whose `after` is this revision (the agent holds them)")
    report_interval_s: float = REPORT_INTERVAL
    traces: list[dict] = Field(default_factory=list,
                               description="trace requests for the agent to answer (fathom.api.agent_traces)")
    captures: list[dict] = Field(default_factory=list,
                                 description="capture requests for the agent to answer (fathom.api.agent_captures)")


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
async def desired(node: NodeName, request: Request, who: Identity = Depends(identity),
                  after: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
                  timeout: Annotated[float, Query(ge=0, le=MAX_WAIT)] = 0.0,
                  keepalive: Annotated[float | None, Query(ge=KEEPALIVE_MIN, le=KEEPALIVE_MAX, description=(
                      "a long-poll still waiting after this many seconds is answered 200 at once and its "
                      "body sent later: a space every `keepalive` seconds until the JSON (the "
                      f"`{KEEPALIVE_HEADER}` header says so), so the agent tells a replica that stopped "
                      "from one that has nothing new"))] = None):
    _may(who, node, write=False)
    hub: AgentHub = request.app.state.agent_hub
    deadline = time.monotonic() + min(timeout, request.app.state.agent_max_wait)
    agent = "agent" in who.roles        # the node's agent itself (an admin reading it is no heartbeat)
    poll = _LongPoll(request, node, agent, after, deadline)
    if agent:
        hub.hold(node)

    def done():
        poll.close()
        if agent:
            hub.release(node)
    streamed = False
    try:
        out = await poll.answer(None if keepalive is None else time.monotonic() + keepalive)
        if keepalive is None:
            return out
        # the header on an answer at once too: the agent learns that this controller sends spaces
        said = {KEEPALIVE_HEADER: f"{keepalive:g}"}
        if out is not None:
            return Response(out.model_dump_json().encode(), media_type="application/json", headers=said)
        streamed = True
        return _Streamed(poll.spaced(keepalive), done, media_type="application/json", headers=said)
    finally:
        if not streamed:
            done()


class _Streamed(StreamingResponse):
    """A streamed answer that calls `done()` once sent, or once it failed or was cancelled, whether
    or not its body was ever started."""

    def __init__(self, content, done, **kwargs):
        super().__init__(content, **kwargs)
        self._done = done

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._done()


class _LongPoll:
    """One long-poll of a node's desired state: answered when its revision moves past `after`, a
    trace or capture request for the node arrives (the agent's own poll), the client goes, the
    controller stops, or `deadline` (monotonic) passes."""

    def __init__(self, request: Request, node: str, agent: bool, after: int | None, deadline: float):
        self.node, self.agent, self.after, self.deadline = node, agent, after, deadline
        self.hub: AgentHub = request.app.state.agent_hub
        self.cache: DesiredCache = request.app.state.agent_desired
        self.desks = (request.app.state.trace_desk, request.app.state.capture_desk)
        self.asked: list = [None, None]
        self.gone = asyncio.ensure_future(_hung_up(request))

    async def answer(self, until: float | None) -> DesiredOut | None:
        """The answer, or None if there is none yet at `until` (monotonic; None: the deadline)."""
        while True:
            await asyncio.sleep(self.cache.holdoff())
            seen = self.hub.refreshes
            revision, objects = await run_in_threadpool(self.cache.get, self.node)
            now = time.monotonic()
            left = self.deadline - now
            # trace and capture requests go to the agent only
            traces, captures = [desk.take(self.node) for desk in self.desks] if self.agent else ([], [])
            if (traces or captures or self.after is None or revision != self.after or left <= 0 or self.gone.done()
                    or self.hub.closing):
                # woken for requests only: the agent holds this revision's objects already
                same = (traces or captures) and revision == self.after
                return DesiredOut(node=self.node, revision=revision, objects=[] if same else objects,
                                  traces=traces, captures=captures)
            if until is not None and now >= until:
                return None
            if self.agent:    # a request on a desk wakes the agent's long-poll too
                self.asked = [a if a is not None and not a.done() else asyncio.ensure_future(desk.arrival(self.node))
                              for a, desk in zip(self.asked, self.desks)]
            wait = left if until is None else min(left, until - now)
            await self.hub.wait(self.node, wait, seen, self.gone, *(a for a in self.asked if a is not None))

    def spaced(self, keepalive: float):
        """The streamed body: a space every `keepalive` seconds, then the answer's JSON (or, should
        the node go meanwhile, its error's). The response watches the connection from now on (a
        client that goes ends it), not this poll."""
        self.gone.cancel()
        self.gone = asyncio.get_running_loop().create_future()

        async def body():
            while True:
                yield b" "
                try:
                    out = await self.answer(time.monotonic() + keepalive)
                except StoreError as e:
                    yield json.dumps({"detail": [{"loc": [], "msg": str(e), "type": type(e).__name__}]}).encode()
                    return
                if out is not None:
                    yield out.model_dump_json().encode()
                    return
        return body()

    def close(self) -> None:
        for a in self.asked:
            if a is not None:
                a.cancel()
        self.gone.cancel()


async def _hung_up(request: Request) -> None:
    """Returns when the client closes its connection (the agent stopped or died)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _object(status: ObjectStatus) -> dict:
    """As stored: counters only where the agent gave some."""
    return status.model_dump(exclude={"counters"} if status.counters is None else None)


@router.post("/{node}/report", status_code=204, summary="The agent's facts and the status of what it holds")
def report(node: NodeName, body: Report, request: Request, db: StoreDep, who: Identity = Depends(identity)):
    _may(who, node, write=True)
    request.app.state.agent_hub.heard(node)
    news = db.write(lambda s: ag.record_report(s, node, agent_started=body.agent_started,
                                                applied_revision=body.applied_revision,
                                                facts=body.facts.model_dump(mode="json"),
                                                objects={k: _object(v) for k, v in body.objects.items()}),
                    notify=False)
    if news and db.on_change:   # the reconciler reads it (statuses, new router ports); heartbeats wake nothing
        db.on_change()


def agent_out(view: ag.AgentView | None, node: str, now: float, hub: AgentHub) -> AgentOut:
    """`reported_at`: when the agent was last heard (its last report, or its long-poll)."""
    if view is not None:
        view = ag.heard(view, hub.last_heard(node))
    if view is None or view.reported_at is None:
        return AgentOut(node=node, state="never reported", revision=view.revision if view else 0,
                        applied_revision=None, reported_at=None, agent_started=None, facts={}, objects={})
    return AgentOut(node=node, state="up" if now - view.reported_at <= STALE_AFTER else "down",
                    revision=view.revision, applied_revision=view.applied_revision, reported_at=view.reported_at,
                    agent_started=view.agent_started, facts=view.facts, objects=view.objects)


@router.get("", response_model=list[AgentOut], summary="Every node's agent: up or down, facts, object statuses")
def list_agents(request: Request, db: StoreDep, who: Identity = Depends(identity)):
    if "admin" not in who.roles:
        raise Forbidden("only an admin can see the agents")

    hub: AgentHub = request.app.state.agent_hub

    def fn(s):
        views = ag.agents(s)
        now = time.time()
        return [agent_out(views.get(n), n, now, hub) for n in s.scalars(select(m.Node.name).order_by(m.Node.id))]
    return db.read(fn)


@router.get("/{node}", response_model=AgentOut, summary="One node's agent")
def show_agent(node: NodeName, request: Request, db: StoreDep, who: Identity = Depends(identity)):
    _may(who, node, write=False)
    return db.read(lambda s: agent_out(ag.agent_of(s, node), node, time.time(), request.app.state.agent_hub))
