"""/v1/nodes: the compute and gateway nodes (admin only)."""
from __future__ import annotations

from fastapi import APIRouter, Request, Response

from fathom.api import schemas as sc
from fathom.api.deps import ERRORS, CallerDep, Limit, Marker, StoreDep, Wait, WaitTimeout, shown, utc
from fathom.store import models as m
from fathom.store import ops

router = APIRouter(prefix="/nodes", tags=["nodes"], responses=ERRORS)


def node_out(n: m.Node) -> sc.NodeOut:
    return sc.NodeOut(id=n.id, name=n.name, role=n.role, tunnel_ip=n.tunnel_ip,
                      management_ip=n.management_ip, datapath_type=n.datapath_type, state=n.state, status=n.status,
                      status_reason=n.status_reason, project_id=n.project_id, created_at=utc(n.created_at))


def status_out(kind: str, obj) -> sc.StatusOut:
    """The `GET /v1/<kind>s/{id}/status` answer of any resource."""
    return sc.StatusOut(kind=kind, id=obj.id, status=obj.status, status_reason=obj.status_reason,
                        state=getattr(obj, "state", None))


def _str(value) -> str | None:
    return None if value is None else str(value)


@router.get("", response_model=list[sc.NodeOut])
def list_nodes(c: CallerDep, db: StoreDep, name: str | None = None, limit: Limit = ops.MAX_LIMIT,
               marker: Marker = None):
    ops.require_admin(c, "see nodes")
    return db.read(lambda s: [node_out(n) for n in ops.list_objects(s, c, m.Node, name=name, limit=limit,
                                                                    marker=marker)])


@router.post("", response_model=sc.NodeOut, status_code=201)
def create_node(body: sc.NodeCreate, c: CallerDep, db: StoreDep):
    return db.write(lambda s: node_out(ops.create_node(
        s, c, name=body.name, role=body.role, tunnel_ip=_str(body.tunnel_ip),
        management_ip=_str(body.management_ip), datapath_type=body.datapath_type)))


@router.get("/{node_id}", response_model=sc.NodeOut)
async def show_node(node_id: int, c: CallerDep, db: StoreDep, request: Request, wait: Wait = None,
                    timeout: WaitTimeout = 10.0):
    ops.require_admin(c, "see nodes")
    return await shown(request, lambda: db.read(lambda s: node_out(ops.get(s, c, m.Node, node_id))),
                       ("node",), node_id, wait, timeout)


@router.patch("/{node_id}", response_model=sc.NodeOut)
def update_node(node_id: int, body: sc.NodeUpdate, c: CallerDep, db: StoreDep):
    changes = {k: _str(v) if k.endswith("_ip") else v for k, v in body.given().items()}
    return db.write(lambda s: node_out(ops.update_node(s, c, node_id, changes)))


@router.delete("/{node_id}", status_code=204)
def delete_node(node_id: int, c: CallerDep, db: StoreDep):
    db.write(lambda s: ops.delete_node(s, c, node_id))
    return Response(status_code=204)


@router.get("/{node_id}/status", response_model=sc.StatusOut)
def node_status(node_id: int, c: CallerDep, db: StoreDep):
    ops.require_admin(c, "see nodes")
    return db.read(lambda s: status_out("node", ops.get(s, c, m.Node, node_id)))
