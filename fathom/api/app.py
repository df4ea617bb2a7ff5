"""The REST API: `create_app(engine, on_change)` returns the FastAPI app of the controller.

Resources live under /v1, one module each (nodes, networks and subnets, ports, routers, taps,
service chains, fabric switches, pptmon); what they share is fathom.api.deps. OpenAPI is at /openapi.json. Every
request runs in one transaction: it commits entirely or not at all. After each committed write,
`on_change()` is called (the controller wakes its reconciler with it). Every error has one shape
(fathom.api.deps, docs/api.md). Every call is authenticated (fathom.api.auth) and its input
bounded (fathom.api.limits); docs/security.md.
"""
from __future__ import annotations

from typing import Callable

from fastapi import FastAPI
from sqlalchemy import Engine

from fathom import __version__
from fathom.api import (agent_traces, agents, cluster, fabric, floatingips, networks, nodes, ports, pptmon, pptmon_attachments,
                        routers, secgroups, sfc, taps, tokens)
from fathom.api import agent_captures, flow_records
from fathom.api.auth import Authenticator
from fathom.api.commits import CommitHeader
from fathom.api.direct import DirectRoutes
from fathom.api.deps import Store, install_error_handlers
from fathom.api.ingest_limits import IngestLimits
from fathom.api.limits import BoundedInput
from fathom.api.request_ids import RequestIds
from fathom.auth.keystone import KeystoneValidator
from fathom.store.db import open_store
from fathom.store.ops import Settings

NO_TELEMETRY = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}
ROUTERS = (nodes.router, networks.networks, networks.subnets, ports.router, routers.router,
           floatingips.router, secgroups.groups, secgroups.rules, taps.router, sfc.router, fabric.router,
           pptmon_attachments.router, pptmon.router, tokens.router, agents.router, agent_traces.router, cluster.router,
           flow_records.router, agent_captures.router)


def create_app(store: Engine | str, on_change: Callable[[], None] | None = None, *,
               settings: Settings | None = None,
               retention: pptmon.RetentionConfig | None = None, keystone: KeystoneValidator | None = None,
               max_body: int | None = None, agent_max_wait: float | None = None) -> FastAPI:
    """The API over `store`: an engine from fathom.store.db.open_store (the process's one engine),
    or a database URL, opened and migrated here.

    `app.state.engine` is the SQLAlchemy engine, e.g. for fathom.store.snapshot.load_snapshot.
    `keystone`: validate tokens the controller did not issue there (default: from the environment,
    fathom.auth.keystone); `max_body`: the largest request body read (default FATHOM_API_MAX_BODY or 1 MiB);
    `agent_max_wait`: the longest an agent's long-poll is held (default fathom.api.agents.MAX_WAIT).
    """
    engine = open_store(store) if isinstance(store, str) else store
    # no OpenTelemetry: fathom configures none, and FastAPI would look its providers up per request
    app = FastAPI(title="fathom", version=__version__, telemetry=NO_TELEMETRY,
                  description="Tenant networking on Open vSwitch: nodes, networks, subnets, ports, "
                              "routers, floating IPs, security groups, tap policies, service chains (networking-sfc), "
                              "fabric switches. Errors: {detail: [{loc, msg, type}]}.")
    app.state.engine = engine
    # a committed write wakes the caller's hook (the reconciler) and the agents' long-polls
    hub = app.state.agent_hub = agents.AgentHub()
    app.state.agent_max_wait = agents.MAX_WAIT if agent_max_wait is None else agent_max_wait

    def changed() -> None:
        hub.changed()
        if on_change is not None:
            on_change()
    app.state.store = Store(engine, settings or Settings(), changed)
    app.state.agent_desired = agents.DesiredCache(hub, app.state.store)
    app.state.trace_desk = agent_traces.TraceDesk()   # trace requests to the agents (POST /v1/traces, actual)
    app.state.capture_desk = agent_captures.CaptureDesk()   # capture requests (POST /v1/taps/{id}/capture)
    app.state.settings = app.state.store.settings
    app.state.pptmon_retention = pptmon.RetentionWorker(engine, retention or pptmon.RetentionConfig.from_env())
    app.state.pptmon_limits = IngestLimits(engine)
    app.state.pptmon_retention.after = app.state.pptmon_limits.forget
    app.state.authenticator = Authenticator(engine, keystone if keystone is not None else KeystoneValidator.from_env())
    app.add_middleware(DirectRoutes, api=app)   # innermost: a request it takes has been through the others
    app.add_middleware(RequestIds, engine=engine)   # inside BoundedInput: bodies read are bounded
    app.add_middleware(BoundedInput, max_body=max_body)
    app.add_middleware(CommitHeader)   # outside RequestIds: a replayed answer names no commit
    pptmon.metrics()   # the families exist (empty) on /metrics from the start
    app.state.flow_records = flow_records.RecordStore()
    flow_records.metrics()
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router, prefix="/v1")
    return app
