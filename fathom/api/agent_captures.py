"""Captures of what a tap policy's monitor port receives, made by the monitor's node agent:
`POST /v1/taps/{id}/capture` answers a pcap file (application/vnd.tcpdump.pcap; docs/vtap.md).

The controller never runs a command on a host: it puts a capture request on a desk (the trace
requests' desk, fathom.api.agent_traces), the node's agent gets it with the answer to its
desired-state long-poll, runs tcpdump on the monitor port's interface on br-int for at most the
asked seconds, packets and bytes (fathom.agent.capture) and posts the pcap back
(`POST /v1/agents/{node}/captures/{id}`, the node's agent token only). Nothing is stored.

Bounded: at most MAX_SECONDS seconds and MAX_BYTES bytes of pcap (whole records) per capture,
MAX_PENDING requests per node, MAX_RUNNING captures at once on the controller (429 beyond: each
holds a worker thread while its agent captures). Who may: an admin, or a member of the policy's
project (a capture shows what the policy copies, which its project may read).
"""
from __future__ import annotations

import base64
import binascii
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from fathom.api.agent_traces import TooManyTraces, TraceDesk
from fathom.api.auth import identity
from fathom.api.deps import ERRORS, CallerDep, ErrorOut, StoreDep
from fathom.api.schemas import NODE_NAME_RE
from fathom.auth import Identity
from fathom.store import models as m
from fathom.store.agents import STALE_AFTER
from fathom.store.errors import Conflict, Forbidden, Invalid, NotFound
from fathom.store.taps import get_tap

MAX_SECONDS = 30.0
MAX_BYTES = 512 * 1024          # of pcap per capture (base64 in the agent's answer stays under the API's 1 MiB body)
MAX_PENDING = 2                 # capture requests per node not answered yet
MAX_RUNNING = 4                 # captures waiting on the controller at once
ANSWER_GRACE = 10.0             # seconds an agent has beyond the capture's own to start tcpdump and post the file
PCAP = "application/vnd.tcpdump.pcap"
# the magic numbers a pcap file starts with: micro- and nanosecond, either byte order
PCAP_MAGIC = {bytes.fromhex(h) for h in ("a1b2c3d4", "d4c3b2a1", "a1b23c4d", "4d3cb2a1")}


@dataclass(eq=False)
class CaptureAsk:
    id: int
    node: str
    interface: str
    seconds: float
    max_bytes: int
    count: int | None
    handed: bool = False
    output: bytes | None = None     # the pcap file
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def to_json(self) -> dict:
        return {"id": self.id, "interface": self.interface, "seconds": self.seconds, "max_bytes": self.max_bytes,
                "count": self.count}


class CaptureDesk(TraceDesk):
    """The capture requests not answered yet (the trace desk's bookkeeping: ids, waiting long-polls)."""
    max_pending = MAX_PENDING

    def ask(self, node: str, interface: str, seconds: float, max_bytes: int, count: int | None) -> CaptureAsk:
        return self._put(node, lambda ask_id: CaptureAsk(ask_id, node, interface, seconds, max_bytes, count))


class CaptureCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: float = Field(default=5.0, gt=0, le=MAX_SECONDS, description="capture for at most this long")
    count: int | None = Field(default=None, ge=1, le=1_000_000, description="stop after this many packets")
    max_bytes: int = Field(default=MAX_BYTES, ge=1024, le=MAX_BYTES, description="at most this many bytes of pcap")
    monitor: Literal["monitor", "monitor2"] = Field(default="monitor", description="which of the policy's monitors")


class CaptureAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pcap: str | None = Field(default=None, max_length=(MAX_BYTES + 2) // 3 * 4, description="the pcap file, base64")
    error: str | None = Field(default=None, max_length=2048, description="why the agent could not capture")


def _monitor(s, c, tap_id: int, which: str) -> tuple[str, str]:
    """(node, interface) of the policy's monitor port, for a caller who may read the policy."""
    t = get_tap(s, c, tap_id)
    port_id = t.monitor_port_id if which == "monitor" else (t.monitor2_port_id if t.has_monitor2 else None)
    port = s.get(m.Port, port_id) if port_id is not None else None
    if port is None:
        raise Invalid(f"tap policy {tap_id} has no {which} port", which)
    if port.node is None or not port.interface_name:
        raise Conflict(f"the {which} port {port.name or port.id} is not plugged on a node", which)
    return port.node.name, port.interface_name


router = APIRouter(tags=["taps"], responses=ERRORS)
_running = threading.BoundedSemaphore(MAX_RUNNING)


@router.post("/taps/{tap_id}/capture", response_class=Response,
              responses={200: {"content": {PCAP: {}}, "description": "the pcap file"}, 429: {"model": ErrorOut}},
              summary="A pcap of what the policy's monitor port receives now, captured by its node's agent")
def capture(tap_id: int, body: CaptureCreate, c: CallerDep, db: StoreDep, request: Request):
    node, interface = db.read(lambda s: _monitor(s, c, tap_id, body.monitor))
    heard = request.app.state.agent_hub.last_heard(node)
    if heard is None or time.time() - heard > STALE_AFTER:
        raise Conflict(f"node {node}'s agent is not connected: it makes the capture", body.monitor)
    if not _running.acquire(blocking=False):
        raise HTTPException(429, detail=[{"loc": [], "msg": f"{MAX_RUNNING} captures are running: retry later",
                                          "type": "busy"}], headers={"Retry-After": "5"})
    desk: CaptureDesk = request.app.state.capture_desk
    try:
        try:
            ask = desk.ask(node, interface, body.seconds, body.max_bytes, body.count)
        except TooManyTraces as e:
            raise HTTPException(429, detail=[{"loc": [], "msg": str(e), "type": "busy"}],
                                headers={"Retry-After": "5"}) from None
        if not desk.wait(ask, body.seconds + ANSWER_GRACE):
            raise Conflict(f"node {node}'s agent did not answer within {body.seconds + ANSWER_GRACE:g} s")
    finally:
        _running.release()
    if ask.error is not None or ask.output is None:
        raise Conflict(f"node {node}'s agent could not capture: {ask.error or 'no file'}")
    return Response(ask.output, media_type=PCAP,
                    headers={"Content-Disposition": f'attachment; filename="tap-{tap_id}.pcap"',
                             "Cache-Control": "no-store"})


@router.post("/agents/{node}/captures/{ask_id}", status_code=204, tags=["agents"],
             summary="An agent's answer to a capture request")
def answer_capture(node: Annotated[str, Field(pattern=NODE_NAME_RE)],
                   ask_id: Annotated[int, Field(ge=1, le=2**62)], body: CaptureAnswer, request: Request,
                   who: Identity = Depends(identity)):
    if "agent" not in who.roles or who.node != node:
        raise Forbidden(f"only node {node[:64]!r}'s agent token may answer its capture requests")
    pcap = None
    if body.pcap is not None:
        try:
            pcap = base64.b64decode(body.pcap, validate=True)
        except binascii.Error:
            raise Invalid("not base64", "pcap") from None
        if len(pcap) > MAX_BYTES or pcap[:4] not in PCAP_MAGIC or len(pcap) < 24:
            raise Invalid(f"not a pcap file of at most {MAX_BYTES} bytes", "pcap")
    if not request.app.state.capture_desk.answer(node, ask_id, pcap, body.error):
        raise NotFound(f"no capture request {ask_id} of node {node[:64]!r} waits for an answer (it timed out?)")
