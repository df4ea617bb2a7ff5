"""/v1/floatingips: addresses of an external network mapped 1:1 to a port's fixed IP (docs/external.md)."""
from __future__ import annotations

from fastapi import APIRouter, Response

from fathom.api import schemas as sc
from fathom.api.deps import ERRORS, CallerDep, Limit, Marker, StoreDep, utc
from fathom.api.nodes import status_out
from fathom.store import external, ops
from fathom.store.external_models import FloatingIp

router = APIRouter(prefix="/floatingips", tags=["floatingips"], responses=ERRORS)


def fip_out(f: FloatingIp) -> sc.FloatingIpOut:
    return sc.FloatingIpOut(id=f.id, name=f.name, project_id=f.project_id, floating_network_id=f.network_id,
                            floating_ip_address=f.ip_address, port_id=f.port_id,
                            fixed_ip_address=f.fixed_ip if f.port_id is not None else None,
                            router_id=f.router_id if f.port_id is not None else None, status=f.status,
                            status_reason=f.status_reason, created_at=utc(f.created_at))


@router.get("", response_model=list[sc.FloatingIpOut])
def list_floating_ips(c: CallerDep, db: StoreDep, name: str | None = None, port_id: int | None = None,
                      limit: Limit = ops.MAX_LIMIT, marker: Marker = None):
    return db.read(lambda s: [fip_out(f) for f in ops.list_objects(
        s, c, FloatingIp, name=name, port_id=port_id, limit=limit, marker=marker)])


@router.post("", response_model=sc.FloatingIpOut, status_code=201)
def create_floating_ip(body: sc.FloatingIpCreate, c: CallerDep, db: StoreDep):
    return db.write(lambda s: fip_out(external.create_floating_ip(
        s, c, network_id=body.floating_network_id, ip_address=body.floating_ip_address, port_id=body.port_id,
        fixed_ip=body.fixed_ip_address, name=body.name, project_id=body.project_id)))


@router.get("/{fip_id}", response_model=sc.FloatingIpOut)
def show_floating_ip(fip_id: int, c: CallerDep, db: StoreDep):
    return db.read(lambda s: fip_out(external.get_floating_ip(s, c, fip_id)))


@router.patch("/{fip_id}", response_model=sc.FloatingIpOut)
def update_floating_ip(fip_id: int, body: sc.FloatingIpUpdate, c: CallerDep, db: StoreDep):
    def run(s):
        f = external.get_floating_ip(s, c, fip_id)
        if "name" in body.model_fields_set:
            f.name = body.name
        if "port_id" in body.model_fields_set:
            external.associate(s, c, f, body.port_id, body.fixed_ip_address)
        elif "fixed_ip_address" in body.model_fields_set:
            external.associate(s, c, f, f.port_id, body.fixed_ip_address)
        s.flush()
        return fip_out(f)
    return db.write(run)


@router.delete("/{fip_id}", status_code=204)
def delete_floating_ip(fip_id: int, c: CallerDep, db: StoreDep):
    db.write(lambda s: external.delete_floating_ip(s, c, fip_id))
    return Response(status_code=204)


@router.get("/{fip_id}/status", response_model=sc.StatusOut)
def floating_ip_status(fip_id: int, c: CallerDep, db: StoreDep):
    return db.read(lambda s: status_out("floating_ip", external.get_floating_ip(s, c, fip_id)))
