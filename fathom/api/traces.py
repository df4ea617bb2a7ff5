"""/v1/traces: a simulated trace of one packet from a port (fathom.trace; docs/trace.md).

`POST /v1/traces` with the source port, the destination (an IPv4 address or a port) and the
packet's protocol and ports answers the trace at once (nothing is stored, nothing is sent to a
switch). It walks the desired state the controller compiled last, so it is served by the controller
process: `traces_router(model)` takes a function returning (the model with its runtime facts, the
desired state of every switch).

Who may: a member traces from a port of their project only, to an address or to a port they may
see; another project's port is as absent as a missing one (404); objects of other projects that a
trace meets are not named. An admin traces anywhere.
"""
from __future__ import annotations

import ipaddress
from typing import Callable, Literal, Mapping

from fastapi import APIRouter
from pydantic import Field, model_validator

from fathom.api.deps import ERRORS, CallerDep
from fathom.api.schemas import _Request
from fathom.model import Snapshot
from fathom.model.views import ports_by_id
from fathom.store.errors import Conflict, Invalid, NotFound
from fathom.trace import TraceError, trace

PORT = Field(default=None, ge=1, le=65535)


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

    @model_validator(mode="after")
    def _one_destination(self):
        if (self.to_ip is None) == (self.to_port_id is None):
            raise ValueError("give exactly one of to_ip and to_port_id")
        if self.proto == "icmp" and (self.sport is not None or self.dport is not None):
            raise ValueError("icmp has no ports")
        if self.proto != "icmp" and self.dport is None:
            raise ValueError(f"{self.proto} needs dport")
        return self


Model = Callable[[], tuple[Snapshot | None, Mapping]]


def traces_router(model: Model) -> APIRouter:
    router = APIRouter(prefix="/v1/traces", tags=["traces"], responses=ERRORS)

    @router.post("", summary="Simulate one packet from a port through the desired pipelines")
    def create_trace(body: TraceCreate, c: CallerDep) -> dict:
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
        try:
            return trace(snapshot, states, source, to, body.proto, body.sport, body.dport, body.ct_state, body.ttl,
                         visible)
        except TraceError as e:
            raise Invalid(str(e)) from None

    return router
