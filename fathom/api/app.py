"""The REST API: `create_app(db_url, on_change)` returns the FastAPI app of the controller.

Resources live under /v1; OpenAPI is at /openapi.json. Every request runs in one transaction: it
commits entirely or not at all. After each committed write, `on_change()` is called (the controller
wakes its reconciler with it). Errors are field-level: `{"detail": [{"loc": [...], "msg": ...,
"type": ...}]}` with 422 (bad input), 404 (unknown id), 409 (conflicts with the store), 403.

Every call is authenticated with a bearer token (fathom/api/auth.py says who may do what), and
its input is bounded (fathom/api/limits.py). Lists are paginated: `limit` (at most 1000) and
`marker` (the last id of the previous page).
"""
from __future__ import annotations

import ipaddress
import logging
from datetime import datetime, timezone
from typing import Callable

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fathom import __version__
from fathom.api import auth, limits
from fathom.api import fabric as fabric_api
from fathom.api import pptmon as pptmon_api
from fathom.api import schemas as sc
from fathom.api.taps import taps_router
from fathom.store import fabric as fabric_ops
from fathom.store import models as m
from fathom.store import ops
from fathom.store.db import READ_ONLY, open_store
from fathom.auth.keystone import KeystoneValidator
from fathom.store.errors import Conflict, Forbidden, StoreError
from fathom.store.ops import Caller, Settings

log = logging.getLogger(__name__)


def create_app(db_url: str, on_change: Callable[[], None] | None = None, *,
               settings: Settings | None = None, keystone: KeystoneValidator | None = None,
               max_body: int | None = None) -> FastAPI:
    """The API over the store at `db_url` (migrated to the newest schema first).

    `app.state.engine` is the SQLAlchemy engine, e.g. for fathom.store.snapshot.load_snapshot.
    """
    engine = open_store(db_url)
    store = _Store(engine, settings or Settings(), on_change)
    app = FastAPI(title="fathom", version=__version__,
                  description="Tenant networking on Open vSwitch: nodes, networks, subnets, ports, "
                              "routers. Errors: {detail: [{loc, msg, type}]}.")
    app.state.engine = engine
    app.state.settings = store.settings
    app.state.authenticator = auth.Authenticator(engine, keystone if keystone is not None
                                                 else KeystoneValidator.from_env())
    app.add_middleware(limits.BoundedInput, max_body=max_body)
    app.add_exception_handler(RequestValidationError, limits.validation_error)

    @app.exception_handler(StoreError)
    async def _store_error(_request: Request, exc: StoreError):
        return error_response(exc)

    app.include_router(_routes(store), prefix="/v1")
    app.include_router(taps_router(store), prefix="/v1")
    app.include_router(fabric_api.routes(store), prefix="/v1", responses=ERRORS)  # issue 7: fabric
    app.include_router(pptmon_api.routes(engine), prefix="/v1", responses=ERRORS)  # issue 5: PPTMon records
    app.include_router(auth.tokens_router(store), prefix="/v1")
    return app


def error_response(exc: StoreError) -> JSONResponse:
    loc: list[str | int] = []
    if exc.field:
        loc = ["body", *(int(p) if p.isdigit() else p for p in exc.field.split("."))]
    return JSONResponse(status_code=exc.status, content=limits.error_body(exc.message, loc, exc.kind),
                        headers={"WWW-Authenticate": "Bearer"} if exc.status == 401 else None)


caller = auth.caller             # every route's identity (fathom/api/auth.py)


class _Store:
    def __init__(self, engine: Engine, settings: Settings, on_change):
        self.engine = engine
        self.settings = settings
        self.on_change = on_change

    def read(self, fn):
        with Session(self.engine) as session, session.begin():
            session.connection(execution_options=READ_ONLY)
            return fn(session)

    def write(self, fn, attempts: int = 3, notify: bool = True):
        """Run `fn(session)` in one transaction; its result must be fully serialised inside.

        A unique constraint that fires means a concurrent writer got in between our checks and
        the commit (PostgreSQL; SQLite serialises writers). The request is run again: then either
        it succeeds (e.g. the next free address) or our checks see the other write and name the
        field in a proper 409.
        """
        for attempt in range(attempts):
            try:
                with Session(self.engine) as session, session.begin():
                    result = fn(session)
                break
            except IntegrityError as e:
                if attempt == attempts - 1:
                    raise _conflict_from(e) from None
        if self.on_change is not None and notify:
            try:
                self.on_change()
            except Exception:  # the write is committed; a failing hook must not turn it into a 500
                log.exception("on_change hook failed")
        return result


def _conflict_from(e: IntegrityError) -> Conflict:
    text = str(e.orig)
    for hint, field in (("mac_address", "mac_address"), ("ip_address", "fixed_ips"),
                        ("segmentation_id", "segmentation_id"), ("interface_name", "interface_name"),
                        ("nodes.name", "name"), ("uq_nodes_name", "name")):
        if hint in text:
            return Conflict(f"{field} is in use (changed concurrently): retry", field)
    return Conflict("the request conflicts with the store (an object is in use)")


# ---------------------------------------------------------------------------------------------- serialisation


def _utc(value: datetime) -> datetime:
    """SQLite hands back naive datetimes; every time we store is UTC."""
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def node_out(n: m.Node) -> sc.NodeOut:
    return sc.NodeOut(id=n.id, name=n.name, role=n.role, tunnel_ip=n.tunnel_ip,
                      management_ip=n.management_ip, state=n.state, status=n.status,
                      status_reason=n.status_reason, project_id=n.project_id, created_at=_utc(n.created_at))


def network_out(s: Session, n: m.Network) -> sc.NetworkOut:
    return sc.NetworkOut(id=n.id, name=n.name, project_id=n.project_id, type=n.type,
                         segmentation_id=n.segmentation_id,
                         subnets=[x.id for x in ops.subnets_of(s, n.id)], status=n.status,
                         status_reason=n.status_reason, created_at=_utc(n.created_at))


def subnet_out(x: m.Subnet) -> sc.SubnetOut:
    return sc.SubnetOut(id=x.id, name=x.name, project_id=x.project_id, network_id=x.network_id,
                        cidr=x.cidr, gateway_ip=x.gateway_ip, status=x.status,
                        status_reason=x.status_reason, created_at=_utc(x.created_at))


def port_out(p: m.Port) -> sc.PortOut:
    return sc.PortOut(id=p.id, name=p.name, project_id=p.project_id, network_id=p.network_id,
                      mac_address=p.mac_address,
                      fixed_ips=[sc.FixedIpOut(subnet_id=a.subnet_id, ip_address=a.ip_address)
                                 for a in p.fixed_ips],
                      node=p.node.name if p.node else None, interface_name=p.interface_name,
                      port_security=p.port_security, router_id=p.router_id, status=p.status,
                      status_reason=p.status_reason, created_at=_utc(p.created_at))


def interface_out(p: m.Port) -> sc.RouterInterfaceOut:
    a = p.fixed_ips[0]
    return sc.RouterInterfaceOut(id=p.id, router_id=p.router_id, subnet_id=a.subnet_id,
                                 network_id=p.network_id, ip_address=a.ip_address,
                                 mac_address=p.mac_address, status=p.status,
                                 status_reason=p.status_reason)


def router_out(s: Session, r: m.Router) -> sc.RouterOut:
    mode = fabric_api.mode_out(s, r)   # issue 7: where the router runs
    return sc.RouterOut(id=r.id, name=r.name, project_id=r.project_id,
                        interfaces=[interface_out(p) for p in ops.router_interfaces(s, r.id)],
                        mode=mode.mode, gateway_node=mode.gateway_node,
                        status=r.status, status_reason=r.status_reason, created_at=_utc(r.created_at))


def status_out(kind: str, obj) -> sc.StatusOut:
    return sc.StatusOut(kind=kind, id=obj.id, status=obj.status, status_reason=obj.status_reason,
                        state=getattr(obj, "state", None))


# ---------------------------------------------------------------------------------------------- routes


ERRORS = {code: {"model": sc.ErrorOut} for code in (401, 403, 404, 409, 413, 422)}
LIMIT = Query(ops.MAX_LIMIT, ge=1, le=ops.MAX_LIMIT, description="at most this many (pagination)")
MARKER = Query(None, ge=0, description="the last id of the previous page")


def _routes(store: _Store) -> APIRouter:
    r = APIRouter(responses=ERRORS)
    settings = store.settings
    who = Depends(caller)

    # -- nodes (admin only)

    @r.get("/nodes", response_model=list[sc.NodeOut], tags=["nodes"])
    def list_nodes(c: Caller = who, name: str | None = None, limit: int = LIMIT, marker: int | None = MARKER):
        ops.require_admin(c, "see nodes")
        return store.read(lambda s: [node_out(n) for n in ops.list_objects(
            s, c, m.Node, name=name, limit=limit, marker=marker)])

    @r.post("/nodes", response_model=sc.NodeOut, status_code=201, tags=["nodes"])
    def create_node(body: sc.NodeCreate, c: Caller = who):
        return store.write(lambda s: node_out(ops.create_node(
            s, c, name=body.name, role=body.role, tunnel_ip=_str(body.tunnel_ip),
            management_ip=_str(body.management_ip))))

    @r.get("/nodes/{node_id}", response_model=sc.NodeOut, tags=["nodes"])
    def show_node(node_id: int, c: Caller = who):
        ops.require_admin(c, "see nodes")
        return store.read(lambda s: node_out(ops.get(s, c, m.Node, node_id)))

    @r.patch("/nodes/{node_id}", response_model=sc.NodeOut, tags=["nodes"])
    def update_node(node_id: int, body: sc.NodeUpdate, c: Caller = who):
        changes = {k: _str(v) if k.endswith("_ip") else v for k, v in body.given().items()}
        return store.write(lambda s: node_out(ops.update_node(s, c, node_id, changes)))

    @r.delete("/nodes/{node_id}", status_code=204, tags=["nodes"])
    def delete_node(node_id: int, c: Caller = who):
        store.write(lambda s: ops.delete_node(s, c, node_id))
        return Response(status_code=204)

    @r.get("/nodes/{node_id}/status", response_model=sc.StatusOut, tags=["nodes"])
    def node_status(node_id: int, c: Caller = who):
        ops.require_admin(c, "see nodes")
        return store.read(lambda s: status_out("node", ops.get(s, c, m.Node, node_id)))

    # -- networks

    @r.get("/networks", response_model=list[sc.NetworkOut], tags=["networks"])
    def list_networks(c: Caller = who, name: str | None = None, limit: int = LIMIT, marker: int | None = MARKER):
        return store.read(lambda s: [network_out(s, n) for n in ops.list_objects(
            s, c, m.Network, name=name, limit=limit, marker=marker)])

    @r.post("/networks", response_model=sc.NetworkOut, status_code=201, tags=["networks"])
    def create_network(body: sc.NetworkCreate, c: Caller = who):
        return store.write(lambda s: network_out(s, ops.create_network(
            s, c, settings, name=body.name, type=body.type, segmentation_id=body.segmentation_id,
            project_id=body.project_id)))

    @r.get("/networks/{network_id}", response_model=sc.NetworkOut, tags=["networks"])
    def show_network(network_id: int, c: Caller = who):
        return store.read(lambda s: network_out(s, ops.get(s, c, m.Network, network_id)))

    @r.patch("/networks/{network_id}", response_model=sc.NetworkOut, tags=["networks"])
    def update_network(network_id: int, body: sc.NetworkUpdate, c: Caller = who):
        return store.write(lambda s: network_out(s, _rename(s, c, m.Network, network_id, body)))

    @r.delete("/networks/{network_id}", status_code=204, tags=["networks"])
    def delete_network(network_id: int, c: Caller = who):
        store.write(lambda s: ops.delete_network(s, c, network_id))
        return Response(status_code=204)

    @r.get("/networks/{network_id}/status", response_model=sc.StatusOut, tags=["networks"])
    def network_status(network_id: int, c: Caller = who):
        return store.read(lambda s: status_out("network", ops.get(s, c, m.Network, network_id)))

    # -- subnets

    @r.get("/subnets", response_model=list[sc.SubnetOut], tags=["subnets"])
    def list_subnets(c: Caller = who, name: str | None = None, network_id: int | None = None,
                     limit: int = LIMIT, marker: int | None = MARKER):
        return store.read(lambda s: [subnet_out(x) for x in ops.list_objects(
            s, c, m.Subnet, name=name, network_id=network_id, limit=limit, marker=marker)])

    @r.post("/subnets", response_model=sc.SubnetOut, status_code=201, tags=["subnets"])
    def create_subnet(body: sc.SubnetCreate, c: Caller = who):
        gateway = body.gateway_ip if "gateway_ip" in body.model_fields_set else ops.UNSET
        return store.write(lambda s: subnet_out(ops.create_subnet(
            s, c, network_id=body.network_id, cidr=body.cidr, gateway_ip=gateway, name=body.name,
            project_id=body.project_id)))

    @r.get("/subnets/{subnet_id}", response_model=sc.SubnetOut, tags=["subnets"])
    def show_subnet(subnet_id: int, c: Caller = who):
        return store.read(lambda s: subnet_out(ops.get(s, c, m.Subnet, subnet_id)))

    @r.patch("/subnets/{subnet_id}", response_model=sc.SubnetOut, tags=["subnets"])
    def update_subnet(subnet_id: int, body: sc.SubnetUpdate, c: Caller = who):
        return store.write(lambda s: subnet_out(_rename(s, c, m.Subnet, subnet_id, body)))

    @r.delete("/subnets/{subnet_id}", status_code=204, tags=["subnets"])
    def delete_subnet(subnet_id: int, c: Caller = who):
        store.write(lambda s: ops.delete_subnet(s, c, subnet_id))
        return Response(status_code=204)

    @r.get("/subnets/{subnet_id}/status", response_model=sc.StatusOut, tags=["subnets"])
    def subnet_status(subnet_id: int, c: Caller = who):
        return store.read(lambda s: status_out("subnet", ops.get(s, c, m.Subnet, subnet_id)))

    # -- ports

    @r.get("/ports", response_model=list[sc.PortOut], tags=["ports"])
    def list_ports(c: Caller = who, name: str | None = None, network_id: int | None = None,
                   node: str | None = None, router_id: int | None = None,
                   limit: int = LIMIT, marker: int | None = MARKER):
        def run(s):
            # an unknown node matches no port (no 404: that would tell which nodes exist)
            node_id = (s.scalar(select(m.Node.id).where(m.Node.name == node)) or -1) if node is not None else None
            return [port_out(p) for p in ops.list_objects(
                s, c, m.Port, name=name, network_id=network_id, node_id=node_id, router_id=router_id,
                limit=limit, marker=marker)]
        return store.read(run)

    @r.post("/ports", response_model=sc.PortOut, status_code=201, tags=["ports"])
    def create_port(body: sc.PortCreate, c: Caller = who):
        fixed = None if body.fixed_ips is None else [f.model_dump() for f in body.fixed_ips]
        return store.write(lambda s: port_out(ops.create_port(
            s, c, network_id=body.network_id, name=body.name, mac_address=body.mac_address,
            fixed_ips=fixed, node=body.node, interface_name=body.interface_name,
            port_security=body.port_security, project_id=body.project_id)))

    @r.get("/ports/{port_id}", response_model=sc.PortOut, tags=["ports"])
    def show_port(port_id: int, c: Caller = who):
        return store.read(lambda s: port_out(ops.get(s, c, m.Port, port_id)))

    @r.patch("/ports/{port_id}", response_model=sc.PortOut, tags=["ports"])
    def update_port(port_id: int, body: sc.PortUpdate, c: Caller = who):
        return store.write(lambda s: port_out(ops.update_port(s, c, port_id, body.given())))

    @r.delete("/ports/{port_id}", status_code=204, tags=["ports"])
    def delete_port(port_id: int, c: Caller = who):
        store.write(lambda s: ops.delete_port(s, c, port_id))
        return Response(status_code=204)

    @r.get("/ports/{port_id}/status", response_model=sc.StatusOut, tags=["ports"])
    def port_status(port_id: int, c: Caller = who):
        return store.read(lambda s: status_out("port", ops.get(s, c, m.Port, port_id)))

    # -- routers and their interfaces

    @r.get("/routers", response_model=list[sc.RouterOut], tags=["routers"])
    def list_routers(c: Caller = who, name: str | None = None, limit: int = LIMIT, marker: int | None = MARKER):
        return store.read(lambda s: [router_out(s, x) for x in ops.list_objects(
            s, c, m.Router, name=name, limit=limit, marker=marker)])

    @r.post("/routers", response_model=sc.RouterOut, status_code=201, tags=["routers"])
    def create_router(body: sc.RouterCreate, c: Caller = who):
        _gateway_node_admin(c, body.gateway_node)

        def run(s):
            router = ops.create_router(s, c, name=body.name, project_id=body.project_id)
            if body.mode != "distributed" or body.gateway_node is not None:   # issue 7
                fabric_ops.set_router_mode(s, router, body.mode, body.gateway_node)
            return router_out(s, router)
        return store.write(run)

    @r.get("/routers/{router_id}", response_model=sc.RouterOut, tags=["routers"])
    def show_router(router_id: int, c: Caller = who):
        return store.read(lambda s: router_out(s, ops.get(s, c, m.Router, router_id)))

    @r.patch("/routers/{router_id}", response_model=sc.RouterOut, tags=["routers"])
    def update_router(router_id: int, body: sc.RouterUpdate, c: Caller = who):
        _gateway_node_admin(c, body.gateway_node)

        def run(s):
            router = _rename(s, c, m.Router, router_id, body)
            if body.mode is not None:   # issue 7: move the router (docs/fabric.md)
                fabric_ops.set_router_mode(s, router, body.mode, body.gateway_node)
            elif body.gateway_node is not None:
                fabric_ops.set_router_mode(s, router, fabric_ops.get_mode(s, router).mode, body.gateway_node)
            return router_out(s, router)
        return store.write(run)

    @r.delete("/routers/{router_id}", status_code=204, tags=["routers"])
    def delete_router(router_id: int, c: Caller = who):
        store.write(lambda s: ops.delete_router(s, c, router_id))
        return Response(status_code=204)

    @r.get("/routers/{router_id}/status", response_model=sc.StatusOut, tags=["routers"])
    def router_status(router_id: int, c: Caller = who):
        return store.read(lambda s: status_out("router", ops.get(s, c, m.Router, router_id)))

    @r.get("/routers/{router_id}/interfaces", response_model=list[sc.RouterInterfaceOut],
           tags=["routers"])
    def list_interfaces(router_id: int, c: Caller = who, limit: int = LIMIT, marker: int | None = MARKER):
        def run(s):
            router = ops.get(s, c, m.Router, router_id)
            return [interface_out(p) for p in ops.router_interfaces(s, router.id)
                    if marker is None or p.id > marker][:limit]
        return store.read(run)

    @r.post("/routers/{router_id}/interfaces", response_model=sc.RouterInterfaceOut,
            status_code=201, tags=["routers"])
    def add_interface(router_id: int, body: sc.RouterInterfaceCreate, c: Caller = who):
        return store.write(lambda s: interface_out(ops.add_router_interface(
            s, c, router_id, subnet_id=body.subnet_id, ip_address=body.ip_address)))

    @r.delete("/routers/{router_id}/interfaces/{subnet_id}", status_code=204, tags=["routers"])
    def remove_interface(router_id: int, subnet_id: int, c: Caller = who):
        store.write(lambda s: ops.remove_router_interface(s, c, router_id, subnet_id))
        return Response(status_code=204)

    return r


def _gateway_node_admin(c: Caller, gateway_node: str | None) -> None:
    """Which node routes is the operator's choice (and naming one would tell which nodes exist)."""
    if gateway_node is not None and not c.admin:
        raise Forbidden("only an admin can choose a router's gateway_node", "gateway_node")


def _str(value: ipaddress.IPv4Address | None) -> str | None:
    return None if value is None else str(value)


def _rename(s: Session, c: Caller, model, object_id: int, body) -> object:
    obj = ops.get(s, c, model, object_id)
    if "name" in body.model_fields_set:
        obj.name = body.name
    s.flush()
    return obj

