"""/v1/pptmon/attachments (admin): PPTMon eBPF programs on a node's named interfaces.

An attachment puts `ppt_in` on one interface and direction and `ppt_out` on another, in one mode
(source, transit, sink, source-sink) with a sampling period; the node's agent loads and attaches
them (fathom.agent) and delivers the sink's records. Its status is the agent's word
(fathom.controller.status): `active` once attached, `error` with the reason (the interface is
missing, the agent is down), `pending` until the agent has it.
"""
from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field, field_validator

from sqlalchemy import select

from fathom.api.deps import ERRORS, AdminDep, Limit, Marker, StoreDep, utc
from fathom.api.schemas import IFNAME_RE, NODE_NAME_RE, _Request
from fathom.store import agents as ag
from fathom.store import models as m
from fathom.store import ops
from fathom.store.agent_models import PptmonAttachment

router = APIRouter(prefix="/pptmon/attachments", tags=["pptmon"], responses=ERRORS)
CHAIN_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
Mode = Literal["source", "transit", "sink", "source-sink"]
Direction = Literal["ingress", "egress"]
MAX_PERIOD_NS = 3600 * 10**9


class AttachmentCreate(_Request):
    name: str = Field(pattern=CHAIN_RE)
    node: str = Field(pattern=NODE_NAME_RE)
    chain: str = Field(pattern=CHAIN_RE, description="the chain the records are filed under")
    vnf_id: int = Field(default=1, ge=1, le=255)
    mode: Mode = "source-sink"
    in_interface: str = Field(pattern=IFNAME_RE)
    in_direction: Direction = "ingress"
    out_interface: str = Field(pattern=IFNAME_RE)
    out_direction: Direction = "egress"
    period_ns: int = Field(default=10**9, ge=0, le=MAX_PERIOD_NS, description="0: every packet")

    @field_validator("name", "chain")
    @classmethod
    def _no_dots_only(cls, v: str) -> str:
        if set(v) <= {"."}:
            raise ValueError("a name needs a letter or digit")
        return v


class AttachmentUpdate(_Request):
    period_ns: int = Field(ge=0, le=MAX_PERIOD_NS)


class AttachmentOut(BaseModel):
    id: int
    name: str
    node: str
    chain: str
    vnf_id: int
    mode: str
    in_interface: str
    in_direction: str
    out_interface: str
    out_direction: str
    period_ns: int
    status: Literal["pending", "active", "error"]
    status_reason: str | None
    created_at: object


def out(s, a: PptmonAttachment, node: str | None = None) -> AttachmentOut:
    """`node`: the attachment's node's name, when the caller read it already (a list)."""
    return AttachmentOut(id=a.id, name=a.name, node=node or ag.node_name_of(s, a.node_id), chain=a.chain,
                         vnf_id=a.vnf_id,
                         mode=a.mode, in_interface=a.in_interface, in_direction=a.in_direction,
                         out_interface=a.out_interface, out_direction=a.out_direction, period_ns=a.period_ns,
                         status=a.status, status_reason=a.status_reason, created_at=utc(a.created_at))


@router.get("", response_model=list[AttachmentOut])
def list_attachments(c: AdminDep, db: StoreDep, name: str | None = Query(None, max_length=64),
                     limit: Limit = ops.MAX_LIMIT, marker: Marker = None):
    filters = {"name": name} if name is not None else {}

    def run(s):
        listed = ops.list_objects(s, c, PptmonAttachment, limit=limit, marker=marker, **filters)
        nodes = select(m.Node.id, m.Node.name).where(m.Node.id.in_({a.node_id for a in listed}))
        names = dict(s.execute(nodes).all())
        return [out(s, a, names.get(a.node_id)) for a in listed]
    return db.read(run)


@router.post("", response_model=AttachmentOut, status_code=201)
def create_attachment(body: AttachmentCreate, c: AdminDep, db: StoreDep):
    return db.write(lambda s: out(s, ag.create_attachment(s, c, **body.model_dump())))


@router.get("/{attachment_id}", response_model=AttachmentOut)
def show_attachment(attachment_id: int, c: AdminDep, db: StoreDep):
    return db.read(lambda s: out(s, ops.get(s, c, PptmonAttachment, attachment_id)))


@router.patch("/{attachment_id}", response_model=AttachmentOut)
def update_attachment(attachment_id: int, body: AttachmentUpdate, c: AdminDep, db: StoreDep):
    return db.write(lambda s: out(s, ag.update_attachment(s, c, attachment_id, body.period_ns)))


@router.delete("/{attachment_id}", status_code=204)
def delete_attachment(attachment_id: int, c: AdminDep, db: StoreDep):
    db.write(lambda s: ag.delete_attachment(s, c, attachment_id))
    return Response(status_code=204)
