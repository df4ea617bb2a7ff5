"""REST API of service function chains, as networking-sfc names them: /v1/sfc/port_pairs,
/v1/sfc/port_pair_groups, /v1/sfc/flow_classifiers, /v1/sfc/port_chains (create, list, show,
update, delete each), and `GET /v1/sfc/port_chains/{id}/pptmon`: what PPTMon measured on a chain
with `pptmon` set (per chain, group and port pair). Members are given by id or name.
fathom/store/sfc.py holds the rules; docs/sfc.md
explains the model and the steering.

(No `from __future__ import annotations` here: the routes are made per collection inside `_crud`,
and FastAPI must see their body types as objects, not as names to resolve in this module.)
"""

from datetime import datetime
from typing import Any, Literal, Sequence

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

from fathom.api import pptmon as pptmon_api
from fathom.api.deps import ERRORS, CallerDep, EngineDep, Limit, Marker, StoreDep, Wait, WaitTimeout, shown, utc
from fathom.api.schemas import EXTERNAL_ID
from fathom.model.chains import hop_marker
from fathom.store import sfc as ops
from fathom.store import sfc_models as sm
from fathom.store import agents as agent_store
from fathom.store.ops import MAX_LIMIT, list_objects
from fathom.store.snapshot import load_snapshot

Ref = int | str
PROJECT = Field(default=None, min_length=1, max_length=64)
NAME = Field(default="", max_length=255)


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Create(_Request):
    external_id: str | None = EXTERNAL_ID


class _Out(BaseModel):
    id: int
    external_id: str | None = None
    name: str
    project_id: str
    status: str
    status_reason: str | None
    created_at: datetime


def _common(o) -> dict:
    return dict(id=o.id, external_id=o.external_id, name=o.name, project_id=o.project_id, status=o.status, status_reason=o.status_reason,
                created_at=utc(o.created_at))


# ---------------------------------------------------------------------------------------------- port pairs


class PortPairCreate(_Create):
    name: str = NAME
    ingress: Ref = Field(description="the port traffic enters the VNF on (id or name)")
    egress: Ref = Field(description="the port traffic leaves the VNF on (id or name)")
    project_id: str | None = PROJECT


class NameUpdate(_Request):
    name: str | None = Field(default=None, max_length=255)


class PortPairOut(_Out):
    ingress: int
    egress: int
    port_pair_group: int | None


def pair_out(_s, p: sm.PortPair) -> PortPairOut:
    return PortPairOut(**_common(p), ingress=p.ingress_port_id, egress=p.egress_port_id, port_pair_group=p.group_id)


# ---------------------------------------------------------------------------------------------- groups


class GroupCreate(_Create):
    name: str = NAME
    port_pairs: list[Ref] = Field(max_length=1000, description="the interchangeable VNF instances")
    project_id: str | None = PROJECT


class GroupUpdate(_Request):
    name: str | None = Field(default=None, max_length=255)
    port_pairs: list[Ref] | None = Field(default=None, max_length=1000)


class GroupOut(_Out):
    port_pairs: list[int]
    port_chain: int | None


def group_out(s, g: sm.PortPairGroup) -> GroupOut:
    return groups_out(s, [g])[0]


def groups_out(s, groups: Sequence[sm.PortPairGroup]) -> list[GroupOut]:
    pairs = _members(s, sm.PortPair.group_id, sm.PortPair.id, groups)
    return [GroupOut(**_common(g), port_pairs=pairs[g.id], port_chain=g.chain_id) for g in groups]


# ---------------------------------------------------------------------------------------------- classifiers


Port = int | None


class ClassifierCreate(_Create):
    name: str = NAME
    ethertype: Literal["IPv4"] = "IPv4"
    protocol: int | str | None = Field(default=None, description="tcp, udp, icmp or a number; absent = any")
    source_ip_prefix: str | None = Field(default=None, max_length=64)
    destination_ip_prefix: str | None = Field(default=None, max_length=64)
    source_port_range_min: Port = None
    source_port_range_max: Port = None
    destination_port_range_min: Port = None
    destination_port_range_max: Port = None
    logical_source_port: Ref | None = Field(default=None, description="required: the port whose traffic is classified")
    logical_destination_port: Ref | None = None
    project_id: str | None = PROJECT


class ClassifierOut(_Out):
    ethertype: str
    protocol: int | None
    source_ip_prefix: str | None
    destination_ip_prefix: str | None
    source_port_range_min: int | None
    source_port_range_max: int | None
    destination_port_range_min: int | None
    destination_port_range_max: int | None
    logical_source_port: int
    logical_destination_port: int | None
    port_chain: int | None


def classifier_out(_s, f: sm.FlowClassifier) -> ClassifierOut:
    return ClassifierOut(**_common(f), ethertype="IPv4", protocol=f.protocol, source_ip_prefix=f.source_ip_prefix,
                         destination_ip_prefix=f.destination_ip_prefix,
                         source_port_range_min=f.source_port_range_min, source_port_range_max=f.source_port_range_max,
                         destination_port_range_min=f.destination_port_range_min,
                         destination_port_range_max=f.destination_port_range_max,
                         logical_source_port=f.logical_source_port_id,
                         logical_destination_port=f.logical_destination_port_id, port_chain=f.chain_id)


# ---------------------------------------------------------------------------------------------- chains


class ChainParameters(_Request):
    symmetric: bool = Field(default=False, description="replies go back through the same instances")
    correlation: Literal[None] = Field(default=None, description="no chain header: VNFs see ordinary packets")


class ChainPptmon(_Request):
    period_ns: int = Field(default=10**9, ge=0, le=ops.MAX_PERIOD_NS,
                           description="the first group samples one packet every period_ns (0: every packet)")


PPTMON = Field(default=None, description="PPTMon on every VNF of the chain (docs/sfc.md); null: off")


class ChainCreate(_Create):
    name: str = NAME
    port_pair_groups: list[Ref] = Field(max_length=1000, description="in path order")
    flow_classifiers: list[Ref] = Field(default_factory=list, max_length=1000)
    chain_parameters: ChainParameters = Field(default_factory=ChainParameters)
    pptmon: ChainPptmon | None = PPTMON
    project_id: str | None = PROJECT


class ChainUpdate(_Request):
    name: str | None = Field(default=None, max_length=255)
    port_pair_groups: list[Ref] | None = Field(default=None, max_length=1000)
    flow_classifiers: list[Ref] | None = Field(default=None, max_length=1000)
    pptmon: ChainPptmon | None = PPTMON


class ChainOut(_Out):
    port_pair_groups: list[int]
    flow_classifiers: list[int]
    chain_parameters: dict[str, Any]
    pptmon: dict[str, int] | None
    chain_id: int
    hop_markers: list[int]     # VNIs of the chain's hops between nodes (forward, then replies)


def chain_out(s, c: sm.PortChain) -> ChainOut:
    return chains_out(s, [c])[0]


def _chain_out(c: sm.PortChain, group_ids: list[int], classifier_ids: list[int]) -> ChainOut:
    """`group_ids`: the chain's groups in path order."""
    markers = [hop_marker(c.id, d, k) for d in ((0, 1) if c.symmetric else (0,)) for k in range(len(group_ids))] \
        if c.id <= ops.MAX_CHAIN_ID and len(group_ids) <= ops.MAX_GROUPS else []
    return ChainOut(**_common(c), port_pair_groups=group_ids, flow_classifiers=classifier_ids,
                    chain_parameters={"symmetric": c.symmetric, "correlation": None}, pptmon=c.pptmon, chain_id=c.id,
                    hop_markers=markers)


def chains_out(s, chains: Sequence[sm.PortChain]) -> list[ChainOut]:
    groups = _members(s, sm.PortPairGroup.chain_id, sm.PortPairGroup.position, chains)
    classifiers = _members(s, sm.FlowClassifier.chain_id, sm.FlowClassifier.id, chains)
    return [_chain_out(c, groups[c.id], classifiers[c.id]) for c in chains]


def _members(s, parent, order, parents) -> dict[int, list[int]]:
    """The member ids of each of `parents` by parent id, in `order`, read in one statement. `parent`
    is the members' column naming their parent (PortPair.group_id: the port pairs of groups)."""
    members: dict[int, list[int]] = {p.id: [] for p in parents}
    for parent_id, member_id in s.execute(select(parent, parent.class_.id).where(parent.in_(members))
                                          .order_by(order)):
        members[parent_id].append(member_id)
    return members


# ---------------------------------------------------------------------------------------------- routes


router = APIRouter(prefix="/sfc", tags=["sfc"], responses=ERRORS)


def _crud(path: str, model, out, out_model, create_model, update_model, create, update, delete, out_list=None):
    """list, create, show, update, delete of one collection; `out(session, obj)` serialises, and
    `out_list(session, objs)` a list (when given: it reads what the objects' answers need at once)."""
    serialise = out
    serialise_list = out_list or (lambda s, objs: [out(s, o) for o in objs])

    @router.get(f"/{path}", response_model=list[out_model], name=f"list_{path}")
    def list_(c: CallerDep, db: StoreDep, name: str | None = None, external_id: str | None = None,
              limit: Limit = MAX_LIMIT, marker: Marker = None):
        return db.read(lambda s: serialise_list(s, list_objects(s, c, model, name=name, external_id=external_id,
                                                                limit=limit, marker=marker)))

    @router.post(f"/{path}", response_model=out_model, status_code=201, name=f"create_{path}")
    def create_(body: create_model, c: CallerDep, db: StoreDep):
        data = body.model_dump()
        return db.write(lambda s: serialise(s, create(s, c, data)))

    @router.get(f"/{path}/{{object_id}}", response_model=out_model, name=f"show_{path}")
    async def show_(object_id: int, c: CallerDep, db: StoreDep, request: Request, wait: Wait = None,
                    timeout: WaitTimeout = 10.0):
        return await shown(request, lambda: db.read(lambda s: serialise(s, ops.get(s, c, model, object_id))),
                           (path[:-1],), object_id, wait, timeout,
                           check=lambda: db.read(lambda s: ops.get(s, c, model, object_id) and None))

    @router.patch(f"/{path}/{{object_id}}", response_model=out_model, name=f"update_{path}")
    def update_(object_id: int, body: update_model, c: CallerDep, db: StoreDep):
        data = {k: v for k, v in body.model_dump().items() if k in body.model_fields_set}
        return db.write(lambda s: serialise(s, update(s, c, object_id, data)))

    @router.delete(f"/{path}/{{object_id}}", status_code=204, name=f"delete_{path}")
    def delete_(object_id: int, c: CallerDep, db: StoreDep):
        db.write(lambda s: delete(s, c, object_id))
        return Response(status_code=204)


_crud("port_pairs", sm.PortPair, pair_out, PortPairOut, PortPairCreate, NameUpdate,
      ops.create_port_pair, ops.update_port_pair, ops.delete_port_pair)
_crud("port_pair_groups", sm.PortPairGroup, group_out, GroupOut, GroupCreate, GroupUpdate,
      ops.create_port_pair_group, ops.update_port_pair_group, ops.delete_port_pair_group, groups_out)
_crud("flow_classifiers", sm.FlowClassifier, classifier_out, ClassifierOut, ClassifierCreate, NameUpdate,
      ops.create_flow_classifier, ops.update_flow_classifier, ops.delete_flow_classifier)
_crud("port_chains", sm.PortChain, chain_out, ChainOut, ChainCreate, ChainUpdate,
      ops.create_port_chain, ops.update_port_chain, ops.delete_port_chain, chains_out)


@router.get("/port_chains/{object_id}/pptmon", name="port_chain_pptmon",
            summary="PPTMon on a port chain: processing times per chain, group and port pair over a window")
def port_chain_pptmon(object_id: int, c: CallerDep, db: StoreDep, engine: EngineDep,
                      since: str | None = Query(None, description="ns since the epoch, a duration back, ISO 8601"),
                      until: str | None = None,
                      window: str | None = Query(None, description="a duration back from now; default 5m")):
    if since is not None and window is not None:
        raise pptmon_api._bad("query", "window", "give since or window, not both")
    since_ns = pptmon_api.parse_since(since) if since is not None else pptmon_api.parse_since(window or "5m", "window")
    until_ns = pptmon_api.parse_since(until, "until")

    def read(s):
        ops.get(s, c, sm.PortChain, object_id)     # 404 unless the caller's (or an admin)
        return load_snapshot(s), agent_store.agents(s)
    snapshot, agents = db.read(read)
    return pptmon_api.port_chain_stats(engine, snapshot, object_id, agents, since_ns, until_ns)
