"""Flow records in the controller: the sampling rates, what the nodes' agents deliver, the queries
and the Prometheus counters (docs/flow-records.md; ids and rates: fathom.model.flow_records).

    GET    /v1/flow-records/config       the rates the caller may see (a project's and its ports')
    PUT    /v1/flow-records/config       set the rates of a project, or of one port (`port_id`)
    DELETE /v1/flow-records/config       ?project_id= | ?port_id=  back to off (a port: its project's)
    GET    /v1/flow-records/export       admins: the external IPFIX collector records are forwarded to
    PUT    /v1/flow-records/export       admins: forward to {host, port} (fathom.api.flow_export)
    DELETE /v1/flow-records/export       admins: stop forwarding
    POST   /v1/flow-records/ingest       a node's agent (its agent token): one interval's records
    GET    /v1/flow-records              ?project=&port=&network=&rule=&chain=&kind=&since=&view=records|top|drops
                                         &scope=cluster|local (a cluster's replicas, or this one's)

Who may do what: members set and read their own project's rates and records; admins any
project's. A member's ingress and admit rates are at most one in MEMBER_MIN_RATE packets (every
sampled packet costs ovs-vswitchd an upcall on the host); drops may be sampled 1:1 by anyone.

A node's agent posts a batch packed in columns (fathom.model.flow_batch), checked whole with one
bound per column; no object is made per record but the kept tuple. Ingestion trusts the model,
not the record: a record is kept only when the port it names (the
observation point's, or for an admission the port holding the record's address on that node)
is bound to the reporting node, and an admitting rule only when it is a rule of one of that
port's groups; what left through the tunnel only when its source is one of the node's ports, the
port the point names is on another node, and both are of one project; anything else is refused
and counted (`fathom_flow_records_refused_total`).
Counts are OVS's, which counts a sample as the packets it stands for (fathom.model.flow_records);
the packets really sampled are derived from the rate configured now (IPFIX carries none). Records are kept in memory,
at most FATHOM_FLOW_RECORDS_MAX (default 200000, oldest out first) and FATHOM_FLOW_RECORDS_RETENTION
seconds (default 3600); each node delivers at most FATHOM_FLOW_RECORDS_RATE records/s (default
5000, bursts of twice that; beyond: 429 and Retry-After).
In a cluster, a query asks the other live replicas for their own records (`scope=local`, with a
token this replica issues itself for it: fathom.auth.tokens.ReplicaToken; the caller's right was
checked here, and its project is asked for) within FATHOM_FLOW_RECORDS_PEER_TIMEOUT seconds
(default 2) and merges them; `partial` names those that did not answer.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import os
import threading
import time
from collections import defaultdict, deque
from typing import Annotated, Callable, Literal

import httpx
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import delete, select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from fathom.api.auth import agent_identity, caller_or_replica
from fathom.api.flow_export import Exporter
from fathom.api.deps import ERRORS, CallerDep, EngineDep, StoreDep
from fathom.api.schemas import ErrorOut
from fathom.auth import Identity
from fathom.auth.tokens import ReplicaToken
from fathom.model import flow_batch as fb
from fathom.model import flow_records as fr
from fathom.model.chains import SFC_VNI_BASE, parse_hop_marker
from fathom.store import models as m
from fathom.store import sfc_models as sfc
from fathom.store.db import READ_ONLY
from fathom.store.errors import Forbidden, Invalid, NotFound
from fathom.store.flow_records_models import FlowRecordExport, FlowSampling
from fathom.store.ops import Caller

router = APIRouter(prefix="/flow-records", tags=["flow records"], responses=ERRORS)

MEMBER_MIN_RATE = 100
Rate = Annotated[int, Field(ge=0, le=fr.RATE_MAX, description="one in N packets; 0 = off")]


class ConfigIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    project_id: str | None = Field(None, min_length=1, max_length=64,
                                   description="the project (default: the caller's); not with port_id")
    port_id: int | None = Field(None, ge=1, le=fr.ID_MASK, description="one port's rates instead of its project's")
    ingress: Rate = 0
    admit: Rate = 0
    drop: Rate = 0


# ---------------------------------------------------------------------------------------------- config


def _config_out(r: FlowSampling) -> dict:
    return {"project_id": r.project_id, "port_id": r.port_id, "ingress": r.ingress, "admit": r.admit, "drop": r.drop}


def _scope(s: Session, c: Caller, project_id: str | None, port_id: int | None) -> tuple[str, str, int | None]:
    """(scope key, project, port id) of a config row the caller may write or remove."""
    if port_id is not None:
        if project_id is not None:
            raise Invalid("give project_id or port_id, not both", "port_id")
        port = s.get(m.Port, port_id)
        if port is None or port.router_id is not None or (not c.admin and port.project_id != c.project):
            raise NotFound(f"port {port_id} does not exist", "port_id")
        return f"port:{port_id}", port.project_id, port_id
    project = project_id or c.project
    if project != c.project and not c.admin:
        raise Forbidden("only an admin can set another project's flow records", "project_id")
    return f"project:{project}", project, None


@router.get("/config", summary="Sampling rates: the caller's project's and its ports' (admins: all)")
def get_config(c: CallerDep, db: StoreDep):
    def read(s):
        q = select(FlowSampling).order_by(FlowSampling.id)
        if not c.admin:
            q = q.where(FlowSampling.project_id == c.project)
        return [_config_out(r) for r in s.scalars(q)]
    return db.read(read)


@router.put("/config", summary="Set a project's (or one port's) sampling rates")
def put_config(body: ConfigIn, c: CallerDep, db: StoreDep):
    if not c.admin:
        for name in ("ingress", "admit"):
            value = getattr(body, name)
            if 0 < value < MEMBER_MIN_RATE:
                raise Invalid(f"{name}: at most one in {MEMBER_MIN_RATE} packets (only an admin may sample "
                              f"more)", name)

    def write(s):
        scope, project, port_id = _scope(s, c, body.project_id, body.port_id)
        row = s.scalar(select(FlowSampling).where(FlowSampling.scope == scope))
        if row is None:
            row = FlowSampling(scope=scope, project_id=project, port_id=port_id)
            s.add(row)
        row.ingress, row.admit, row.drop = body.ingress, body.admit, body.drop
        s.flush()
        return _config_out(row)
    return db.write(write)


@router.delete("/config", summary="Sampling of a project or port back to off (a port: its project's)")
def delete_config(c: CallerDep, db: StoreDep, project_id: str | None = Query(None, min_length=1, max_length=64),
                  port_id: int | None = Query(None, ge=1, le=fr.ID_MASK)):
    def write(s):
        scope, _, _ = _scope(s, c, project_id, port_id)
        s.execute(delete(FlowSampling).where(FlowSampling.scope == scope))
        return {"deleted": scope}
    return db.write(write)


# ---------------------------------------------------------------------------------------------- records


# A kept record is a tuple (owner, *FIELDS); its owner, a tuple of OWNER, is shared by the records
# of its batch, observation point and addresses (a chain: (id, direction, group_index) or None).
# Plain tuples of numbers and text, not dicts: one costs a fraction of a dict to make and hold, and
# the garbage collector stops tracking it (a dict would keep every record holding it tracked, and
# each full collection would walk all FATHOM_FLOW_RECORDS_MAX of them).
OWNER = ("time", "interval_end", "node", "project", "network_id", "port_id", "port", "kind", "point", "rule",
         "chain", "remote_node", "rate")
FIELDS = ("src", "dst", "proto", "sport", "dport", "packets", "bytes", "sampled_packets", "first", "last")
TIME = OWNER.index("time")


def owner_dict(owner: tuple) -> dict:
    out = dict(zip(OWNER, owner))
    if out["chain"] is not None:
        out["chain"] = dict(zip(("id", "direction", "group_index"), out["chain"]))
    return out


def as_dict(record: tuple) -> dict:
    """A kept record as the API shows it."""
    return {**owner_dict(record[0]), **dict(zip(FIELDS, record[1:]))}


class RecordStore:
    """The records kept in memory (bounded by count and age) and the nodes' delivery rate."""

    def __init__(self, env=os.environ):
        self.max = int(env.get("FATHOM_FLOW_RECORDS_MAX", 200_000))
        self.retention = float(env.get("FATHOM_FLOW_RECORDS_RETENTION", 3600))
        self.rate = float(env.get("FATHOM_FLOW_RECORDS_RATE", 5000))
        self.burst = 2 * self.rate
        self.records: deque[tuple] = deque(maxlen=self.max)
        self.exporter = Exporter()          # to the configured collector, if any
        # the other live replicas of the cluster (id -> API address; set by the controller) and the
        # seconds they have to answer a query
        self.peers: Callable[[], dict[str, str]] = dict
        self.peer_timeout = float(env.get("FATHOM_FLOW_RECORDS_PEER_TIMEOUT", 2))
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def admit(self, node: str, n: int) -> None:
        """Raise 429 unless `node` may deliver `n` records now (a token bucket per node). A full
        bucket takes a batch larger than the burst and goes into debt, so an agent's full batch
        passes whatever the rate is set to."""
        with self._lock:
            now = time.monotonic()
            tokens, at = self._buckets.get(node, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if n > tokens and (tokens < self.burst or self.rate <= 0):
                self._buckets[node] = (tokens, now)
                wait = (n - tokens) / self.rate if self.rate > 0 else 60.0
                raise HTTPException(429, detail=[{"loc": [], "msg": f"node {node} delivers more than {self.rate:g} "
                                                  "flow records/s: retry later", "type": "rate_limited"}],
                                    headers={"Retry-After": str(max(1, math.ceil(wait)))})
            self._buckets[node] = (tokens - n, now)

    def add(self, records: list[tuple]) -> None:
        with self._lock:
            self.records.extend(records)
            self._expire()

    def _expire(self) -> None:
        cutoff = time.time() - self.retention
        while self.records and self.records[0][0][TIME] < cutoff:
            self.records.popleft()

    def select(self, since: float, match) -> list[tuple[dict, tuple]]:
        """(owner as a dict, record) of the records filed since `since` whose owner `match`es
        (asked once per owner)."""
        with self._lock:
            self._expire()
            owners: dict[int, dict | None] = {}
            out = []
            for r in self.records:
                if id(r[0]) not in owners:
                    owner = owner_dict(r[0])
                    owners[id(r[0])] = owner if owner["time"] >= since and match(owner) else None
                if owners[id(r[0])] is not None:
                    out.append((owners[id(r[0])], r))
            return out


_metrics_lock = threading.Lock()
_metrics: dict | None = None


def metrics() -> dict:
    """Counters on prometheus_client's default registry (the one /metrics serves), once per process."""
    global _metrics
    with _metrics_lock:
        if _metrics is None:
            from prometheus_client import Counter
            _metrics = {
                "bytes": Counter("fathom_flow_records_bytes", "Bytes flow records account for (scaled by "
                                 "the sampling rate), per project and kind", ["project", "kind"]),
                "packets": Counter("fathom_flow_records_packets", "Packets flow records account for (scaled), "
                                   "per project and kind", ["project", "kind"]),
                "drops": Counter("fathom_flow_records_dropped_packets", "Packets security groups dropped, as "
                                 "sampled (scaled), per project", ["project"]),
                "refused": Counter("fathom_flow_records_refused", "Records a node delivered that the controller "
                                   "did not keep, per node and reason", ["node", "reason"]),
            }
        return _metrics


async def records_store(request: Request) -> RecordStore:   # a coroutine: no thread-pool hop
    return request.app.state.flow_records


RecordStoreDep = Annotated[RecordStore, Depends(records_store)]


# ---------------------------------------------------------------------------------------------- export


class ExportIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host: ipaddress.IPv4Address | ipaddress.IPv6Address = Field(description="the collector's IP address")
    port: int = Field(4739, ge=1, le=0xFFFF, description="its UDP port")


def _admin(c: Caller) -> None:
    if not c.admin:
        raise Forbidden("only an admin can see or set where flow records are exported", "host")


def _export_out(row: FlowRecordExport | None, store: RecordStore) -> dict:
    return {"host": row.host if row else None, "port": row.port if row else None,
            "sent": dict(store.exporter.counters)}


@router.get("/export", summary="Admins: the external IPFIX collector filed records are forwarded to")
def get_export(c: CallerDep, db: StoreDep, store: RecordStoreDep):
    _admin(c)
    return db.read(lambda s: _export_out(s.get(FlowRecordExport, 1), store))


@router.put("/export", summary="Admins: forward filed records as IPFIX (UDP) to a collector")
def put_export(body: ExportIn, c: CallerDep, db: StoreDep, store: RecordStoreDep):
    _admin(c)
    if body.host.is_unspecified or body.host.is_multicast:
        raise Invalid("a collector's address is one host's (not unspecified, not multicast)", "host")

    def write(s):
        row = s.get(FlowRecordExport, 1) or FlowRecordExport(id=1)
        row.host, row.port = str(body.host), body.port
        s.add(row)
        s.flush()
        return _export_out(row, store)
    return db.write(write)


@router.delete("/export", summary="Admins: stop forwarding flow records")
def delete_export(c: CallerDep, db: StoreDep, store: RecordStoreDep):
    _admin(c)

    def write(s):
        s.execute(delete(FlowRecordExport))
        return _export_out(None, store)
    return db.write(write)


def _node_view(engine, node: str, rule_ids: set[int], chain_ids: set[int] = frozenset(),
               remote_ids: set[int] = frozenset()) -> tuple[
        dict, dict, dict, dict, dict, fr.SamplingIndex, tuple[str, int] | None]:
    """What a node's records are checked against: its ports (id -> facts), address -> port id, the
    named rules (id -> group id), the named chains that have a port on this node (id -> project),
    the ports on other nodes frames left through the tunnel for (id -> project, network id, node)
    and the sampling rates; and the collector the records are exported to, if any."""
    with Session(engine) as s, s.begin():
        s.connection(execution_options=READ_ONLY)
        ports, by_ip, addresses = {}, {}, {}        # addresses: as stored -> canonical text
        # one row per port, address and group (a port has few of each)
        for port_id, name, project, network_id, ip, group_id in s.execute(
                select(m.Port.id, m.Port.name, m.Port.project_id, m.Port.network_id, m.IpAllocation.ip_address,
                       m.PortSecurityGroup.group_id)
                .join(m.Node, m.Node.id == m.Port.node_id)
                .outerjoin(m.IpAllocation, m.IpAllocation.port_id == m.Port.id)
                .outerjoin(m.PortSecurityGroup, m.PortSecurityGroup.port_id == m.Port.id)
                .where(m.Node.name == node, m.Port.router_id.is_(None))):
            port = ports.get(port_id) or ports.setdefault(port_id, {
                "id": port_id, "name": name, "project": project, "network_id": network_id, "ips": set(),
                "groups": set()})
            if ip is not None:
                text = addresses.get(ip) or addresses.setdefault(ip, str(ipaddress.ip_address(ip)))
                port["ips"].add(text)
                by_ip[text] = port_id
            if group_id is not None:
                port["groups"].add(group_id)
        rules = {}
        if rule_ids:
            rules = {r.id: r.group_id for r in s.execute(
                select(m.SecurityGroupRule.id, m.SecurityGroupRule.group_id)
                .where(m.SecurityGroupRule.id.in_(list(rule_ids))))}
        chains = {}
        if chain_ids and ports:
            # a chain's hop flows are on the nodes of its classifiers' ports and of its VNF instances
            here = list(ports)
            on_node = {cid for cid, in s.execute(
                select(sfc.FlowClassifier.chain_id).where(sfc.FlowClassifier.chain_id.in_(list(chain_ids)))
                .where(sfc.FlowClassifier.logical_source_port_id.in_(here)
                       | sfc.FlowClassifier.logical_destination_port_id.in_(here)))}
            on_node |= {cid for cid, in s.execute(
                select(sfc.PortPairGroup.chain_id).join(sfc.PortPair, sfc.PortPair.group_id == sfc.PortPairGroup.id)
                .where(sfc.PortPairGroup.chain_id.in_(list(chain_ids)))
                .where(sfc.PortPair.ingress_port_id.in_(here) | sfc.PortPair.egress_port_id.in_(here)))}
            chains = {c.id: c.project_id for c in s.execute(
                select(sfc.PortChain.id, sfc.PortChain.project_id).where(sfc.PortChain.id.in_(list(on_node))))}
        remote = {}
        if remote_ids:
            remote = {r.id: (r.project_id, r.network_id, r.name) for r in s.execute(
                select(m.Port.id, m.Port.project_id, m.Port.network_id, m.Node.name)
                .join(m.Node, m.Node.id == m.Port.node_id)
                .where(m.Port.id.in_(list(remote_ids)), m.Node.name != node, m.Port.router_id.is_(None)))}
        projects = {p["project"] for p in ports.values()} | set(chains.values()) | {r[0] for r in remote.values()}
        sampling = fr.SamplingIndex(fr.FlowSampling(*row) for row in s.execute(
            select(FlowSampling.id, FlowSampling.project_id, FlowSampling.port_id, FlowSampling.ingress,
                   FlowSampling.admit, FlowSampling.drop).where(FlowSampling.project_id.in_(list(projects))))
                                    ) if projects else fr.SamplingIndex(())
        export = s.execute(select(FlowRecordExport.host, FlowRecordExport.port).where(FlowRecordExport.id == 1)).first()
        collector = (export.host, export.port) if export else None
    return ports, by_ip, rules, chains, remote, sampling, collector


def hop_of(point: int) -> tuple[int, int, int] | None:
    """(chain id, direction, group index) a chain-hop observation point names, or None."""
    kind, oid = fr.parse_point(point)
    hop = parse_hop_marker(SFC_VNI_BASE | oid) if kind == fr.CHAIN_HOP and oid <= fr.HOP_MASK else None
    return hop if hop is not None and hop[0] > 0 else None


def file_records(node: str, batch: fb.Batch, ports: dict, by_ip: dict, rules: dict, chains: dict, remote: dict,
                 sampling: fr.SamplingIndex, refused: dict) -> list[tuple]:
    """The batch's records that name this node's own ports (and their rules), a hop of a chain
    with a port on this node, or a port on another node this node's port sent to through the
    tunnel, with their owners from the model; the others counted in `refused` by reason. A
    record's owner follows from its point and addresses alone: it is worked out once per (point,
    src, dst) of the batch."""
    filed = (time.time(), batch.interval_end, node)     # the controller's time: a node's clock is not trusted
    addresses = batch.addresses
    owners: dict[tuple[int, int, int], tuple[tuple, int] | str] = {}
    out = []
    for point, src, dst, proto, sport, dport, packets, nbytes, first, last in batch.records():
        owner = owners.get((point, src, dst))
        if owner is None:
            owner = owners[(point, src, dst)] = _owner(filed, point, addresses[src], addresses[dst], ports, by_ip,
                                                       rules, chains, remote, sampling)
        if type(owner) is str:
            refused[owner] = refused.get(owner, 0) + 1
            continue
        fields, weight = owner
        out.append((fields, addresses[src], addresses[dst], proto, sport, dport, packets, nbytes, packets // weight,
                    first / 1000, last / 1000))
    return out


def _owner(filed: tuple, point: int, src: str, dst: str, ports: dict, by_ip: dict, rules: dict, chains: dict,
           remote: dict, sampling: fr.SamplingIndex) -> tuple[tuple, int] | str:
    """(the owner of a record of `point` from `src` to `dst`, filed as `filed` (time, interval_end,
    node), and the packets a sample counts as), or why such a record is refused."""
    kind, oid = fr.parse_point(point)
    rule = hop = remote_node = None
    if kind == fr.TUNNEL_EGRESS:
        # to a port on another node (the point's), from this node's port holding the source
        # address, of the same project: the tunnel flow samples at that project's rate, and a
        # project sees nothing another project's port sent
        if oid not in remote:
            return "not_remote"
        project, network_id, remote_node = remote[oid]
        sender = ports.get(by_ip.get(src))
        if sender is None:
            return "not_this_node"
        if sender["project"] != project:
            return "other_project"
        rate = sampling.ingress(project) or 1
        return filed + (project, network_id, sender["id"], sender["name"], fr.KINDS[kind], point, None, None,
                        remote_node, rate), fr.weight(rate)
    if kind == fr.CHAIN_HOP:
        hop = hop_of(point)
        if hop is None:
            return "point"
        project = chains.get(hop[0])
        if project is None:
            return "not_this_node"
        sender = ports.get(by_ip.get(src))      # the port that sent it into the chain, if here and the chain's
        port = sender if sender is not None and sender["project"] == project else \
            {"id": None, "name": None, "project": project, "network_id": None}
        rate = sampling.ingress(project) or 1
    elif kind in (fr.ADMIT_EGRESS, fr.ADMIT_INGRESS):
        port = ports.get(by_ip.get(src if kind == fr.ADMIT_EGRESS else dst))
        if port is not None and rules.get(oid) not in port["groups"]:
            return "rule"
        rule = oid
    elif kind in (fr.DROP_EGRESS, fr.DROP_INGRESS, fr.PORT_INGRESS):
        port = ports.get(oid)
        if port is not None and kind != fr.DROP_INGRESS and src not in port["ips"]:
            port = None         # what a port sends carries its own address (port security)
        rule = fr.DEFAULT_DROP if kind in (fr.DROP_EGRESS, fr.DROP_INGRESS) else None
    else:
        return "point"
    if port is None:
        return "not_this_node"
    if hop is None:
        rates = sampling.of_port(port["id"], port["project"])
        rate = {fr.PORT_INGRESS: rates.ingress, fr.ADMIT_EGRESS: rates.admit, fr.ADMIT_INGRESS: rates.admit}.get(
            kind, rates.drop) or 1
    return filed + (port["project"], port["network_id"], port["id"], port["name"], fr.KINDS[kind], point, rule, hop,
                    remote_node, rate), fr.weight(rate)


async def batch_body(request: Request) -> bytes:
    """The body of a batch: fathom.model.flow_batch's format only (415 otherwise)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != fb.CONTENT_TYPE:
        raise HTTPException(415, detail=[{"loc": ["header", "content-type"], "msg": f"a batch of flow records is "
                                          f"{fb.CONTENT_TYPE}", "type": "unsupported_media_type"}])
    return await request.body()


@router.post("/ingest", summary="A node's agent delivers one interval's flow records",
             description=f"The body is one batch in `{fb.CONTENT_TYPE}` (fathom/model/flow_batch.py): at most "
                         f"{fb.MAX_RECORDS} records. The records are filed under the token's node.",
             openapi_extra={"requestBody": {"required": True, "content": {
                 fb.CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}}}},
             responses={429: {"model": ErrorOut, "description": "over the node's rate: retry after Retry-After s"}})
def ingest(engine: EngineDep, store: RecordStoreDep, who: Identity = Depends(agent_identity),
           body: bytes = Depends(batch_body)):
    try:
        batch = fb.decode(body)
    except fb.BadBatch as e:
        raise Invalid(str(e), e.field) from None
    store.admit(who.node, len(batch))
    points = set(batch.columns[0])
    rule_ids = {oid for kind, oid in map(fr.parse_point, points) if kind in (fr.ADMIT_EGRESS, fr.ADMIT_INGRESS)}
    chain_ids = {hop[0] for p in points if (hop := hop_of(p))}
    remote_ids = {oid for kind, oid in map(fr.parse_point, points) if kind == fr.TUNNEL_EGRESS}
    ports, by_ip, rules, chains, remote, sampling, collector = _node_view(engine, who.node, rule_ids, chain_ids,
                                                                         remote_ids)
    refused: dict[str, int] = {}
    kept = file_records(who.node, batch, ports, by_ip, rules, chains, remote, sampling, refused)
    store.add(kept)
    if collector is not None and kept:
        store.exporter.send(collector, [as_dict(r) for r in kept])
    mt = metrics()
    sums: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    project, kind = OWNER.index("project"), OWNER.index("kind")
    for owner, *_, packets, nbytes, _, _, _ in kept:
        s = sums[(owner[project], owner[kind])]
        s[0] += nbytes
        s[1] += packets
    for (project, kind), (nbytes, packets) in sums.items():
        mt["bytes"].labels(project, kind).inc(nbytes)
        mt["packets"].labels(project, kind).inc(packets)
        if kind.startswith("drop"):
            mt["drops"].labels(project).inc(packets)
    for reason, n in refused.items():
        mt["refused"].labels(who.node, reason).inc(n)
    return {"received": len(batch), "accepted": len(kept), "refused": sum(refused.values()),
            "refused_by_reason": refused}


# A replica of a cluster answers with the records of every live replica (docs/ha.md): it checks
# the caller's right, then asks the others for their own (`scope=local`) of the caller's project
# (all, for an admin) with a token of its own (role `replica`, naming no node).
MAX_PEERS = 16                  # replicas asked; more are named as not asked
PEER_ANSWER_MAX = 2 << 20       # bytes of one replica's answer (1000 records are about 600 KB)
LIMIT_MAX = 1000
DROPS_KEY = ("project", "port_id", "port", "rule", "kind")
TOP_KEY = ("project", "port_id", "port", "src", "dst", "proto", "dport")


@router.get("", summary="Flow records: each interval's records, top talkers or drops by rule",
            description="In a cluster, the records of every live replica (`scope=local`: this replica's own); "
                        "`partial` names the replicas that did not answer, with why.")
async def get_records(request: Request, store: RecordStoreDep,
                      asker: Annotated[Caller | None, Depends(caller_or_replica)],
                      project: str | None = Query(None, min_length=1, max_length=64,
                                                  description="admins: this project"),
                      port: int | None = Query(None, ge=1), network: int | None = Query(None, ge=1),
                      rule: str | None = Query(None, max_length=32, description="a rule id, or default-drop"),
                      chain: int | None = Query(None, ge=1, description="records of this chain's hops"),
                      kind: Literal["admit-egress", "admit-ingress", "drop-egress", "drop-ingress", "port-ingress",
                                    "chain-hop", "tunnel-egress", "drop", "admit"] | None = None,
                      remote_node: str | None = Query(None, min_length=1, max_length=64,
                                                      description="tunnel-egress records to this node"),
                      since: float = Query(300, gt=0, le=86400 * 7, description="seconds back from now"),
                      view: Literal["records", "top", "drops"] = "records",
                      limit: int = Query(100, ge=1, le=LIMIT_MAX),
                      scope: Literal["cluster", "local"] = Query("cluster", description="local: this replica's "
                                                                 "records only (what replicas ask each other)")):
    if asker is None and scope != "local":
        raise Forbidden("a replica's token reads that replica's own records only (scope=local)", "scope")
    c = asker or Caller()    # another replica asks for its caller, whose right it checked: as an admin
    if project is not None and project != c.project and not c.admin:
        raise Forbidden("only an admin can read another project's flow records", "project")
    want_project = project if c.admin else c.project
    if rule is not None and rule != fr.DEFAULT_DROP and not rule.isdigit():
        raise Invalid("rule is a rule id or default-drop", "rule")
    want_rule = rule if rule == fr.DEFAULT_DROP or rule is None else int(rule)
    want_kind = "drop" if view == "drops" else kind

    def match(owner: dict) -> bool:
        return ((want_project is None or owner["project"] == want_project)
                and (port is None or owner["port_id"] == port)
                and (network is None or owner["network_id"] == network) and (rule is None or owner["rule"] == want_rule)
                and (chain is None or (owner["chain"] or {}).get("id") == chain)
                and (remote_node is None or owner["remote_node"] == remote_node)
                and (want_kind is None or owner["kind"] == want_kind or owner["kind"].startswith(want_kind + "-")))

    def local() -> list[dict] | dict[tuple, list[int]]:   # records, or sums per key
        rows = store.select(time.time() - since, match)
        if view == "records":
            return [as_dict(r) for _, r in sorted(rows, key=lambda row: -row[0]["time"])[:limit]]
        return _sums(rows, view)
    peers = sorted(store.peers().items()) if scope == "cluster" else []
    if not peers:
        return await run_in_threadpool(lambda: _merge(view, local(), [], want_project, limit, []))
    # the others' top and drops: as many keys as one may ask for, summed here with this one's
    params = {k: v for k, v in (("project", want_project), ("port", port), ("network", network), ("rule", rule),
                                ("chain", chain), ("kind", kind), ("remote_node", remote_node), ("since", since),
                                ("view", view), ("limit", limit if view == "records" else LIMIT_MAX),
                                ("scope", "local")) if v is not None}
    async with httpx.AsyncClient(timeout=store.peer_timeout, trust_env=False) as client, \
            ReplicaToken(request.app.state.engine, store.peer_timeout + 5.0, name="flow records") as secret:
        headers = {"Authorization": f"Bearer {secret}"}
        mine, *theirs = await asyncio.gather(run_in_threadpool(local), *(
            _ask_replica(client, address, params, headers, store.peer_timeout) for _, address in peers[:MAX_PEERS]))
    partial = [f"{replica}: not asked (a cluster answers for {MAX_PEERS} other replicas at most)"
               for replica, _ in peers[MAX_PEERS:]]
    # parsed and merged in a worker thread: up to 2 MiB of JSON per replica would hold the event loop
    return await run_in_threadpool(_merge, view, mine, list(zip(peers, theirs)), want_project, limit, partial)


def _merge(view: str, mine, theirs: list[tuple[tuple[str, str], bytes | str]], project: str | None, limit: int,
           partial: list[str]) -> dict:
    """The answer of `view` from this replica's rows and the others' answers (their bodies, or why
    there are none: named in `partial`)."""
    rows = mine if view == "records" else [mine]
    for (replica, _), got in theirs:
        if isinstance(got, str):
            partial.append(f"{replica}: {got}")
            continue
        try:
            rows += _checked(json.loads(got), view, project)
        except (KeyError, TypeError, ValueError, RecursionError) as e:
            partial.append(f"{replica}: answered what fathom does not read ({type(e).__name__})")
    return _answer(view, rows, limit, partial)


def _sums(rows: list[tuple[dict, tuple]], view: str) -> dict[tuple, list[int]]:
    """Packets and bytes of `rows` summed per key of `view` (top: what ports sent, per destination;
    drops: per port, rule and where)."""
    sums: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for owner, (_, src, dst, proto, _, dport, packets, nbytes, *_) in rows:
        if view == "top" and owner["kind"] != "port-ingress":
            continue        # what ports send: admissions and drops are counted apart
        head = (owner["project"], owner["port_id"], owner["port"])
        s = sums[head + ((owner["rule"], owner["kind"]) if view == "drops" else (src, dst, proto, dport))]
        s[0] += packets
        s[1] += nbytes
    return sums


def _checked(answer, view: str, project: str | None) -> list:
    """Another replica's answer as rows of this one's (records: dicts; top, drops: one dict of
    sums); only `project`'s when given (a replica checks the token again, and so does this one)."""
    records = [r for r in answer["records"] if project is None or r["project"] == project]
    if view == "records":
        if not all(type(r["time"]) in (int, float) for r in records):
            raise TypeError("time")
        return records
    names = DROPS_KEY if view == "drops" else TOP_KEY
    return [{tuple(r[n] for n in names): [int(r["packets"]), int(r["bytes"])] for r in records}]


def _answer(view: str, rows: list, limit: int, partial: list[str]) -> dict:
    """The answer of `view` from this replica's rows and the others' (records: newest first; top
    and drops: summed per key, most bytes (drops: packets) first)."""
    if view == "records":
        return {"view": view, "records": sorted(rows, key=lambda r: -r["time"])[:limit], "partial": partial}
    sums: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for part in rows:
        for key, (packets, nbytes) in part.items():
            sums[key][0] += packets
            sums[key][1] += nbytes
    names = DROPS_KEY if view == "drops" else TOP_KEY
    order = sorted(sums.items(), key=lambda kv: -(kv[1][0] if view == "drops" else kv[1][1]))[:limit]
    return {"view": view, "records": [{**dict(zip(names, k)), "packets": v[0], "bytes": v[1]} for k, v in order],
            "partial": partial}


async def _ask_replica(client: httpx.AsyncClient, address: str, params: dict, headers: dict,
                       timeout: float) -> bytes | str:
    """Another replica's own records (its answer's body), or why there are none."""
    async def ask():
        async with client.stream("GET", f"{address}/v1/flow-records", params=params, headers=headers) as r:
            if r.status_code != 200:
                return f"answered {r.status_code}"
            body = bytearray()
            async for chunk in r.aiter_bytes():
                body += chunk
                if len(body) > PEER_ANSWER_MAX:
                    return f"answered more than {PEER_ANSWER_MAX} bytes"
        return bytes(body)
    try:
        return await asyncio.wait_for(ask(), timeout)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        return f"did not answer within {timeout:g} s"
    except httpx.HTTPError as e:
        return f"could not be reached at {address} ({type(e).__name__})"
