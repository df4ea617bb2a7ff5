"""The endpoints that read the switches rather than the store: a node's flows, a pass on demand, the
controller's health, a tap policy's counters, a port's counters, Prometheus metrics, a fabric switch's ports and flows.

They answer from the controller's runtime (the reconciler, the fabric and vTAP runtimes in
fathom/controller), which passes in what each reads; the routes themselves live here with every
other route.
"""
from __future__ import annotations

from datetime import datetime
from typing import Callable

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel

from fathom.api.auth import admin_caller
from fathom.api.deps import ERRORS, AdminDep, CallerDep
from fathom.openflow.spec import SwitchState
from fathom.pipeline.cookies import owns_cookie
from fathom.pipeline.stages import TABLE_STAGE
from fathom.store import models as m
from fathom.store import ops
from fathom.store.errors import NotFound
from fathom.store.ops import valid_id


def runtime_router(reconciler, actual_of: Callable[[int], SwitchState | None],
                   commit_times: Callable[[], dict], guard=None) -> APIRouter:
    """/v1/nodes/{name}/flows, /v1/sync, /v1/health (admin). `actual_of(node id)`: what the node's
    br-int holds, None when it is not connected; `commit_times()`: the switches' commit timings;
    `guard`: the API's connection guard (fathom.api.connections.Guard), whose counts health shows."""
    router = APIRouter(prefix="/v1", tags=["runtime"], dependencies=[Depends(admin_caller)], responses=ERRORS)

    @router.get("/nodes/{name}/flows", summary="Desired and actual flows of a node's br-int, per stage")
    def node_flows(name: str):
        with reconciler.Session() as s:
            node = s.query(m.Node).filter_by(name=name).one_or_none()
        if node is None:
            raise NotFound(f"node {name[:64]!r} does not exist")
        desired = reconciler.last.br_int(name)
        actual = actual_of(node.id)

        def by_stage(flows):
            out: dict[str, list[str]] = {}
            for f in sorted(flows, key=lambda f: (f.table, -f.priority, repr(f.match))):
                out.setdefault(TABLE_STAGE.get(f.table, f"table {f.table}"), []).append(f.to_ofctl())
            return out
        return {
            "node": name, "connected": actual is not None,
            "desired": by_stage(desired.flows) if desired else {},
            "actual": by_stage(actual.flows) if actual is not None else None,
            "desired_groups": sorted(g.to_ofctl() for g in desired.groups) if desired else [],
            "actual_groups": sorted(g.to_ofctl() for g in actual.groups) if actual is not None else None,
            "in_sync": (desired is not None and actual is not None
                        and {f for f in actual.flows if owns_cookie(f.cookie)} == set(desired.flows)),
        }

    @router.post("/sync", summary="Run one reconcile pass now and report per-node results")
    def sync():
        result = reconciler.run_pass()
        return {n: r.__dict__ for n, r in result.nodes.items()}

    @router.get("/health")
    def health():
        return {"passes": reconciler.passes, "switches": [f"{d:016x}" for d in reconciler.switches.app.datapaths],
                "last_pass_seconds": round(reconciler.last_pass_seconds, 6),
                "last_pass_steps": {k: round(v, 6) for k, v in reconciler.last_pass_steps.items()},
                "pass_steps_total": {k: round(v, 6) for k, v in reconciler.steps_total.items()},
                "recomputes": dict(reconciler.desired.recomputes), "drift": dict(reconciler.drift),
                "incremental_mismatches": reconciler.mismatches, "switch_diffs": dict(reconciler.applier.diffs),
                "port_status_decisions": dict(reconciler.statuses.port_statuses.passes),
                "switch_commits": commit_times(),
                "api_connections": guard.stats() if guard is not None else None}

    return router


def tap_runtime_router(session_factory, stats: Callable[[int], dict], collector) -> APIRouter:
    """/v1/taps/{id}/stats (`stats(policy id)`: its counters and per-node state, read from the
    switches) and /metrics (Prometheus, admin; `collector` adds the tap metrics)."""
    from prometheus_client import REGISTRY, generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    try:
        REGISTRY.register(collector)
    except ValueError:
        pass  # registered already (a second app in one process)
    router = APIRouter(tags=["taps"], responses=ERRORS)

    @router.get("/v1/taps/{tap_id}/stats", summary="Counters and per-node state of a tap policy")
    def tap_stats(tap_id: int, c: CallerDep):
        with session_factory() as s:
            t = s.get(m.TapPolicy, tap_id) if valid_id(tap_id) else None
            if t is None or not (c.admin or t.project_id == c.project):
                raise NotFound(f"tap policy {tap_id} does not exist")
        return stats(tap_id)

    @router.get("/metrics", summary="Prometheus metrics (admin)", include_in_schema=False)
    def metrics(_c: AdminDep):
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return router


def fabric_runtime_router(status: Callable[[int], dict], desired_flows: Callable[[int], list[str]]) -> APIRouter:
    """/v1/fabric/switches/{id}/status and /flows (admin): `status(switch id)` reads the fabric switch and the
    nodes behind it (fathom.controller.fabric.FabricRuntime.status); `desired_flows(switch id)`,
    the flows the fabric switch must hold (ovs-ofctl syntax)."""
    r = APIRouter(prefix="/v1", tags=["fabric"], dependencies=[Depends(admin_caller)], responses=ERRORS)

    @r.get("/fabric/switches/{switch_id}/status",
           summary="A fabric switch's ports: the node behind each (LLDP / declared) and its VLAN set, desired and actual")
    def switch_status(switch_id: int):
        return status(switch_id)

    @r.get("/fabric/switches/{switch_id}/flows", summary="Desired fabric switch flows (ovs-ofctl syntax)")
    def switch_flows(switch_id: int):
        return {"desired": desired_flows(switch_id)}

    return r


class PortCounters(BaseModel):
    rx_packets: int
    tx_packets: int
    rx_bytes: int
    tx_bytes: int
    rx_dropped: int
    tx_dropped: int
    rx_errors: int
    tx_errors: int


class PortCountersOut(BaseModel):
    port_id: int
    node: str | None
    interface: str | None
    ofport: int | None
    read_at: datetime | None
    counters: PortCounters | None
    reason: str | None


def port_runtime_router(session_factory, counters: Callable[[int], dict]) -> APIRouter:
    """/v1/ports/{id}/counters (the port's project or an admin): `counters(port id)` reads them from
    the port's node's br-int (fathom.controller.port_counters)."""
    router = APIRouter(tags=["ports"], responses=ERRORS)

    @router.get("/v1/ports/{port_id}/counters", response_model=PortCountersOut,
                summary="A port's packets, bytes, drops and errors on its node's br-int, read now")
    def port_counters(port_id: int, c: CallerDep):
        with session_factory() as s:
            ops.get(s, c, m.Port, port_id)
        return counters(port_id)

    return router
