"""REST API of vTAP policies: /v1/taps (create, list, show, update, delete).

Identifiers (sender, receiver, monitor, monitor2) are a port id, a port name, {"port": id|name}
or {"mac": "...", "ip": "..."}; the sender or the receiver may be "*" (anyone: what the receiver
port receives, or what the sender port sends). Filters: ip_proto, vlan, tp_src, tp_dst (a port or a range
"1000-2000") and `match` (further OpenFlow 1.3 fields by name); absent, null or "*" = wildcard.
Counters and per-node state are runtime facts: fathom/api/runtime.py serves them (read by
fathom/controller/taps.py). A policy's status is the one stored: the controller's, or what the store
alone tells at once when a port it names is deleted or unbound (fathom.store.taps.judge).
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Sequence

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import selectinload

from fathom.addresses import parse_ipv4, parse_mac
from fathom.api.deps import ERRORS, CallerDep, Limit, Marker, StoreDep, Wait, WaitTimeout, shown, utc
from fathom.api.schemas import EXTERNAL_ID
from fathom.model import taps as vtap
from fathom.store import models as m
from fathom.store import taps as ops
from fathom.store.errors import Invalid
from fathom.store.ops import MAX_LIMIT, list_objects

Wild = int | str | None


class TapCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    external_id: str | None = EXTERNAL_ID
    name: str = Field(default="", max_length=255)
    sender: Any = None
    receiver: Any = None
    monitor: Any = None
    monitor2: Any = None
    direction: Literal["forward", "both"] = "forward"
    priority: int = Field(default=100, ge=0, le=vtap.MAX_PRIORITY)
    ip_proto: Wild = None
    vlan: Wild = None
    tp_src: Wild = None
    tp_dst: Wild = None
    match: dict[str, Any] = Field(default_factory=dict)
    truncate: int | None = Field(default=None, description="copies keep at most this many bytes (64..65535)")
    rate_pps: int | None = Field(default=None, description="copies are metered to at most this many packets/s")
    project_id: str | None = Field(default=None, min_length=1, max_length=64)


class TapUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(default=None, max_length=255)
    sender: Any = None
    receiver: Any = None
    monitor: Any = None
    monitor2: Any = None
    direction: Literal["forward", "both"] | None = None
    priority: int | None = Field(default=None, ge=0, le=vtap.MAX_PRIORITY)
    ip_proto: Wild = None
    vlan: Wild = None
    tp_src: Wild = None
    tp_dst: Wild = None
    match: dict[str, Any] | None = None
    truncate: int | None = Field(default=None, description="null or 0 removes truncation")
    rate_pps: int | None = Field(default=None, description="null or 0 removes the rate limit")


class EndpointOut(BaseModel):
    port_id: int | None
    port_name: str | None = None
    mac: str | None
    ip: str | None
    node: str | None = None


class TapOut(BaseModel):
    id: int
    external_id: str | None = None
    name: str
    project_id: str
    sender: EndpointOut
    receiver: EndpointOut
    monitor: EndpointOut
    monitor2: EndpointOut | None
    direction: str
    priority: int
    filters: dict[str, Any]
    truncate: int | None
    rate_pps: int | None
    markers: list[int]          # tunnel VNIs of this policy's copies (per direction and monitor)
    status: str
    status_reason: str | None
    created_at: datetime


def parse_ref(value, field: str):
    """An identifier from the request: int/str (port id or name) or {"port"} / {"mac", "ip"}."""
    if isinstance(value, bool):
        raise Invalid("give a port id, a port name or {mac, ip}", field)
    if value == vtap.ANY and field in ("sender", "receiver"):
        return value        # anyone: everything the sender sends, or everything the receiver receives
    if isinstance(value, (int, str)):
        if isinstance(value, str) and not value.strip():
            raise Invalid("give a port id, a port name or {mac, ip}", field)
        return value
    if isinstance(value, dict):
        if set(value) == {"port"}:
            return parse_ref(value["port"], f"{field}.port")
        extra = set(value) - {"mac", "ip"}
        if extra:
            raise Invalid(f"unknown key(s) {', '.join(sorted(extra))}: give port, or mac and ip", field)
        if "mac" not in value or "ip" not in value:
            raise Invalid("give both mac and ip (or a port)", field)
        try:
            mac = parse_mac(value["mac"])
        except ValueError as e:
            raise Invalid(str(e), f"{field}.mac") from None
        try:
            ip = parse_ipv4(value["ip"])
        except ValueError as e:
            raise Invalid(str(e), f"{field}.ip") from None
        return {"mac": mac, "ip": ip}
    raise Invalid("give a port id, a port name or {mac, ip}", field)


def tap_ports(session, taps: Sequence[m.TapPolicy]) -> dict[int, m.Port]:
    """The ports the policies name, by id, with the addresses and node _endpoint reads of them: read
    for all of `taps` in a fixed number of statements however many policies there are."""
    ids = {i for t in taps for i in (t.sender_port_id, t.receiver_port_id, t.monitor_port_id, t.monitor2_port_id)
           if i is not None}
    return {p.id: p for p in session.scalars(select(m.Port).options(
        selectinload(m.Port.fixed_ips), selectinload(m.Port.node)).where(m.Port.id.in_(ids)))}


def _endpoint(ports: dict[int, m.Port], port_id: int | None, mac=None, ip=None) -> EndpointOut:
    port = ports.get(port_id)
    if port is None:
        return EndpointOut(port_id=port_id, mac=mac, ip=ip)
    return EndpointOut(port_id=port.id, port_name=port.name, mac=port.mac_address,
                       ip=port.fixed_ips[0].ip_address if port.fixed_ips else None,
                       node=port.node.name if port.node else None)


def tap_out(session, t: m.TapPolicy, ports: dict[int, m.Port] | None = None) -> TapOut:
    """`ports`: what tap_ports read for the policy, when the caller read it already (a list of policies)."""
    if ports is None:
        ports = tap_ports(session, [t])
    directions = (0, 1) if t.direction == "both" else (0,)
    monitors = (0, 1) if t.has_monitor2 else (0,)
    markers = [vtap.marker(t.id, d, i) for d in directions for i in monitors] if t.id <= vtap.MAX_POLICY_ID else []
    return TapOut(
        id=t.id, name=t.name, project_id=t.project_id,
        sender=(_endpoint(ports, t.sender_port_id) if t.sender_is_port
                else EndpointOut(port_id=None, mac=vtap.ANY, ip=vtap.ANY)),
        receiver=(_endpoint(ports, t.receiver_port_id) if t.receiver_is_port and t.receiver_port_id
                  else EndpointOut(port_id=None, mac=t.receiver_mac, ip=t.receiver_ip)),
        external_id=t.external_id,
        monitor=_endpoint(ports, t.monitor_port_id),
        monitor2=_endpoint(ports, t.monitor2_port_id) if t.has_monitor2 else None,
        direction=t.direction, priority=t.priority, filters=dict(t.filters or {}), truncate=t.truncate,
        rate_pps=t.rate_pps,
        markers=markers,
        status=t.status, status_reason=t.status_reason,
        created_at=utc(t.created_at))


def _body(model: BaseModel, given_only: bool) -> dict:
    data = {k: getattr(model, k) for k in (model.model_fields_set if given_only else type(model).model_fields)}
    for role in ops.ROLES:
        if data.get(role) is not None:
            data[role] = parse_ref(data[role], role)
    return data


router = APIRouter(prefix="/taps", tags=["taps"], responses=ERRORS)


@router.get("", response_model=list[TapOut])
def list_taps(c: CallerDep, db: StoreDep, name: str | None = None, external_id: str | None = None,
              limit: Limit = MAX_LIMIT, marker: Marker = None):
    def run(s):
        taps = list_objects(s, c, m.TapPolicy, name=name, external_id=external_id, limit=limit, marker=marker)
        ports = tap_ports(s, taps)
        return [tap_out(s, t, ports) for t in taps]
    return db.read(run)


@router.post("", response_model=TapOut, status_code=201)
def create_tap(body: TapCreate, c: CallerDep, db: StoreDep):
    data = _body(body, given_only=False)
    return db.write(lambda s: tap_out(s, ops.create_tap(s, c, data)))


@router.get("/{tap_id}", response_model=TapOut)
async def show_tap(tap_id: int, c: CallerDep, db: StoreDep, request: Request, wait: Wait = None,
                   timeout: WaitTimeout = 10.0):
    def run(s):
        t = ops.get_tap(s, c, tap_id)
        return tap_out(s, t)
    return await shown(request, lambda: db.read(run), ("tap_policy",), tap_id, wait, timeout)


@router.patch("/{tap_id}", response_model=TapOut)
def update_tap(tap_id: int, body: TapUpdate, c: CallerDep, db: StoreDep):
    data = _body(body, given_only=True)
    return db.write(lambda s: tap_out(s, ops.update_tap(s, c, tap_id, data)))


@router.delete("/{tap_id}", status_code=204)
def delete_tap(tap_id: int, c: CallerDep, db: StoreDep):
    db.write(lambda s: ops.delete_tap(s, c, tap_id))
    return Response(status_code=204)
