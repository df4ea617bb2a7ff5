"""/v1/cluster (admin only): the controller replicas sharing this store and their switch leases, as
PostgreSQL holds them now (fathom.cluster.leases). A store on SQLite has no cluster: one controller."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from fathom.api.auth import admin_caller
from fathom.api.deps import ERRORS
from fathom.cluster import leases

router = APIRouter(prefix="/cluster", tags=["cluster"], dependencies=[Depends(admin_caller)], responses=ERRORS)


class TimingOut(BaseModel):
    renew: float = Field(description="seconds between a replica's lease rounds")
    lease: float = Field(description="seconds a lease and a heartbeat last after their round (PostgreSQL's clock)")
    guard: float = Field(description="how long before its lease's end a holder stops acting")


class ReplicaOut(BaseModel):
    id: str
    address: str
    openflow: str = Field(description="its OpenFlow listener, host:port (no host: reached as the replicas' host)")
    feed_lag: float | None = Field(description="seconds from another replica's write to its change notification "
                                               "arriving here (the last one; null: none yet)")
    live: bool = Field(description="its heartbeat is younger than the lease time")
    started: str
    heartbeat_age: float = Field(description="seconds since its last round (its last renewal)")
    schema_version: str
    pki_fingerprint: str
    switches: int = Field(description="switches it is master of (unexpired leases)")


class LeaseOut(BaseModel):
    switch: str
    holder: str | None = Field(description="the master replica; null: none (free or expired)")
    epoch: int = Field(description="the OpenFlow generation_id of the holder's master role request")
    expires_in: float | None
    renewed_age: float | None


class ClusterOut(BaseModel):
    store: str = Field(description="postgresql (a cluster is possible) or sqlite (one controller)")
    timing: TimingOut
    replicas: list[ReplicaOut]
    leases: list[LeaseOut]
    notify_queue_usage: float | None = Field(
        description="the share (0 to 1) of PostgreSQL's notification queue in use: the change feed's "
                    "notifications not yet read by every listening session (null: sqlite)")


@router.get("", response_model=ClusterOut, summary="Replicas, their switch leases and epochs")
def cluster_status(request: Request) -> ClusterOut:
    engine = request.app.state.engine
    timing = leases.Timing()
    if engine.dialect.name != "postgresql":
        return ClusterOut(store=engine.dialect.name, timing=TimingOut(**timing.__dict__), replicas=[], leases=[],
                          notify_queue_usage=None)
    with engine.connect() as conn:
        return ClusterOut(store="postgresql", **leases.status(conn, timing))
