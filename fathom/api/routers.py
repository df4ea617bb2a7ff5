"""/v1/routers, their interfaces, their external gateway and where each runs.

A router's `mode` (distributed, fabric, network-node; docs/fabric.md) and `gateway_node` are set
in one way: as fields of the router, on `POST /v1/routers` and `PATCH /v1/routers/{id}`.
"""
from __future__ import annotations

from fastapi import APIRouter, Request, Response
from sqlalchemy.orm import Session

from fathom.api import schemas as sc
from fathom.api.deps import ERRORS, CallerDep, Limit, Marker, StoreDep, Wait, WaitTimeout, shown, gateway_node_admin, utc
from fathom.api.networks import rename
from fathom.api.nodes import status_out
from fathom.store import external
from fathom.store import fabric as fabric_ops
from fathom.store import models as m
from fathom.store import ops

router = APIRouter(prefix="/routers", tags=["routers"], responses=ERRORS)


def interface_out(p: m.Port) -> sc.RouterInterfaceOut:
    a = p.fixed_ips[0]
    return sc.RouterInterfaceOut(id=p.id, external_id=p.external_id, router_id=p.router_id, subnet_id=a.subnet_id,
                                 network_id=p.network_id, ip_address=a.ip_address,
                                 mac_address=p.mac_address, status=p.status,
                                 status_reason=p.status_reason)


def gateway_out(s: Session, r: m.Router) -> sc.ExternalGatewayOut | None:
    gw = external.gateway_of(s, r.id)
    if gw is None:
        return None
    port = s.get(m.Port, gw.address_port_id)
    return sc.ExternalGatewayOut(network_id=gw.network_id, ip_address=port.fixed_ips[0].ip_address,
                                 mac_address=port.mac_address, enable_snat=gw.snat,
                                 node=s.get(m.Node, gw.node_id).name)


def _set_gateway(s: Session, c, r: m.Router, body) -> None:
    if "external_gateway" not in body.model_fields_set:
        return
    if body.external_gateway is None:
        external.clear_gateway(s, c, r)
        return
    g = body.external_gateway
    external.set_gateway(s, c, r, network_id=g.network_id, ip_address=g.ip_address, enable_snat=g.enable_snat,
                         node=g.node)


def router_out(s: Session, r: m.Router) -> sc.RouterOut:
    mode = fabric_ops.get_mode(s, r)
    gateway = s.get(m.Node, mode.gateway_node_id) if mode.gateway_node_id else None
    return sc.RouterOut(id=r.id, external_id=r.external_id, name=r.name, project_id=r.project_id,
                        interfaces=[interface_out(p) for p in ops.router_interfaces(s, r.id)],
                        mode=mode.mode, gateway_node=gateway.name if gateway else None,
                        external_gateway=gateway_out(s, r),
                        status=r.status, status_reason=r.status_reason, created_at=utc(r.created_at))


@router.get("", response_model=list[sc.RouterOut])
def list_routers(c: CallerDep, db: StoreDep, name: str | None = None, external_id: str | None = None,
                 limit: Limit = ops.MAX_LIMIT, marker: Marker = None):
    return db.read(lambda s: [router_out(s, x) for x in ops.list_objects(
        s, c, m.Router, name=name, external_id=external_id, limit=limit, marker=marker)])


@router.post("", response_model=sc.RouterOut, status_code=201)
def create_router(body: sc.RouterCreate, c: CallerDep, db: StoreDep):
    gateway_node_admin(c, body.gateway_node)

    def run(s):
        r = ops.create_router(s, c, name=body.name, project_id=body.project_id, external_id=body.external_id)
        if body.mode != "distributed" or body.gateway_node is not None:
            fabric_ops.set_router_mode(s, r, body.mode, body.gateway_node)
        _set_gateway(s, c, r, body)
        return router_out(s, r)
    return db.write(run)


@router.get("/{router_id}", response_model=sc.RouterOut)
async def show_router(router_id: int, c: CallerDep, db: StoreDep, request: Request, wait: Wait = None,
                      timeout: WaitTimeout = 10.0):
    return await shown(request, lambda: db.read(lambda s: router_out(s, ops.get(s, c, m.Router, router_id))),
                       ("router",), router_id, wait, timeout)


@router.patch("/{router_id}", response_model=sc.RouterOut)
def update_router(router_id: int, body: sc.RouterUpdate, c: CallerDep, db: StoreDep):
    gateway_node_admin(c, body.gateway_node)

    def run(s):
        r = rename(s, c, m.Router, router_id, body)
        if body.mode is not None:
            external.check_mode_change(s, r, body.mode)
            fabric_ops.set_router_mode(s, r, body.mode, body.gateway_node)
        elif body.gateway_node is not None:
            fabric_ops.set_router_mode(s, r, fabric_ops.get_mode(s, r).mode, body.gateway_node)
        _set_gateway(s, c, r, body)
        return router_out(s, r)
    return db.write(run)


@router.delete("/{router_id}", status_code=204)
def delete_router(router_id: int, c: CallerDep, db: StoreDep):
    db.write(lambda s: ops.delete_router(s, c, router_id))
    return Response(status_code=204)


@router.get("/{router_id}/status", response_model=sc.StatusOut)
def router_status(router_id: int, c: CallerDep, db: StoreDep):
    return db.read(lambda s: status_out("router", ops.get(s, c, m.Router, router_id)))


@router.get("/{router_id}/interfaces", response_model=list[sc.RouterInterfaceOut])
def list_interfaces(router_id: int, c: CallerDep, db: StoreDep, limit: Limit = ops.MAX_LIMIT,
                    marker: Marker = None):
    def run(s):
        r = ops.get(s, c, m.Router, router_id)
        return [interface_out(p) for p in ops.router_interfaces(s, r.id) if marker is None or p.id > marker][:limit]
    return db.read(run)


@router.post("/{router_id}/interfaces", response_model=sc.RouterInterfaceOut, status_code=201)
def add_interface(router_id: int, body: sc.RouterInterfaceCreate, c: CallerDep, db: StoreDep):
    return db.write(lambda s: interface_out(ops.add_router_interface(
        s, c, router_id, subnet_id=body.subnet_id, ip_address=body.ip_address, external_id=body.external_id,
        mac_address=body.mac_address)))


@router.delete("/{router_id}/interfaces/{subnet_id}", status_code=204)
def remove_interface(router_id: int, subnet_id: int, c: CallerDep, db: StoreDep):
    db.write(lambda s: ops.remove_router_interface(s, c, router_id, subnet_id))
    return Response(status_code=204)
