"""/v1/fabric/switches: the fabric switches and their links.

A router's mode is a field of the router (fathom/api/routers.py). The switch status and flows
endpoints read the switch itself: fathom/api/runtime.py, like the other switch-reading endpoints.
"""
from __future__ import annotations

import ipaddress
from datetime import datetime
from typing import Sequence

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from fathom.api.deps import ERRORS, CallerDep, Limit, Marker, StoreDep, Wait, WaitTimeout, shown, utc
from fathom.store import fabric as fops
from fathom.store import models as m
from fathom.store import ops
from fathom.store.fabric_models import FabricSwitch

class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FabricSwitchCreate(_Request):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    management_ip: ipaddress.IPv4Address
    bridge: str = Field(default="br-fabric", pattern=r"^[A-Za-z0-9_.-]{1,15}$")
    vlan_min: int = Field(default=100, ge=1, le=4094)
    vlan_max: int = Field(default=999, ge=1, le=4094)
    links: dict[str, str] = Field(default_factory=dict,
                                  description="declared wiring {node name: fabric switch port name}; LLDP overrides it")


class FabricLinkOut(BaseModel):
    port_name: str
    ofport: int | None
    node: str
    source: str
    last_seen: float | None


class FabricSwitchOut(BaseModel):
    id: int
    name: str
    management_ip: str
    bridge: str
    vlan_min: int
    vlan_max: int
    links: list[FabricLinkOut]
    status: str
    status_reason: str | None
    created_at: datetime


def links_out(s, switches: Sequence[FabricSwitch]) -> dict[int, list[FabricLinkOut]]:
    """The links of each of the switches by switch id, read in two statements however many switches."""
    names = {n.id: n.name for n in s.query(m.Node)}
    return {i: [FabricLinkOut(port_name=x.port_name, ofport=x.ofport, node=names.get(x.node_id, "?"), source=x.source,
                        last_seen=x.last_seen) for x in links]
            for i, links in fops.links_of(s, [sw.id for sw in switches]).items()}


def switch_out(s, sw: FabricSwitch, links: list[FabricLinkOut] | None = None) -> FabricSwitchOut:
    """`links`: what links_out read for the switch, when the caller read it already (a list of switches)."""
    if links is None:
        links = links_out(s, [sw])[sw.id]
    return FabricSwitchOut(id=sw.id, name=sw.name, management_ip=sw.management_ip, bridge=sw.bridge,
                     vlan_min=sw.vlan_min, vlan_max=sw.vlan_max, links=links,
                     status=sw.status, status_reason=sw.status_reason, created_at=utc(sw.created_at))


router = APIRouter(prefix="/fabric/switches", tags=["fabric"], responses=ERRORS)


@router.post("", response_model=FabricSwitchOut, status_code=201)
def create_switch(body: FabricSwitchCreate, c: CallerDep, db: StoreDep):
    ops.require_admin(c, "manage fabric switches")
    return db.write(lambda s: switch_out(s, fops.create_switch(
        s, name=body.name, management_ip=str(body.management_ip), bridge=body.bridge,
        vlan_min=body.vlan_min, vlan_max=body.vlan_max, links=body.links)))


@router.get("", response_model=list[FabricSwitchOut])
def list_switches(c: CallerDep, db: StoreDep, limit: Limit = ops.MAX_LIMIT, marker: Marker = None):
    ops.require_admin(c, "see fabric switches")
    def run(s):
        switches = s.query(FabricSwitch).where(FabricSwitch.id > min(marker or 0, ops.MAX_ID)) \
            .order_by(FabricSwitch.id).limit(limit).all()
        links = links_out(s, switches)
        return [switch_out(s, sw, links[sw.id]) for sw in switches]
    return db.read(run)


@router.get("/{switch_id}", response_model=FabricSwitchOut)
async def show_switch(switch_id: int, c: CallerDep, db: StoreDep, request: Request, wait: Wait = None,
                      timeout: WaitTimeout = 10.0):
    ops.require_admin(c, "see fabric switches")
    return await shown(request, lambda: db.read(lambda s: switch_out(s, fops.get_switch(s, switch_id))),
                       ("fabric_switch",), switch_id, wait, timeout)


@router.delete("/{switch_id}", status_code=204)
def delete_switch(switch_id: int, c: CallerDep, db: StoreDep):
    ops.require_admin(c, "manage fabric switches")
    db.write(lambda s: fops.delete_switch(s, switch_id))
    return Response(status_code=204)
