"""/v1/ports."""
from __future__ import annotations

from fastapi import APIRouter, Request, Response

from fathom.api import schemas as sc
from sqlalchemy import select
from sqlalchemy.orm import joinedload, selectinload

from fathom.api import request_ids
from fathom.api.handoff import in_thread
from fathom.api.deps import ERRORS, CallerDep, answer_with, Limit, Marker, StoreDep, Wait, WaitTimeout, shown, utc
from fathom.api.nodes import status_out
from fathom.store import models as m
from fathom.store import ops
from fathom.store import secgroups
from fathom.store import sfc as sfc_ops
from fathom.store import taps
from fathom.store.base import utcnow
from fathom.store.errors import Conflict

router = APIRouter(prefix="/ports", tags=["ports"], responses=ERRORS)


# what port_out reads beyond a port's row: a list loads it in one query a relationship, not one per
# port; one port (a show, a long-poll's answer) in the same statement as the port
PORT_LOADS = (selectinload(m.Port.fixed_ips), selectinload(m.Port.node), selectinload(m.Port.security_group_links))
PORT_JOINED = (joinedload(m.Port.fixed_ips), joinedload(m.Port.node), joinedload(m.Port.security_group_links))


def port_out(p: m.Port) -> sc.PortOut:
    return sc.PortOut(id=p.id, external_id=p.external_id, name=p.name, project_id=p.project_id, network_id=p.network_id,
                      mac_address=p.mac_address,
                      fixed_ips=[sc.FixedIpOut(subnet_id=a.subnet_id, ip_address=a.ip_address)
                                 for a in p.fixed_ips],
                      node=p.node.name if p.node else None, interface_name=p.interface_name,
                      port_security=p.port_security, security_groups=p.security_group_ids,
                      router_id=p.router_id, status=p.status,
                      status_reason=p.status_reason, created_at=utc(p.created_at))


@router.get("", response_model=list[sc.PortOut])
def list_ports(c: CallerDep, db: StoreDep, name: str | None = None, network_id: int | None = None,
               node: str | None = None, router_id: int | None = None, external_id: str | None = None,
               limit: Limit = ops.MAX_LIMIT, marker: Marker = None):
    def run(s):
        # an unknown node matches no port (no 404: that would tell which nodes exist)
        node_id = (s.scalar(select(m.Node.id).where(m.Node.name == node)) or -1) if node is not None else None
        return [port_out(p) for p in ops.list_objects(
            s, c, m.Port, name=name, network_id=network_id, node_id=node_id, router_id=router_id,
            external_id=external_id, limit=limit, marker=marker, options=PORT_LOADS)]
    return db.read(run)


# The create is a coroutine that runs its one store write on a thread (fathom.api.handoff.in_thread): one
# thread hop for the request (a plain function would take a second one for the response's validation);
# an ordinary creation reaches it without FastAPI's routing (fathom.api.direct). Its response
# is made and recorded with its Idempotency-Key in the write's transaction (request_ids.ANSWERED_BY_WRITE):
# on PostgreSQL, with an address to claim, by the statement that writes the port's rows (ops.AnswerRow:
# the response made before with id 0 and address UNCLAIMED, and cut around them). Its rows are written
# with SQLAlchemy Core or on the driver (ops.insert_port), its answer made from what it wrote. A port
# whose address and groups are chosen for it (the common creation) is written `at_once` on PostgreSQL:
# the checks' read and that one statement, with no BEGIN and COMMIT round trips (Store.write).
CREATED = answer_with(sc.PortOut, 201)
UNCLAIMED = "0.0.0.0"


@router.post("", response_model=sc.PortOut, status_code=201)
async def create_port(body: sc.PortCreate, c: CallerDep, db: StoreDep):
    fixed = None if body.fixed_ips is None else [f.model_dump() for f in body.fixed_ips]

    def create(s):
        new = ops.new_port(s, c, network_id=body.network_id, name=body.name, mac_address=body.mac_address,
                           fixed_ips=fixed, node=body.node, interface_name=body.interface_name,
                           port_security=body.port_security, project_id=body.project_id,
                           external_id=body.external_id, claim_at_insert=body.security_groups is None)
        v = new.values
        groups = secgroups.new_port_groups(s, v["project_id"], v["port_security"], body.security_groups,
                                           new.default_group)
        created = utcnow()
        claimed = [] if new.claim is None else [(new.claim[1].id, UNCLAIMED)]
        out = sc.PortOut(id=0, external_id=v["external_id"], name=v["name"], project_id=v["project_id"],
                         network_id=v["network_id"], mac_address=v["mac_address"],
                         fixed_ips=[sc.FixedIpOut(subnet_id=subnet_id, ip_address=ip)
                                    for subnet_id, ip in new.addresses + claimed],
                         node=new.node.name if new.node is not None else None,
                         interface_name=v["interface_name"], port_security=v["port_security"],
                         security_groups=groups, router_id=v["router_id"], status=v["status"], status_reason=None,
                         created_at=created)
        row = _answer_row(out) if claimed else None
        port_id, _ = ops.insert_port(s, new, groups, created, row)
        if row is not None and row.written:
            return request_ids.Recorded(row.body(port_id, new.addresses[-1][1]), status_code=row.status,
                                        media_type=row.content_type)
        return out.model_copy(update={"id": port_id, "fixed_ips": [
            sc.FixedIpOut(subnet_id=subnet_id, ip_address=ip) for subnet_id, ip in new.addresses]})
    return await in_thread(db.write, create, answer=CREATED,
                           at_once=body.fixed_ips is None and body.security_groups is None)


def _answer_row(out: sc.PortOut) -> ops.AnswerRow | None:
    """The request's key row with CREATED's response of `out` (id 0, its one address UNCLAIMED), for
    the statement that writes the port to fill in; None without a key to take. JSON strings escape
    their quotes: the id's and the address's places are found in the structure, never in a value."""
    pending = request_ids.unclaimed()
    if pending is None:
        return None
    response = CREATED(out)
    head, rest = bytes(response.body).split(b"0", 1)
    before, after = rest.split(b'"ip_address":"%s"' % UNCLAIMED.encode())   # one address: one place
    if head != b'{"id":':
        raise RuntimeError(f"PortOut's JSON no longer starts with its id: {head!r}")
    return ops.AnswerRow(pending.scope, pending.key, pending.fingerprint, response.status_code, response.media_type,
                         head, before + b'"ip_address":"', b'"' + after)


@router.get("/{port_id}", response_model=sc.PortOut)
async def show_port(port_id: int, c: CallerDep, db: StoreDep, request: Request, wait: Wait = None,
                    timeout: WaitTimeout = 10.0):
    def read(s):
        return port_out(ops.get(s, c, m.Port, port_id, options=PORT_JOINED))
    return await shown(request, lambda: db.read(read), ("port", "router_interface"), port_id, wait, timeout,
                       check=lambda: db.read(lambda s: ops.get(s, c, m.Port, port_id) and None))


@router.patch("/{port_id}", response_model=sc.PortOut)
def update_port(port_id: int, body: sc.PortUpdate, c: CallerDep, db: StoreDep):
    changes = body.given()
    groups = changes.pop("security_groups", None)

    def update(s):
        port = ops.update_port(s, c, port_id, changes)
        secgroups.set_port_groups(s, port, groups, creating=False)
        s.flush()
        taps.judge(s, taps.policies_naming(s, port_id))   # a tap policy shows an unbound port at once
        return port_out(port)
    return db.write(update)


@router.delete("/{port_id}", status_code=204)
def delete_port(port_id: int, c: CallerDep, db: StoreDep):
    def run(s):
        ops.get(s, c, m.Port, port_id)
        used = sfc_ops.port_users(s, port_id)
        if used:
            raise Conflict(used)
        naming = taps.policies_naming(s, port_id)
        ops.delete_port(s, c, port_id)
        taps.judge(s, naming)       # the tap policies that named it show the deleted port at once
    db.write(run)
    return Response(status_code=204)


@router.get("/{port_id}/status", response_model=sc.StatusOut)
def port_status(port_id: int, c: CallerDep, db: StoreDep):
    return db.read(lambda s: status_out("port", ops.get(s, c, m.Port, port_id)))
