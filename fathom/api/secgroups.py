"""REST API of security groups: /v1/security-groups and /v1/security-group-rules (Neutron semantics,
docs/security-groups.md).

A project's default group is made on first use: when it lists groups, creates one, or creates a
port without naming its groups. Rules are created and deleted, never changed. A group's status
follows the switches that hold its rules' flows.
"""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.orm import selectinload

from fathom.api.deps import ERRORS, CallerDep, Limit, Marker, StoreDep, Wait, WaitTimeout, shown, utc
from fathom.api.nodes import status_out
from fathom.api.schemas import EXTERNAL_ID, NAME, Status, StatusOut
from fathom.store import models as m
from fathom.store import secgroups as ops
from fathom.store.ops import MAX_LIMIT, list_objects

groups = APIRouter(prefix="/security-groups", tags=["security groups"], responses=ERRORS)
rules = APIRouter(prefix="/security-group-rules", tags=["security groups"], responses=ERRORS)

PROJECT = Field(default=None, min_length=1, max_length=64)
DESCRIPTION = Field(default="", max_length=255)


class GroupCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    external_id: str | None = EXTERNAL_ID
    name: str = NAME
    description: str = DESCRIPTION
    project_id: str | None = PROJECT


class GroupUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(default=None, max_length=255)
    description: str | None = Field(default=None, max_length=255)
    # the driving cloud adopts a group fathom made (the project's default group) by giving it its id
    external_id: str | None = EXTERNAL_ID


class RuleCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    external_id: str | None = EXTERNAL_ID
    security_group_id: int
    direction: Literal["ingress", "egress"]
    ethertype: Literal["IPv4", "IPv6"] = "IPv4"
    protocol: int | str | None = Field(default=None, description="tcp, udp, icmp, icmpv6, sctp, ..., a "
                                                                 "number 0..255, or null / any")
    port_range_min: int | None = Field(default=None, description="TCP/UDP/SCTP: first destination port; "
                                                                 "ICMP: type")
    port_range_max: int | None = Field(default=None, description="TCP/UDP/SCTP: last destination port; "
                                                                 "ICMP: code")
    remote_ip_prefix: str | None = Field(default=None, max_length=64)
    remote_group_id: int | None = None
    description: str = DESCRIPTION
    project_id: str | None = PROJECT

    @field_validator("protocol", mode="before")
    @classmethod
    def _protocol(cls, value):
        if isinstance(value, str) and len(value) > 32:
            raise ValueError("a protocol is a name (tcp, udp, icmp, ...) or a number 0..255")
        return value


class RuleOut(BaseModel):
    id: int
    external_id: str | None = None
    security_group_id: int
    project_id: str
    direction: str
    ethertype: str
    protocol: str | None
    port_range_min: int | None
    port_range_max: int | None
    remote_ip_prefix: str | None
    remote_group_id: int | None
    description: str
    created_at: datetime


class GroupOut(BaseModel):
    id: int
    external_id: str | None = None
    name: str
    description: str
    project_id: str
    rules: list[RuleOut]
    status: Status
    status_reason: str | None
    created_at: datetime


def rule_out(r: m.SecurityGroupRule) -> RuleOut:
    protocol = None if r.protocol is None else ops.PROTOCOL_NAMES.get(r.protocol, str(r.protocol))
    return RuleOut(id=r.id, external_id=r.external_id, security_group_id=r.group_id, project_id=r.project_id, direction=r.direction,
                   ethertype=r.ethertype, protocol=protocol, port_range_min=r.port_range_min,
                   port_range_max=r.port_range_max, remote_ip_prefix=r.remote_ip_prefix,
                   remote_group_id=r.remote_group_id, description=r.description, created_at=utc(r.created_at))


# what group_out reads beyond a group's row: a list loads every group's rules in one query
GROUP_LOADS = (selectinload(m.SecurityGroup.rules),)


def group_out(g: m.SecurityGroup) -> GroupOut:
    return GroupOut(id=g.id, external_id=g.external_id, name=g.name, description=g.description, project_id=g.project_id,
                    rules=[rule_out(r) for r in g.rules], status=g.status, status_reason=g.status_reason,
                    created_at=utc(g.created_at))


# ---------------------------------------------------------------------------------------------- groups


@groups.get("", response_model=list[GroupOut])
def list_groups(c: CallerDep, db: StoreDep, name: str | None = None, external_id: str | None = None,
                limit: Limit = MAX_LIMIT, marker: Marker = None):
    if not c.admin:
        db.write(lambda s: ops.ensure_default(s, c), notify=False)
    return db.read(lambda s: [group_out(g) for g in list_objects(s, c, m.SecurityGroup, name=name,
                                                                 external_id=external_id, limit=limit,
                                                                 marker=marker, options=GROUP_LOADS)])


@groups.post("", response_model=GroupOut, status_code=201)
def create_group(body: GroupCreate, c: CallerDep, db: StoreDep):
    return db.write(lambda s: group_out(ops.create_group(s, c, name=body.name, description=body.description,
                                                         project_id=body.project_id,
                                                         external_id=body.external_id)))


@groups.get("/{group_id}", response_model=GroupOut)
async def show_group(group_id: int, c: CallerDep, db: StoreDep, request: Request, wait: Wait = None,
                     timeout: WaitTimeout = 10.0):
    return await shown(request, lambda: db.read(lambda s: group_out(ops.get_group(s, c, group_id))),
                       ("security_group",), group_id, wait, timeout)


@groups.patch("/{group_id}", response_model=GroupOut)
def update_group(group_id: int, body: GroupUpdate, c: CallerDep, db: StoreDep):
    changes = {k: v for k, v in body.model_dump(exclude_unset=True).items() if v is not None}
    return db.write(lambda s: group_out(ops.update_group(s, c, group_id, changes)))


@groups.delete("/{group_id}", status_code=204)
def delete_group(group_id: int, c: CallerDep, db: StoreDep):
    db.write(lambda s: ops.delete_group(s, c, group_id))
    return Response(status_code=204)


@groups.get("/{group_id}/status", response_model=StatusOut)
def group_status(group_id: int, c: CallerDep, db: StoreDep):
    return db.read(lambda s: status_out("security_group", ops.get_group(s, c, group_id)))


# ---------------------------------------------------------------------------------------------- rules


@rules.get("", response_model=list[RuleOut])
def list_rules(c: CallerDep, db: StoreDep, security_group_id: int | None = None,
               direction: Literal["ingress", "egress"] | None = None, external_id: str | None = None,
               limit: Limit = MAX_LIMIT, marker: Marker = None):
    return db.read(lambda s: [rule_out(r) for r in list_objects(
        s, c, m.SecurityGroupRule, group_id=security_group_id, direction=direction, external_id=external_id,
        limit=limit, marker=marker)])


@rules.post("", response_model=RuleOut, status_code=201)
def create_rule(body: RuleCreate, c: CallerDep, db: StoreDep):
    fields = body.model_dump()
    if fields["remote_ip_prefix"] is not None:
        fields["remote_ip_prefix"] = fields["remote_ip_prefix"].strip()
    return db.write(lambda s: rule_out(ops.create_rule(s, c, **fields)))


@rules.get("/{rule_id}", response_model=RuleOut)
def show_rule(rule_id: int, c: CallerDep, db: StoreDep):
    return db.read(lambda s: rule_out(ops.get_rule(s, c, rule_id)))


@rules.delete("/{rule_id}", status_code=204)
def delete_rule(rule_id: int, c: CallerDep, db: StoreDep):
    db.write(lambda s: ops.delete_rule(s, c, rule_id))
    return Response(status_code=204)

