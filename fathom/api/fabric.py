"""REST endpoints of the fabric (issue 7): ToR switches and their links, router modes.

Included by fathom/api/app.py with one line. Errors follow the API's convention (field-level
`detail[].loc`). The switch status endpoint reads the switch itself and lives with the controller
runtime (fathom/controller/fabric.py), like the other switch-reading endpoints.
"""
from __future__ import annotations

import ipaddress
from datetime import datetime, timezone
from typing import Literal

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, ConfigDict, Field

from fathom.store import fabric as fops
from fathom.store import models as m
from fathom.store import ops
from fathom.store.fabric_models import FabricSwitch
from fathom.store.ops import Caller

Mode = Literal["distributed", "fabric", "network-node"]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SwitchCreate(_Request):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    management_ip: ipaddress.IPv4Address
    bridge: str = Field(default="br-fabric", pattern=r"^[A-Za-z0-9_.-]{1,15}$")
    vlan_min: int = Field(default=100, ge=1, le=4094)
    vlan_max: int = Field(default=999, ge=1, le=4094)
    links: dict[str, str] = Field(default_factory=dict,
                                  description="declared wiring {node name: ToR port name}; LLDP overrides it")


class LinkOut(BaseModel):
    port_name: str
    ofport: int | None
    node: str
    source: str
    last_seen: float | None


class SwitchOut(BaseModel):
    id: int
    name: str
    management_ip: str
    bridge: str
    vlan_min: int
    vlan_max: int
    links: list[LinkOut]
    status: str
    status_reason: str | None
    created_at: datetime


class ModeIn(_Request):
    mode: Mode
    gateway_node: str | None = Field(default=None, description="network-node mode: the gateway node "
                                                                "(default: the first node of role gateway)")


class ModeOut(BaseModel):
    router_id: int
    mode: Mode
    gateway_node: str | None


def switch_out(s, sw: FabricSwitch) -> SwitchOut:
    names = {n.id: n.name for n in s.query(m.Node)}
    created = sw.created_at if sw.created_at.tzinfo else sw.created_at.replace(tzinfo=timezone.utc)
    return SwitchOut(id=sw.id, name=sw.name, management_ip=sw.management_ip, bridge=sw.bridge,
                     vlan_min=sw.vlan_min, vlan_max=sw.vlan_max,
                     links=[LinkOut(port_name=x.port_name, ofport=x.ofport, node=names.get(x.node_id, "?"),
                                    source=x.source, last_seen=x.last_seen) for x in fops.links_of(s, sw.id)],
                     status=sw.status, status_reason=sw.status_reason, created_at=created)


def mode_out(s, router: m.Router) -> ModeOut:
    row = fops.get_mode(s, router)
    gw = s.get(m.Node, row.gateway_node_id) if row.gateway_node_id else None
    return ModeOut(router_id=router.id, mode=row.mode, gateway_node=gw.name if gw else None)


def routes(store) -> APIRouter:
    """`store` is the API's _Store (read/write in one transaction, wakes the reconciler)."""
    from fathom.api.app import LIMIT, MARKER, _gateway_node_admin, caller
    r = APIRouter(tags=["fabric"])
    who = Depends(caller)

    @r.post("/fabric/switches", response_model=SwitchOut, status_code=201)
    def create_switch(body: SwitchCreate, c: Caller = who):
        ops.require_admin(c, "manage fabric switches")
        return store.write(lambda s: switch_out(s, fops.create_switch(
            s, name=body.name, management_ip=str(body.management_ip), bridge=body.bridge,
            vlan_min=body.vlan_min, vlan_max=body.vlan_max, links=body.links)))

    @r.get("/fabric/switches", response_model=list[SwitchOut])
    def list_switches(c: Caller = who, limit: int = LIMIT, marker: int | None = MARKER):
        ops.require_admin(c, "see fabric switches")
        return store.read(lambda s: [switch_out(s, x) for x in s.query(FabricSwitch).where(
            FabricSwitch.id > min(marker or 0, ops.MAX_ID)).order_by(FabricSwitch.id).limit(limit)])

    @r.get("/fabric/switches/{switch_id}", response_model=SwitchOut)
    def show_switch(switch_id: int, c: Caller = who):
        ops.require_admin(c, "see fabric switches")
        return store.read(lambda s: switch_out(s, fops.get_switch(s, switch_id)))

    @r.delete("/fabric/switches/{switch_id}", status_code=204)
    def delete_switch(switch_id: int, c: Caller = who):
        ops.require_admin(c, "manage fabric switches")
        store.write(lambda s: fops.delete_switch(s, switch_id))
        return Response(status_code=204)

    @r.get("/routers/{router_id}/mode", response_model=ModeOut)
    def show_mode(router_id: int, c: Caller = who):
        return store.read(lambda s: mode_out(s, ops.get(s, c, m.Router, router_id)))

    @r.put("/routers/{router_id}/mode", response_model=ModeOut)
    def set_mode(router_id: int, body: ModeIn, c: Caller = who):
        _gateway_node_admin(c, body.gateway_node)
        def run(s):
            router = ops.get(s, c, m.Router, router_id)
            fops.set_router_mode(s, router, body.mode, body.gateway_node)
            return mode_out(s, router)
        return store.write(run)

    return r
