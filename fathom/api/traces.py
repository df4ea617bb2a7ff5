"""/v1/traces: the trace of one packet from a port (fathom.trace; docs/trace.md).

`POST /v1/traces` with the source port, the destination (an IPv4 address or a port) and the
packet's protocol and ports answers the trace at once (nothing is stored). It walks the desired
state the controller compiled last, so it is served by the controller process:
`traces_router(model)` takes a function returning (the model with its runtime facts, the desired
state of every switch). With `actual`, each node's bridges are traced through their own tables by
the node's agent (`ovs-appctl ofproto/trace`, asked through fathom.api.agent_traces) within
`timeout` seconds in all; a hop whose agent is down or does not answer in time is named, with why,
and the trace answers with what it has. At most MAX_ACTUAL such traces run at once (429 beyond).
With `live`, a marked ICMP echo (or TCP SYN) is injected at the source port by its node's agent and seen in
the kernel at each hop (fathom.trace.live); the result holds its verdict and times besides the
walk through each switch's own tables. Only MAX_LIVE live traces run at once (429 beyond); one
to an address that neither a port owns nor lies beyond the cloud's uplinks, larger than the
network's MTU, or that the source VM would not send is refused (422) before anything is injected.
`?format=svg` (or `Accept: image/svg+xml`) answers the path as a picture (fathom.trace.svg).

Who may: a member traces from a port of their project only, to an address or to a port they may
see; another project's port is as absent as a missing one (404); objects of other projects that a
trace meets are not named. An admin traces anywhere.
"""
from __future__ import annotations

import ipaddress
import threading
import time
from typing import Callable, Literal, Mapping

from fastapi import APIRouter, HTTPException, Query, Request, Response
from pydantic import Field, model_validator

from fathom.api.agent_traces import TooManyTraces, TraceAnswer
from fathom.api.deps import ERRORS, CallerDep
from fathom.api.schemas import ErrorOut, _Request
from fathom.auth import tokens
from fathom.model import Snapshot
from fathom.model.hostlocal_desired import network_mtu
from fathom.model.views import ports_by_id
from fathom.store.agents import STALE_AFTER
from fathom.store.errors import Conflict, Invalid, NotFound
from fathom.trace import TraceError, Unanswered, live, svg, trace
from fathom.trace.probe import MIN_SIZE
from fathom.trace.walk import destination

PORT = Field(default=None, ge=1, le=65535)
MAX_ACTUAL = 4          # traces of actual tables at once (each holds a worker thread while the agents answer)
MAX_LIVE = 1            # live traces at once (each holds a worker thread while the agents answer)
SVG = "image/svg+xml"
LIVE = {False: "live (a marked probe injected at the source port; stages from each node's tables, traced by its agent)",
        True: "live (a marked probe injected at the source port; stages from the desired state)"}
STAGES_FROM = {False: "actual", True: "desired"}      # where a live trace's hops came from: the verdict of that walk


class TraceCreate(_Request):
    port_id: int = Field(ge=1, le=2 ** 31 - 1, description="the source port")
    to_ip: ipaddress.IPv4Address | None = Field(default=None, description="the destination address")
    to_port_id: int | None = Field(default=None, ge=1, le=2 ** 31 - 1,
                                   description="or the destination port (its first IPv4 address)")
    proto: Literal["icmp", "tcp", "udp"] = "icmp"
    sport: int | None = PORT
    dport: int | None = PORT
    ct_state: Literal["new", "established"] = Field(
        default="new", description="the conntrack state every ct lookup is assumed to find")
    ttl: int = Field(default=64, ge=1, le=255)
    actual: bool = Field(default=False, description="trace each node's own tables (by its agent's ofproto/trace)")
    live: bool = Field(default=False, description="inject a marked ICMP echo (proto tcp: a TCP SYN) at the source port "
                                                   "and follow it, with kernel timestamps at each hop; the stages are "
                                                   "the desired state's, each node's own (ofproto/trace) with actual or "
                                                   "when the probe did not arrive")
    size: int = Field(default=84, ge=MIN_SIZE, le=9216, description="with live: bytes of the probe's IP packet "
                                                                     "(at most the network's MTU)")
    timeout: float = Field(default=5.0, ge=0.5, le=20.0,
                           description="with actual or live: seconds the agents have to answer, in all")

    @model_validator(mode="after")
    def _one_destination(self):
        if (self.to_ip is None) == (self.to_port_id is None):
            raise ValueError("give exactly one of to_ip and to_port_id")
        if self.proto == "icmp" and (self.sport is not None or self.dport is not None):
            raise ValueError("icmp has no ports")
        if self.proto != "icmp" and self.dport is None:
            raise ValueError(f"{self.proto} needs dport")
        if self.live and self.proto == "udp":
            raise ValueError("a live trace sends an ICMP echo or a TCP SYN: proto icmp or tcp")
        if self.live and self.proto == "tcp" and "size" in self.model_fields_set:
            raise ValueError("a live TCP probe is a bare SYN (40 bytes): size is the echo's")
        return self


Model = Callable[[], tuple[Snapshot | None, Mapping]]


def traces_router(model: Model) -> APIRouter:
    router = APIRouter(prefix="/v1/traces", tags=["traces"], responses=ERRORS)
    running = threading.BoundedSemaphore(MAX_ACTUAL)
    running_live = threading.BoundedSemaphore(MAX_LIVE)

    @router.post("", summary="Trace one packet from a port through the pipelines (desired, or each switch's own)",
                 responses={200: {"content": {SVG: {}}}, 429: {"model": ErrorOut}})
    def create_trace(body: TraceCreate, c: CallerDep, request: Request,
                     format: Literal["json", "svg"] | None = Query(default=None, description="svg: the path drawn")):
        result = _trace(body, c, request)
        if format == "svg" or (format is None and SVG in request.headers.get("accept", "")):
            return Response(svg.render(result), media_type=SVG)
        return result

    def _trace(body: TraceCreate, c, request: Request) -> dict:
        snapshot, states = model()
        if snapshot is None:
            raise Conflict("the controller has not compiled the model yet: try again in a moment")

        def visible(project: str) -> bool:
            return c.admin or project == c.project

        ports = ports_by_id(snapshot)

        def port(port_id: int, field: str):
            p = ports.get(port_id)
            if p is None or not visible(p.project_id):
                raise NotFound(f"port {port_id} does not exist (or is not compiled yet)", field)
            return p

        source = port(body.port_id, "port_id")
        if body.to_port_id is not None:
            dst = port(body.to_port_id, "to_port_id")
            to = next((f.ip_address for f in dst.fixed_ips if ipaddress.ip_address(f.ip_address).version == 4), None)
            if to is None:
                raise Invalid(f"port {dst.id} has no IPv4 address", "to_port_id")
        else:
            to = str(body.to_ip)
        if body.live:
            return _live(snapshot, states, source, to, body, visible, request, running_live)
        if not body.actual:
            try:
                return trace(snapshot, states, source, to, body.proto, body.sport, body.dport, body.ct_state,
                             body.ttl, visible)
            except TraceError as e:
                raise Invalid(str(e)) from None
        _acquire(running, f"{MAX_ACTUAL} traces of actual tables are running")
        try:
            return trace(snapshot, states, source, to, body.proto, body.sport, body.dport, body.ct_state, body.ttl,
                         visible, actual=_agents(request, body.timeout))
        except TraceError as e:
            raise Invalid(str(e)) from None
        finally:
            running.release()

    return router


def _acquire(semaphore: threading.BoundedSemaphore, busy: str) -> None:
    if not semaphore.acquire(blocking=False):
        raise HTTPException(429, detail=[{"loc": [], "msg": f"{busy}: retry in a moment", "type": "rate_limited"}],
                            headers={"Retry-After": "1"})


def _live(snapshot: Snapshot, states: Mapping, source, to: str, body: TraceCreate, visible, request: Request,
          running: threading.BoundedSemaphore) -> dict:
    """A live trace (fathom.trace.live): every check before anything is injected."""
    target = destination(snapshot, source, to)
    network = next((n for n in snapshot.networks if n.id == source.network_id), None)
    mtu = network_mtu(network.type) if network else None
    if mtu is not None and body.size > mtu:
        raise Invalid(f"a {body.size}-byte packet is larger than network {network.name or network.id}'s MTU "
                      f"({mtu}): the source VM could not send it", "size")
    try:
        sim = trace(snapshot, states, source, to, body.proto, body.sport, body.dport, body.ct_state, body.ttl, visible)
    except TraceError as e:
        raise Invalid(str(e)) from None
    leaving = live.exits(sim)
    if target is None and not leaving:
        raise Invalid(f"no port owns {to} and the packet does not leave the cloud: a live trace's probe must reach "
                      "a port or the network beyond", "to_ip")
    if sim["packet"]["eth_dst"] == "ff:ff:ff:ff:ff:ff":
        raise Invalid(f"the source VM would not send it: {sim['next_hop']}")
    down = next((lf["detail"] for lf in sim["leaves"] if lf["hop"] is None), None)
    if down is not None:
        raise Invalid(down)
    _acquire(running, f"{MAX_LIVE} live trace(s) running")
    try:
        ask = _live_agents(request, body.timeout)
        started = time.monotonic()
        tcp = (sim["packet"].get("tcp_src", 49152), body.dport) if body.proto == "tcp" else None
        found = live.run(sim, source, target, body.ttl, body.size, ask, body.timeout, tcp)
        walked = time.monotonic()
        arrived = live.verdict(found, target, sim["to"]["port"], {}, leaving)["result"] in ("delivered", "uplink")
        # each node's own tables: when asked for, or to name the stage that stopped the probe
        result = sim if arrived and not body.actual else \
            trace(snapshot, states, source, to, body.proto, body.sport, body.dport, body.ct_state, body.ttl,
                  visible, actual=_agents(request, body.timeout))
        found["timings_ms"]["stages"] = round((time.monotonic() - walked) * 1000, 1)
        found["answer_ms"] = round((time.monotonic() - started) * 1000, 1)
    except TraceError as e:
        raise Invalid(str(e)) from None
    finally:
        running.release()
    stages = {}
    for leaf in result["leaves"]:
        if leaf["result"] in ("dropped", "unknown") and leaf["hop"] is not None:
            stages.setdefault(result["hops"][leaf["hop"]]["name"], leaf["detail"])
    result[STAGES_FROM[result is sim]] = {"verdict": result["verdict"]}
    result["verdict"] = live.verdict(found, target, result["to"]["port"], stages, leaving)
    result["live"] = found
    live.annotate(result, found)
    result["assumptions"]["state"] = LIVE[result is sim]
    return result


def _live_agents(request: Request, timeout: float) -> live.Ask:
    """The `ask` of fathom.trace.live: requests put to all the nodes' agents at once, answered
    within `timeout` seconds from the first; a node whose agent polls another replica is asked
    there (`_replica_desk`), at the same time as the others."""
    desk, hub = request.app.state.trace_desk, request.app.state.agent_hub
    deadline = time.monotonic() + timeout

    def elsewhere(node: str, peer: str, req: dict, box: list) -> None:
        try:
            answer = _replica_desk(peer, request, node, {"live": req}, max(0.1, deadline - time.monotonic()))
        except Unanswered as e:
            box.append(str(e))
            return
        if answer.get("error") is not None or answer.get("live") is None:
            box.append(f"node {node}'s agent: {answer.get('error') or 'no answer'}")
        else:
            box.append(answer["live"])

    def ask(batch: dict[str, dict]) -> dict[str, dict | str]:
        out: dict[str, dict | str] = {}
        asks, forwarded = {}, []
        for node, req in batch.items():
            here, peer = hub.heard_here(node), hub.polls_elsewhere(node)
            if peer is not None and (here is None or time.time() - here > STALE_AFTER):
                box: list = []
                forwarded.append((node, box, threading.Thread(target=elsewhere, args=(node, peer, req, box),
                                                              daemon=True)))
                forwarded[-1][2].start()
                continue
            heard = hub.last_heard(node)
            if heard is None or time.time() - heard > STALE_AFTER:
                out[node] = f"node {node}'s agent is down or was never heard from"
                continue
            try:
                asks[node] = desk.ask_live(node, req)
            except TooManyTraces as e:
                out[node] = str(e)
        for node, box, t in forwarded:
            t.join(max(0.0, deadline - time.monotonic()) + 3.0)
            out[node] = box[0] if box else f"node {node}'s agent did not answer within the trace's {timeout:g} s"
        for node, a in asks.items():
            if not desk.wait(a, deadline - time.monotonic()):
                out[node] = f"node {node}'s agent did not answer within the trace's {timeout:g} s"
            elif a.error is not None or a.answer is None:
                out[node] = f"node {node}'s agent: {a.error or 'no answer'}"
            else:
                out[node] = a.answer
        return out
    return ask


def _agents(request: Request, timeout: float):
    """The `actual` of fathom.trace.trace: each node's agent traces its bridge (fathom.api.agent_traces),
    all within `timeout` seconds from now."""
    desk, hub = request.app.state.trace_desk, request.app.state.agent_hub
    deadline = time.monotonic() + timeout

    def actual(node: str, bridge: str, flow: str, ct_next: list) -> str:
        here = hub.heard_here(node)
        peer = hub.polls_elsewhere(node)
        if peer is not None and (here is None or time.time() - here > STALE_AFTER) and deadline > time.monotonic():
            return _ask_replica(peer, request, node, bridge, flow, ct_next, deadline - time.monotonic(), timeout)
        heard = hub.last_heard(node)
        if heard is None:
            raise Unanswered(f"node {node}'s agent has not been heard from (since the controller started)")
        if time.time() - heard > STALE_AFTER:
            raise Unanswered(f"node {node}'s agent is down (last heard {time.time() - heard:.0f} s ago)")
        left = deadline - time.monotonic()
        if left <= 0:
            raise Unanswered(f"the trace's {timeout:g} s had passed before this hop")
        try:
            ask = desk.ask(node, bridge, flow, ct_next)
        except TooManyTraces as e:
            raise Unanswered(str(e)) from None
        if not desk.wait(ask, left):
            raise Unanswered(f"node {node}'s agent did not answer within the trace's {timeout:g} s")
        if ask.error is not None or ask.output is None:
            raise Unanswered(f"node {node}'s agent could not trace: {ask.error or 'no output'}")
        return ask.output
    return actual


def _ask_replica(replica: str, request: Request, node: str, bridge: str, flow: str, ct_next: list, left: float,
                 timeout: float) -> str:
    """A hop traced by a node whose agent polls another replica of the cluster, at `replica`."""
    answer = _replica_desk(replica, request, node, {"bridge": bridge, "flow": flow, "ct_next": ct_next}, left)
    if answer.get("error") is not None or answer.get("output") is None:
        raise Unanswered(f"node {node}'s agent could not trace: {answer.get('error') or 'no output'}"
                         f" (within the trace's {timeout:g} s)")
    return answer["output"]


def _replica_desk(replica: str, request: Request, node: str, body: dict, left: float) -> dict:
    """A request to a node's agent put on the desk of `replica` (its API's address), whose desk
    the agent reads (fathom.api.agent_traces.ask_trace), answered within `left` seconds. It carries
    a token this replica issues itself for it (tokens.ReplicaToken: the node, valid for that time,
    removed after it): the caller's right to the trace was checked here, and its own token is not
    passed on. Unanswered when `replica` cannot be reached or refuses."""
    import httpx
    try:
        with tokens.ReplicaToken(request.app.state.engine, left + 5.0, node=node, name="trace hop") as secret:
            r = httpx.post(f"{replica}/v1/agents/{node}/traces", json={**body, "timeout": max(0.1, left)},
                           headers={"Authorization": f"Bearer {secret}"}, timeout=left + 2.0)
    except httpx.HTTPError as e:
        raise Unanswered(f"node {node}'s agent polls replica {replica}, which could not be reached: "
                         f"{type(e).__name__}") from None
    if r.status_code != 200:
        raise Unanswered(f"node {node}'s agent polls replica {replica}, which answered {r.status_code}")
    try:
        return TraceAnswer.model_validate(r.json()).model_dump(exclude_none=True)
    except ValueError:
        raise Unanswered(f"node {node}'s agent polls replica {replica}, which answered something else "
                         "than a trace answer") from None
