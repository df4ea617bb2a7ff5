"""/v1/routers, their interfaces, their external gateway and where each runs.

A router's `mode` (distributed, fabric, network-node; docs/fabric.md) and `gateway_node` are set
in one way: as fields of the router, on `POST /v1/routers` and `PATCH /v1/routers/{id}`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Sequence

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

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


def _set_gateway(s: Session, c, r: m.Router, body) -> None:
    if "external_gateway" not in body.model_fields_set:
        return
    if body.external_gateway is None:
        external.clear_gateway(s, c, r)
        return
    g = body.external_gateway
    external.set_gateway(s, c, r, network_id=g.network_id, ip_address=g.ip_address, enable_snat=g.enable_snat,
                         node=g.node)


@dataclass
class RouterParts:
    """What a router's answer holds beyond the router's row."""
    mode: str
    gateway_node: str | None
    interfaces: list[m.Port]
    external_gateway: sc.ExternalGatewayOut | None


def router_parts(s: Session, routers: Sequence[m.Router]) -> dict[int, RouterParts]:
    """The parts of each router's answer by router id, read for all of `routers` at once: a fixed
    number of statements however many routers there are."""
    ids = [r.id for r in routers]
    modes = fabric_ops.modes_of(s, ids)
    interfaces: dict[int, list[m.Port]] = {i: [] for i in ids}
    for p in s.scalars(select(m.Port).options(selectinload(m.Port.fixed_ips)).where(m.Port.router_id.in_(ids))
                       .order_by(m.Port.id)):
        interfaces[p.router_id].append(p)
    gateways = external.gateways_of(s, ids)
    # each gateway's address is the fixed IP of a port of the external network
    addresses = {p.id: p for p in s.scalars(select(m.Port).options(selectinload(m.Port.fixed_ips)).where(
        m.Port.id.in_([g.address_port_id for g in gateways.values()])))}
    node_ids = {x.gateway_node_id for x in modes.values()} | {g.node_id for g in gateways.values()}
    nodes = dict(s.execute(select(m.Node.id, m.Node.name).where(m.Node.id.in_(node_ids - {None}))).all())

    def gateway_out(gw) -> sc.ExternalGatewayOut:
        port = addresses[gw.address_port_id]
        return sc.ExternalGatewayOut(network_id=gw.network_id, ip_address=port.fixed_ips[0].ip_address,
                                     mac_address=port.mac_address, enable_snat=gw.snat, node=nodes[gw.node_id])

    return {i: RouterParts(mode=modes[i].mode, gateway_node=nodes.get(modes[i].gateway_node_id),
                           interfaces=interfaces[i],
                           external_gateway=gateway_out(gateways[i]) if i in gateways else None)
            for i in ids}


def router_out(s: Session, r: m.Router, parts: RouterParts | None = None) -> sc.RouterOut:
    """`parts`: what router_parts read for the router, when the caller read it already (a list of routers)."""
    if parts is None:
        parts = router_parts(s, [r])[r.id]
    return sc.RouterOut(id=r.id, external_id=r.external_id, name=r.name, project_id=r.project_id,
                        interfaces=[interface_out(p) for p in parts.interfaces],
                        mode=parts.mode, gateway_node=parts.gateway_node, external_gateway=parts.external_gateway,
                        status=r.status, status_reason=r.status_reason, created_at=utc(r.created_at))


@router.get("", response_model=list[sc.RouterOut])
def list_routers(c: CallerDep, db: StoreDep, name: str | None = None, external_id: str | None = None,
                 limit: Limit = ops.MAX_LIMIT, marker: Marker = None):
    def run(s):
        routers = ops.list_objects(s, c, m.Router, name=name, external_id=external_id, limit=limit, marker=marker)
        parts = router_parts(s, routers)
        return [router_out(s, r, parts[r.id]) for r in routers]
    return db.read(run)


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


@router.delete("/{router_id}/interfaces/{interface_id}", status_code=204)
def remove_interface(router_id: int, interface_id: int, c: CallerDep, db: StoreDep):
    """Remove the interface by its id (the id of its port, as listed)."""
    db.write(lambda s: ops.remove_router_interface(s, c, router_id, interface_id=interface_id))
    return Response(status_code=204)


@router.delete("/{router_id}/interfaces", status_code=204)
def remove_interface_on_subnet(router_id: int, subnet_id: Annotated[int, Query(description="the interface's subnet")],
                               c: CallerDep, db: StoreDep):
    """Remove the interface on a subnet (as Neutron's remove_router_interface by subnet does)."""
    db.write(lambda s: ops.remove_router_interface(s, c, router_id, subnet_id=subnet_id))
    return Response(status_code=204)
