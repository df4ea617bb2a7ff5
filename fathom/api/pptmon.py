"""PPTMon records in the controller: ingestion, query, stats, retention and
Prometheus histograms.

    POST /v1/pptmon/records            a batch from a node's agent (its agent token): {"node": "...", "records": [...]}
    GET  /v1/pptmon/records            ?chain=&node=&vnf=&since=&until=&limit=  (newest `limit`, oldest first)
    GET  /v1/pptmon/stats              ?chain=&node=&since= | &window=  p50/p90/p99... per VNF and end to end
    GET  /v1/pptmon/chains             chains with records, one entry per reporting node and chain name:
                                       node, counts, first/last time
    GET  /v1/sfc/port_chains/{id}/pptmon  a port chain measured through the API: per chain, group
                                          and port pair (fathom.api.sfc calls `port_chain_stats`)
    POST /v1/pptmon/retention          enforce retention now (it also runs every interval)

Ingestion is idempotent on the record key (fathom.pptmon.records.record_key): the insert is an
`INSERT ... ON CONFLICT (key) DO NOTHING RETURNING key` (SQLite and PostgreSQL), so a retried or
concurrent batch stores and counts each record once; the answer says how many were new and how
many were duplicates. Only new records are observed by the histograms.

Telemetry writes do not call the API's on_change hook (they must not wake the reconciler).

Records of a port chain measured through the API (its `pptmon`; chain name `port_chain:<id>`) are
filed under the chain when the model says the node that delivers them holds the chain's sink
instance of the record's `sink_vnf`; each hop's VNF id is then mapped to its port pair group, port
pair and node from the model (fathom.model.chains), never from the record.

Only a node's agent token may deliver records, for its own node. A chain name is the reporting
node's: records, stats and the Prometheus series carry the node, so one node's reports never mix
into another's chain of the same name (`node=` selects one; without it every node's records of
the name are read). How fast and how many chains per node is bounded by
fathom/api/ingest_limits.py. Reading records is for admins.

Retention (environment of the controller process):
    FATHOM_PPTMON_RETENTION            maximum age of a record by its time_ns (default 7d; 0 = none)
    FATHOM_PPTMON_MAX_RECORDS          keep at most this many, newest by arrival (default 1000000; 0 = none)
    FATHOM_PPTMON_RETENTION_INTERVAL   how often it is enforced (default 60s)
The periodic worker runs while the app is served (router lifespan); POST /v1/pptmon/retention
runs it at once.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from sqlalchemy import Engine, delete, func, select
from sqlalchemy.orm import Session

from fathom.api.auth import agent_identity
from fathom.api.deps import ERRORS, CallerDep, EngineDep, utc
from fathom.api.ingest_limits import IngestLimits, TooMany
from fathom.api.schemas import ErrorOut
from fathom.model.chains import ChainVnf, chain_instances, lost_across, lost_warning, parse_chain_label
from fathom.auth import Identity
from fathom.model import Snapshot
from fathom.store.errors import Forbidden
from fathom.store.snapshot import load_snapshot
from fathom.pptmon.records import PptRecord, RecordBatch, parse_duration
from fathom.pptmon.stats import chain_stats, summarize
from fathom.store.db import READ_ONLY
from fathom.store.ops import require_admin
from fathom.store.pptmon_models import PptmonRecord as Row

LOG = logging.getLogger("fathom.pptmon.api")
MAX_STATS_RECORDS = 200_000      # newest records a stats answer is computed over
DELETE_CHUNK = 10_000


@dataclass
class RetentionConfig:
    max_age_s: float = 7 * 86400.0
    max_records: int = 1_000_000
    interval_s: float = 60.0

    @classmethod
    def from_env(cls, env=os.environ) -> "RetentionConfig":
        c = cls()
        if env.get("FATHOM_PPTMON_RETENTION"):
            c.max_age_s = parse_duration(env["FATHOM_PPTMON_RETENTION"])
        if env.get("FATHOM_PPTMON_MAX_RECORDS"):
            c.max_records = int(env["FATHOM_PPTMON_MAX_RECORDS"])
        if env.get("FATHOM_PPTMON_RETENTION_INTERVAL"):
            c.interval_s = max(0.1, parse_duration(env["FATHOM_PPTMON_RETENTION_INTERVAL"]))
        return c


# ---------------------------------------------------------------------------------------------- metrics

# Bucket bounds in seconds: 1 µs (the resolution of a hop) to 16.7 s (the 24-bit limit).
BUCKETS = (1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 0.1, 1.0, 17.0)
_metrics_lock = threading.Lock()
_metrics: dict | None = None


def metrics() -> dict:
    """The PPTMon metrics on prometheus_client's default REGISTRY (the one /metrics serves).
    Created once per process: several apps in one process (tests) share them."""
    global _metrics
    with _metrics_lock:
        if _metrics is None:
            from prometheus_client import Counter, Histogram
            _metrics = {
                "vnf": Histogram("fathom_pptmon_vnf_processing_seconds",
                                 "Packet processing time of one VNF (PPTMon hop), per chain, reporting node and VNF id",
                                 ["chain", "node", "vnf"], buckets=BUCKETS),
                "chain": Histogram("fathom_pptmon_chain_processing_seconds",
                                   "End-to-end processing time of a chain (sum over its VNFs)",
                                   ["chain", "node"], buckets=BUCKETS),
                "ingested": Counter("fathom_pptmon_records_ingested",
                                    "PPTMon records stored (new keys)", ["chain", "node"]),
                "duplicates": Counter("fathom_pptmon_records_duplicate",
                                      "PPTMon records received again (already stored)", ["chain", "node"]),
                "unknown": Counter("fathom_pptmon_hops_unknown",
                                   "Hops reported without a time (their egress never ran)", ["chain", "node", "vnf"]),
                "expired": Counter("fathom_pptmon_records_expired",
                                   "PPTMon records removed by retention", ["reason"]),
                "sfc_vnf": Histogram("fathom_sfc_pptmon_vnf_processing_seconds",
                                     "Packet processing time of one VNF instance of a port chain measured "
                                     "through the API (labels: chain id, port pair group id, port pair id, node)",
                                     ["chain", "group", "port_pair", "node"], buckets=BUCKETS),
                "sfc_chain": Histogram("fathom_sfc_pptmon_chain_processing_seconds",
                                       "End-to-end processing time of a port chain measured through the API",
                                       ["chain"], buckets=BUCKETS),
            }
        return _metrics


def observe(node: str, records: list[PptRecord], filed: dict[str, int] | None = None,
            chains: dict[int, dict[int, ChainVnf]] | None = None) -> None:
    """Histograms of new records `node` delivered; `filed` (record key -> port chain id) and `chains` (chain id ->
    VNF id -> instance) label the records of port chains by chain, group, port pair and node."""
    m = metrics()
    for r in records:
        chain_id = (filed or {}).get(r.key)
        if chain_id is not None:
            vnfs = chains[chain_id]
            for h in r.hops:
                v = vnfs.get(h.vnf)
                if v is not None and h.ppt_us is not None:
                    m["sfc_vnf"].labels(str(chain_id), str(v.group_id), str(v.pair_id), v.node or "") \
                        .observe(h.ppt_us * 1e-6)
            if r.e2e_us is not None:
                m["sfc_chain"].labels(str(chain_id)).observe(r.e2e_us * 1e-6)
        m["ingested"].labels(r.chain, node).inc()
        for h in r.hops:
            if h.ppt_us is None:
                m["unknown"].labels(r.chain, node, str(h.vnf)).inc()
            else:
                m["vnf"].labels(r.chain, node, str(h.vnf)).observe(h.ppt_us * 1e-6)
        if r.e2e_us is not None:
            m["chain"].labels(r.chain, node).observe(r.e2e_us * 1e-6)


# ---------------------------------------------------------------------------------------------- store work


def _insert(dialect: str):
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        raise RuntimeError(f"PPTMon ingestion supports SQLite and PostgreSQL, not {dialect}")
    return insert


def measured_chains(engine: Engine, records: list[PptRecord]) -> dict[int, dict[int, ChainVnf]]:
    """Port chain id -> VNF id -> instance, from the model, for the port chains the records name."""
    ids = {parse_chain_label(r.chain) for r in records} - {None}
    if not ids:
        return {}
    with Session(engine) as s, s.begin():
        s.connection(execution_options=READ_ONLY)
        snapshot = load_snapshot(s)
    return {cid: {v.vnf_id: v for v in chain_instances(snapshot, cid)} for cid in ids}


def file_under(record: PptRecord, node: str, chains: dict[int, dict[int, ChainVnf]]) -> int | None:
    """The port chain a record belongs to: the one its name says, when `node` (the node that
    delivered it) holds that chain's sink instance of the record's `sink_vnf`; else None."""
    chain_id = parse_chain_label(record.chain)
    sink = chains.get(chain_id, {}).get(record.sink_vnf) if chain_id is not None else None
    ok = sink is not None and sink.node == node and sink.role in ("sink", "source-sink")
    return chain_id if ok else None


def _hop(h, vnf: ChainVnf | None) -> dict:
    out = h.model_dump()
    if vnf is not None:
        out.update(group=vnf.group_id, port_pair=vnf.pair_id, node=vnf.node)
    return out


def ingest(engine: Engine, batch: RecordBatch, now: datetime | None = None,
           chains: dict[int, dict[int, ChainVnf]] | None = None) -> tuple[list[PptRecord], int]:
    """Store the batch; (records that were new, number of duplicates). One transaction. `chains`
    (from `measured_chains`) files the records of port chains measured through the API."""
    unique: dict[str, PptRecord] = {}
    for r in batch.records:
        unique.setdefault(r.key, r)
    if not unique:
        return [], len(batch.records)
    now = now or datetime.now(timezone.utc)
    chains = chains or {}
    filed = {k: file_under(r, batch.node, chains) for k, r in unique.items()}
    rows = [{"key": k, "chain": r.chain, "node": batch.node, "vnf_ns": r.vnf_ns, "placement": r.placement,
             "sink_vnf": r.sink_vnf, "seq": r.seq, "flags": r.flags, "ktime_ns": r.ktime_ns,
             "time_ns": r.time_ns, "vnfs": "," + ",".join(str(h.vnf) for h in r.hops) + ",",
             "hops": [_hop(h, chains[filed[k]].get(h.vnf) if filed[k] is not None else None) for h in r.hops],
             "port_chain_id": filed[k], "e2e_us": r.e2e_us,
             "flow": r.flow.model_dump(exclude_none=True), "received_at": now}
            for k, r in unique.items()]
    insert = _insert(engine.dialect.name)
    # executemany with RETURNING: SQLAlchemy's "insertmanyvalues" sends multi-row INSERTs with a
    # cached statement (one compiled 1000-row VALUES list was 5x slower)
    stmt = insert(Row).on_conflict_do_nothing(index_elements=["key"]).returning(Row.key)
    with Session(engine) as s, s.begin():
        new = set(s.execute(stmt, rows).scalars())
    return [r for k, r in unique.items() if k in new], len(batch.records) - len(new)


def enforce_retention(engine: Engine, cfg: RetentionConfig, now_ns: int | None = None) -> dict:
    """Delete records older than max_age and beyond max_records (oldest arrivals first), in chunks
    so that no transaction holds the store for long. Returns {"age": n, "count": n}."""
    now_ns = now_ns or time.time_ns()
    out = {"age": 0, "count": 0}

    def chunked(where) -> int:
        total = 0
        while True:
            with Session(engine) as s, s.begin():
                ids = list(s.execute(select(Row.id).where(where).limit(DELETE_CHUNK)).scalars())
                if ids:
                    s.execute(delete(Row).where(Row.id.in_(ids)))
            total += len(ids)
            if len(ids) < DELETE_CHUNK:
                return total

    if cfg.max_age_s > 0:
        out["age"] = chunked(Row.time_ns < now_ns - int(cfg.max_age_s * 1e9))
    if cfg.max_records > 0:
        with Session(engine) as s, s.begin():
            s.connection(execution_options=READ_ONLY)
            edge = s.execute(select(Row.id).order_by(Row.id.desc())
                             .offset(cfg.max_records).limit(1)).scalar()
        if edge is not None:
            out["count"] = chunked(Row.id <= edge)
    m = metrics()
    for reason, n in out.items():
        if n:
            m["expired"].labels(reason).inc(n)
    return out


class RetentionWorker:
    def __init__(self, engine: Engine, cfg: RetentionConfig):
        self.engine, self.cfg = engine, cfg
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.last: dict | None = None
        self.after = None          # called after a run that removed records

    def run_once(self) -> dict:
        result = enforce_retention(self.engine, self.cfg)
        self.last = {"at": datetime.now(timezone.utc).isoformat(), **result}
        if (result["age"] or result["count"]) and self.after is not None:
            self.after()
        if result["age"] or result["count"]:
            LOG.info("pptmon retention removed %d records by age, %d by count", result["age"], result["count"])
        return result

    def _loop(self):
        while not self.stop.wait(self.cfg.interval_s):
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - retention must survive a store hiccup
                LOG.exception("pptmon retention")

    def start(self):
        self.stop.clear()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="pptmon-retention")
        self.thread.start()

    def shutdown(self):
        self.stop.set()
        if self.thread:
            self.thread.join(timeout=5)


# ---------------------------------------------------------------------------------------------- query helpers


def _bad(where: str, name: str, msg: str) -> HTTPException:
    return HTTPException(422, detail=[{"loc": [where, name], "msg": msg, "type": "invalid"}])


MAX_NS = 2 ** 63 - 1     # time_ns is a signed 64-bit column


def parse_since(text: str | None, name: str = "since", now_ns: int | None = None) -> int | None:
    """ns since the epoch (digits), a duration back from now ('30s', '5m'), or an ISO 8601 time;
    422 for anything else and for a time outside 0..2^63-1 ns."""
    if text is None or text == "":
        return None
    now_ns = now_ns or time.time_ns()
    t = text.strip()
    value = None
    if t.isascii() and t.isdigit():
        value = int(t) if len(t) <= 19 else MAX_NS + 1
    else:
        try:
            value = now_ns - int(parse_duration(t) * 1e9)
        except (ValueError, OverflowError):
            pass
    if value is None:
        try:
            dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=timezone.utc)
            value = int(dt.timestamp() * 1e9)
        except (ValueError, OverflowError):
            raise _bad("query", name, f"{text[:64]!r} is neither ns since the epoch, a duration (30s, 5m) "
                                      "nor an ISO 8601 time") from None
    if not 0 <= value <= MAX_NS:
        raise _bad("query", name, f"{text[:64]!r} is outside the times a record can have (1970 to 2262)")
    return value


def _filters(chain, vnf, since_ns, until_ns, node=None):
    where = []
    if chain is not None:
        where.append(Row.chain == chain)
    if node is not None:
        where.append(Row.node == node)
    if vnf is not None:
        where.append(Row.vnfs.like(f"%,{vnf},%"))
    if since_ns is not None:
        where.append(Row.time_ns >= since_ns)
    if until_ns is not None:
        where.append(Row.time_ns <= until_ns)
    return where


def record_out(row: Row) -> dict:
    return {"type": "ppt", "v": 1, "key": row.key, "chain": row.chain, "node": row.node,
            "vnf_ns": row.vnf_ns, "placement": row.placement, "ktime_ns": row.ktime_ns,
            "time_ns": row.time_ns, "sink_vnf": row.sink_vnf, "seq": row.seq, "flags": row.flags,
            "flow": row.flow, "hops": row.hops, "e2e_us": row.e2e_us, "port_chain_id": row.port_chain_id,
            "received_at": utc(row.received_at).isoformat()}


def stats_for(engine: Engine, chain: str, since_ns: int | None, until_ns: int | None,
              node: str | None = None) -> dict:
    with Session(engine) as s, s.begin():
        s.connection(execution_options=READ_ONLY)
        rows = s.execute(select(Row.hops, Row.e2e_us, Row.time_ns)
                         .where(*_filters(chain, None, since_ns, until_ns, node))
                         .order_by(Row.time_ns.desc()).limit(MAX_STATS_RECORDS + 1)).all()
    truncated = len(rows) > MAX_STATS_RECORDS
    rows = rows[:MAX_STATS_RECORDS]
    st = chain_stats([{"hops": h, "e2e_us": e} for h, e, _ in rows])
    return {"chain": chain, "node": node, "since_ns": since_ns, "until_ns": until_ns,
            "first_ns": rows[-1][2] if rows else None, "last_ns": rows[0][2] if rows else None,
            "truncated": truncated, "records": st["records"], "incomplete": st["incomplete"],
            "vnfs": {str(k): v for k, v in st["vnfs"].items()}, "e2e": st["e2e"]}


def port_chain_stats(engine: Engine, snapshot: Snapshot, chain_id: int, agents: dict, since_ns: int | None,
                     until_ns: int | None) -> dict:
    """Per chain, group and port pair: the stored records of a measured port chain over a window,
    with the instances as the model has them now."""
    chain = next(c for c in snapshot.port_chains if c.id == chain_id)
    with Session(engine) as s, s.begin():
        s.connection(execution_options=READ_ONLY)
        where = [Row.port_chain_id == chain_id]
        if since_ns is not None:
            where.append(Row.time_ns >= since_ns)
        if until_ns is not None:
            where.append(Row.time_ns <= until_ns)
        rows = s.execute(select(Row.hops, Row.e2e_us, Row.time_ns).where(*where)
                         .order_by(Row.time_ns.desc()).limit(MAX_STATS_RECORDS + 1)).all()
    truncated = len(rows) > MAX_STATS_RECORDS
    rows = rows[:MAX_STATS_RECORDS]
    by_group: dict[int, list[float]] = {}
    by_pair: dict[int, list[float]] = {}
    e2e, incomplete = [], 0
    for hops, e, _ in rows:
        for h in hops:
            if h.get("ppt_us") is not None and h.get("port_pair") is not None:
                by_group.setdefault(h["group"], []).append(float(h["ppt_us"]))
                by_pair.setdefault(h["port_pair"], []).append(float(h["ppt_us"]))
        if e is None:
            incomplete += 1
        else:
            e2e.append(float(e))
    names = {g.id: g.name for g in snapshot.port_pair_groups}
    pair_names = {p.id: p.name for p in snapshot.port_pairs}
    groups: list[dict] = []
    for v in chain_instances(snapshot, chain_id):
        if not groups or groups[-1]["id"] != v.group_id:
            groups.append({"id": v.group_id, "name": names.get(v.group_id, ""), "position": v.position,
                           "role": v.role, "processing": summarize(by_group.get(v.group_id, [])), "port_pairs": []})
        groups[-1]["port_pairs"].append({"id": v.pair_id, "name": pair_names.get(v.pair_id, ""), "vnf_id": v.vnf_id,
                                         "node": v.node, "processing": summarize(by_pair.get(v.pair_id, []))})
    lost = lost_across(snapshot, chain_id, agents)
    warning = lost_warning(lost)
    return {"port_chain": chain_id, "name": chain.name, "pptmon": {"period_ns": chain.pptmon.period_ns}
            if chain.pptmon else None, "since_ns": since_ns, "until_ns": until_ns,
            "first_ns": rows[-1][2] if rows else None, "last_ns": rows[0][2] if rows else None,
            "truncated": truncated, "records": len(rows), "incomplete": incomplete, "e2e": summarize(e2e),
            "groups": groups, "stamped": lost["stamped"], "reached": lost["reached"],
            "lost_across": lost["lost_across"], "warnings": [warning] if warning else []}


# ---------------------------------------------------------------------------------------------- routes


@contextlib.asynccontextmanager
async def _retention_while_served(app):
    """Serving the app runs the retention worker of its store."""
    worker = app.state.pptmon_retention
    worker.start()
    try:
        yield
    finally:
        await asyncio.to_thread(worker.shutdown)


def retention_worker(request: Request) -> RetentionWorker:
    return request.app.state.pptmon_retention


router = APIRouter(prefix="/pptmon", tags=["pptmon"], responses=ERRORS, lifespan=_retention_while_served)
WorkerDep = Annotated[RetentionWorker, Depends(retention_worker)]


def ingest_limits(request: Request) -> IngestLimits:
    return request.app.state.pptmon_limits


@router.post("/records", summary="Store a batch of PPTMon records (idempotent on the record key)",
             responses={429: {"model": ErrorOut, "description": "over the node's rate: retry after Retry-After s"}})
def post_records(batch: RecordBatch, engine: EngineDep, who: Identity = Depends(agent_identity),
                 limits: IngestLimits = Depends(ingest_limits)):
    if batch.node != who.node:
        raise Forbidden(f"this token delivers the records of node {who.node} only", "node")
    try:
        limits.admit(who.node, [x.chain for x in batch.records], len(batch.records))
    except TooMany as e:
        raise HTTPException(429, detail=[{"loc": [], "msg": e.message, "type": e.kind}],
                            headers={"Retry-After": str(max(1, math.ceil(e.retry_after)))}) from None
    chains = measured_chains(engine, batch.records)
    new, duplicates = ingest(engine, batch, chains=chains)
    observe(batch.node, new, {r.key: file_under(r, batch.node, chains) for r in new}, chains)
    if duplicates:
        m = metrics()["duplicates"]
        seen = {r.key for r in new}
        for rec in batch.records:
            if rec.key not in seen:
                m.labels(rec.chain, batch.node).inc()
            seen.discard(rec.key)   # a key repeated inside the batch counts as a duplicate
    return {"received": len(batch.records), "accepted": len(new), "duplicates": duplicates}


@router.get("/records", summary="Stored records, newest `limit` matching, oldest first")
def get_records(c: CallerDep, engine: EngineDep, chain: str | None = None,
                node: str | None = Query(None, description="records reported by this node only"),
                vnf: int | None = Query(None, ge=0, le=255, description="records through VNF id"),
                since: str | None = Query(None, description="ns since the epoch, a duration back from now (30s), or ISO 8601"),
                until: str | None = None,
                limit: int = Query(100, ge=1, le=10_000)):
    require_admin(c, "read PPTMon records")
    since_ns, until_ns = parse_since(since), parse_since(until, "until")
    with Session(engine) as s, s.begin():
        s.connection(execution_options=READ_ONLY)
        rows = list(s.execute(select(Row).where(*_filters(chain, vnf, since_ns, until_ns, node))
                              .order_by(Row.time_ns.desc(), Row.id.desc()).limit(limit)).scalars())
        return [record_out(x) for x in reversed(rows)]


@router.get("/stats", summary="p50/p90/p99 (and min, mean, max...) per VNF and end to end over a window")
def get_stats(chain: str, c: CallerDep, engine: EngineDep,
              node: str | None = Query(None, description="records reported by this node only (default: every node's)"),
              since: str | None = Query(None, description="as for /records"),
              until: str | None = None,
              window: str | None = Query(None, description="a duration back from now; default 5m when no since")):
    require_admin(c, "read PPTMon statistics")
    if since is not None and window is not None:
        raise _bad("query", "window", "give since or window, not both")
    since_ns = parse_since(since) if since is not None else parse_since(window or "5m", "window")
    return stats_for(engine, chain, since_ns, parse_since(until, "until"), node)


@router.get("/chains", summary="Chains with stored records: one entry per reporting node and chain name")
def get_chains(c: CallerDep, engine: EngineDep):
    require_admin(c, "read PPTMon records")
    with Session(engine) as s, s.begin():
        s.connection(execution_options=READ_ONLY)
        rows = s.execute(select(Row.chain, Row.node, func.count(Row.id), func.min(Row.time_ns),
                                func.max(Row.time_ns))
                         .group_by(Row.chain, Row.node).order_by(Row.chain, Row.node)).all()
    # `nodes` (the reporting node, as a list) is kept for readers written before `node`
    return [{"chain": ch, "node": nd, "records": n, "first_ns": lo, "last_ns": hi, "nodes": [nd] if nd else []}
            for ch, nd, n, lo, hi in rows]


@router.post("/retention", summary="Enforce retention now")
def post_retention(c: CallerDep, worker: WorkerDep):
    require_admin(c, "enforce PPTMon retention")
    removed = worker.run_once()
    cfg = worker.cfg
    return {"removed": removed, "max_age_s": cfg.max_age_s, "max_records": cfg.max_records,
            "interval_s": cfg.interval_s}
