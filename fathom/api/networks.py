"""/v1/networks and /v1/subnets."""
from __future__ import annotations

from fastapi import APIRouter, Request, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from fathom.api import schemas as sc
from fathom.api.deps import ERRORS, CallerDep, Limit, Marker, StoreDep, Wait, WaitTimeout, shown, utc
from fathom.api.nodes import status_out
from fathom.store import models as m
from fathom.store import ops
from fathom.store.ops import Caller

networks = APIRouter(prefix="/networks", tags=["networks"], responses=ERRORS)
subnets = APIRouter(prefix="/subnets", tags=["subnets"], responses=ERRORS)


def network_out(s: Session, n: m.Network) -> sc.NetworkOut:
    return networks_out(s, [n])[0]


def networks_out(s: Session, found: list[m.Network]) -> list[sc.NetworkOut]:
    """The networks' answers, their subnets read in one statement for all of them."""
    subnet_ids: dict[int, list[int]] = {n.id: [] for n in found}
    for network_id, subnet_id in s.execute(select(m.Subnet.network_id, m.Subnet.id)
                                           .where(m.Subnet.network_id.in_(subnet_ids)).order_by(m.Subnet.id)):
        subnet_ids[network_id].append(subnet_id)
    return [sc.NetworkOut(id=n.id, external_id=n.external_id, name=n.name, project_id=n.project_id, type=n.type,
                          segmentation_id=n.segmentation_id, subnets=subnet_ids[n.id], external=n.external,
                          upstream_mac=n.upstream_mac, status=n.status,
                          status_reason=n.status_reason, created_at=utc(n.created_at)) for n in found]


def subnet_out(x: m.Subnet) -> sc.SubnetOut:
    return sc.SubnetOut(id=x.id, external_id=x.external_id, name=x.name, project_id=x.project_id, network_id=x.network_id,
                        cidr=x.cidr, gateway_ip=x.gateway_ip, enable_dhcp=x.enable_dhcp,
                        dns_nameservers=list(x.dns_nameservers or []),
                        host_routes=[sc.HostRouteOut(**r) for r in x.host_routes or []], status=x.status,
                        status_reason=x.status_reason,
                        dhcp_status=[sc.DhcpServerStatus(**d) for d in x.dhcp_status or []],
                        created_at=utc(x.created_at))


def rename(s: Session, c: Caller, model, object_id: int, body) -> object:
    """The object, renamed when the body gives a name (the only field some resources may change)."""
    obj = ops.get(s, c, model, object_id)
    if "name" in body.model_fields_set:
        obj.name = body.name
    s.flush()
    return obj


# ---------------------------------------------------------------------------------------------- networks


@networks.get("", response_model=list[sc.NetworkOut])
def list_networks(c: CallerDep, db: StoreDep, name: str | None = None, external_id: str | None = None,
                  limit: Limit = ops.MAX_LIMIT, marker: Marker = None):
    def run(s):
        found = list(ops.list_objects(s, c, m.Network, name=name, external_id=external_id, limit=limit, marker=marker))
        if not c.admin:   # external networks are every project's to take floating IPs from (router:external)
            found += ops.list_objects(s, ops.Caller(admin=True), m.Network, name=name, external_id=external_id,
                                      external=True, limit=limit, marker=marker)
            found = sorted({n.id: n for n in found}.values(), key=lambda n: n.id)[:limit]
        return networks_out(s, found)
    return db.read(run)


@networks.post("", response_model=sc.NetworkOut, status_code=201)
def create_network(body: sc.NetworkCreate, c: CallerDep, db: StoreDep):
    return db.write(lambda s: network_out(s, ops.create_network(
        s, c, db.settings, name=body.name, type=body.type, segmentation_id=body.segmentation_id,
        project_id=body.project_id, external=body.external, upstream_mac=body.upstream_mac,
        external_id=body.external_id)))


@networks.get("/{network_id}", response_model=sc.NetworkOut)
async def show_network(network_id: int, c: CallerDep, db: StoreDep, request: Request, wait: Wait = None,
                       timeout: WaitTimeout = 10.0):
    def run(s):
        n = s.get(m.Network, network_id) if ops.valid_id(network_id) else None
        if n is not None and n.external:   # shared, as in the list
            return network_out(s, n)
        return network_out(s, ops.get(s, c, m.Network, network_id))
    return await shown(request, lambda: db.read(run), ("network",), network_id, wait, timeout)


@networks.patch("/{network_id}", response_model=sc.NetworkOut)
def update_network(network_id: int, body: sc.NetworkUpdate, c: CallerDep, db: StoreDep):
    return db.write(lambda s: network_out(s, rename(s, c, m.Network, network_id, body)))


@networks.delete("/{network_id}", status_code=204)
def delete_network(network_id: int, c: CallerDep, db: StoreDep):
    db.write(lambda s: ops.delete_network(s, c, network_id))
    return Response(status_code=204)


@networks.get("/{network_id}/status", response_model=sc.StatusOut)
def network_status(network_id: int, c: CallerDep, db: StoreDep):
    return db.read(lambda s: status_out("network", ops.get(s, c, m.Network, network_id)))


# ---------------------------------------------------------------------------------------------- subnets


@subnets.get("", response_model=list[sc.SubnetOut])
def list_subnets(c: CallerDep, db: StoreDep, name: str | None = None, network_id: int | None = None,
                 external_id: str | None = None, limit: Limit = ops.MAX_LIMIT, marker: Marker = None):
    return db.read(lambda s: [subnet_out(x) for x in ops.list_objects(
        s, c, m.Subnet, name=name, network_id=network_id, external_id=external_id, limit=limit,
        marker=marker)])


@subnets.post("", response_model=sc.SubnetOut, status_code=201)
def create_subnet(body: sc.SubnetCreate, c: CallerDep, db: StoreDep):
    gateway = body.gateway_ip if "gateway_ip" in body.model_fields_set else ops.UNSET
    return db.write(lambda s: subnet_out(ops.create_subnet(
        s, c, network_id=body.network_id, cidr=body.cidr, gateway_ip=gateway, name=body.name,
        project_id=body.project_id, external_id=body.external_id, enable_dhcp=body.enable_dhcp,
        dns_nameservers=body.dns_nameservers,
        host_routes=[(r.destination, r.nexthop) for r in body.host_routes])))


@subnets.get("/{subnet_id}", response_model=sc.SubnetOut)
async def show_subnet(subnet_id: int, c: CallerDep, db: StoreDep, request: Request, wait: Wait = None,
                      timeout: WaitTimeout = 10.0):
    return await shown(request, lambda: db.read(lambda s: subnet_out(ops.get(s, c, m.Subnet, subnet_id))),
                       ("subnet",), subnet_id, wait, timeout)


@subnets.patch("/{subnet_id}", response_model=sc.SubnetOut)
def update_subnet(subnet_id: int, body: sc.SubnetUpdate, c: CallerDep, db: StoreDep):
    given = body.given()
    routes = given.get("host_routes")
    return db.write(lambda s: subnet_out(ops.update_subnet(
        s, c, subnet_id, name=given.get("name"), enable_dhcp=given.get("enable_dhcp"),
        dns_nameservers=given.get("dns_nameservers"),
        host_routes=None if routes is None else [(r.destination, r.nexthop) for r in routes])))


@subnets.delete("/{subnet_id}", status_code=204)
def delete_subnet(subnet_id: int, c: CallerDep, db: StoreDep):
    db.write(lambda s: ops.delete_subnet(s, c, subnet_id))
    return Response(status_code=204)


@subnets.get("/{subnet_id}/status", response_model=sc.StatusOut)
def subnet_status(subnet_id: int, c: CallerDep, db: StoreDep):
    return db.read(lambda s: status_out("subnet", ops.get(s, c, m.Subnet, subnet_id)))
