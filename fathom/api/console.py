"""The console's routes on the controller's API app: its pages, their scripts and the front-end
packages (no token: they hold no data), `/v1/whoami` and the stream of change notices `/v1/events`
(a token, as every API call).

Pages (each a URL to share; the data is read by the page through the REST API with the user's token,
kept in the tab's sessionStorage, so what a user sees is what the API lets that token read):
    /console/login            a token (the controller's or a Keystone token), or Keystone credentials
                              where the controller validates Keystone tokens (`POST /v1/login/keystone`
                              turns them into a project-scoped Keystone token, the console's token)
    /console/topology         nodes, fabric switches, networks, routers, ports; live
                              (?node=<name>: that node's ports)
    /console/port/<id>        a port: status, flows per stage desired vs actual, security groups, taps
    /console/chain/<id>       a port chain hop by hop with PPTMon per VNF, a live chart
    /console/trace            ?port=<id>&to=<IPv4 or port name>: one packet's path, drawn and stage by stage
    /console/flow-records     the caller's project's top talkers and drops by rule
    /console/taps             tap policies with their counters; a capture of a monitor downloaded as pcap
    /console/benchmarks       the benchmarks' results (JSON files under the benchmarks directory), plotted

The front-end packages (package.json, installed by `npm ci` in scripts/setup) are served from
node_modules, only the files VENDOR names.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from pathlib import Path

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from fathom.api import fabric, floatingips, networks, ports, routers, secgroups, sfc, taps
from fathom.api.auth import Unauthenticated, caller, identity
from fathom.api.deps import ERRORS
from fathom.auth import Identity
from fathom.store import models as m
from fathom.store import sfc_models as sm
from fathom.auth.keystone import KeystoneUnavailable
from fathom.store.errors import NotFound, Unavailable
from fathom.store.external_models import FloatingIp
from fathom.store.fabric_models import FabricSwitch
from fathom.store.ops import Caller

CONSOLE = Path(__file__).parent.parent / "console"     # the front end: pages, scripts, package.json
STATIC = CONSOLE / "static"
PACKAGES = CONSOLE / "node_modules"
# what the pages import: URL name -> file under node_modules
VENDOR = {"cytoscape.esm.min.mjs": "cytoscape/dist/cytoscape.esm.min.mjs",
          "uPlot.esm.js": "uplot/dist/uPlot.esm.js",
          "uPlot.min.css": "uplot/dist/uPlot.min.css"}
PAGES = {"login": "login.html", "topology": "topology.html", "port": "port.html", "chain": "chain.html",
         "trace": "trace.html", "flow-records": "flow-records.html", "taps": "taps.html",
         "benchmarks": "benchmarks.html"}
STATIC_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,40}\.(js|css)$")
MEDIA = {".js": "text/javascript", ".mjs": "text/javascript", ".css": "text/css", ".html": "text/html"}
# Scripts only from the controller itself; style attributes are set by the graph library.
HEADERS = {"Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                                      "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
                                      "base-uri 'none'; form-action 'self'",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}
# the benchmarks' results the console plots: *.json under this directory (docs/benchmarks of the checkout)
BENCHMARKS = Path(os.environ.get("FATHOM_BENCHMARKS_DIR", Path(__file__).parent.parent.parent / "docs" / "benchmarks"))
BENCHMARK_PATH = re.compile(r"^[A-Za-z0-9_.-]{1,64}(/[A-Za-z0-9_.-]{1,64}){0,5}\.json$")
MAX_BENCHMARK = 4 << 20    # bytes of one results file
MAX_BENCHMARKS = 1000      # files listed
KEEPALIVE = 15.0      # seconds between a stream's keep-alive comments (and checks of its token)
MAX_ID = 2**31 - 1


def _file(path: Path) -> FileResponse:
    return FileResponse(path, media_type=MEDIA[path.suffix], headers=HEADERS)


def console_router() -> APIRouter:
    r = APIRouter(include_in_schema=False)

    @r.get("/console")
    @r.get("/console/")
    def home():
        return RedirectResponse("/console/topology", status_code=302)

    @r.get("/console/static/{name}")
    def static(name: str):
        path = STATIC / name
        if not STATIC_NAME.match(name) or not path.is_file():
            raise NotFound("no such file")
        return _file(path)

    @r.get("/console/vendor/{name}")
    def vendor(name: str):
        if name not in VENDOR or not (PACKAGES / VENDOR[name]).is_file():
            raise NotFound("no such file (the console's packages are installed by scripts/setup: npm ci)")
        return _file(PACKAGES / VENDOR[name])

    @r.get("/console/{page}")
    def page(page: str):
        if page not in PAGES:
            raise NotFound("no such page")
        return _file(STATIC / PAGES[page])

    @r.get("/console/{page}/{object_id}")
    def object_page(page: str, object_id: int):
        if page not in ("port", "chain") or not 0 < object_id <= MAX_ID:
            raise NotFound("no such page")
        return _file(STATIC / PAGES[page])

    return r


class KeystoneLoginIn(BaseModel):
    """A Keystone user's credentials and the project to scope the token to (the user's and the
    project's names are in `domain`)."""
    model_config = ConfigDict(extra="forbid")
    user: str = Field(min_length=1, max_length=255)
    password: SecretStr = Field(min_length=1, max_length=4096)    # never shown, logged nor kept
    project: str = Field(min_length=1, max_length=64)
    domain: str = Field("Default", min_length=1, max_length=255)


class LoginOut(BaseModel):
    token: str
    project_id: str
    roles: list[str]
    expires_at: str


class LoginAttempts:
    """Keystone logins: at most `per_window` attempts from one source address in `window` s, and at
    most `at_once` Keystone calls in progress over all addresses; an attempt over either is refused
    without calling Keystone. Remembers at most `addresses` addresses."""

    def __init__(self, per_window: int = 10, window: float = 60.0, at_once: int = 4, addresses: int = 4096):
        self.per_window, self.window, self.addresses = per_window, window, addresses
        self.running = threading.BoundedSemaphore(at_once)
        self._seen: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def wait_for(self, address: str) -> float:
        """0 when `address` may try now (the attempt is counted), else the seconds until it may."""
        now = time.monotonic()
        with self._lock:
            recent = [t for t in self._seen.get(address, ()) if t > now - self.window]
            if len(recent) >= self.per_window:
                return recent[0] + self.window - now
            if address not in self._seen and len(self._seen) >= self.addresses:
                self._seen = {a: ts for a, ts in self._seen.items() if ts[-1] > now - self.window}
                if len(self._seen) >= self.addresses:
                    return self.window
            self._seen[address] = [*recent, now]
            return 0.0


def _too_many(seconds: float, msg: str) -> JSONResponse:
    return JSONResponse({"detail": [{"loc": [], "msg": msg, "type": "too_many_attempts"}]}, status_code=429,
                        headers={"Retry-After": str(max(1, round(seconds)))})


LOGIN_PATHS = ("/v1/login", "/v1/login/keystone")     # reached without a token


def login_router(attempts: LoginAttempts | None = None) -> APIRouter:
    """/v1/login (how the console may log in; no token) and /v1/login/keystone (Keystone
    credentials -> a project-scoped Keystone token, where the controller validates Keystone tokens)."""
    r = APIRouter(prefix="/v1/login", tags=["console"], responses=ERRORS)
    attempts = attempts or LoginAttempts()

    @r.get("", summary="How the console logs in: `token` always, `keystone` (credentials) where the controller "
                       "validates Keystone tokens")
    def methods(request: Request):
        return {"methods": ["token", *(["keystone"] if request.app.state.authenticator.keystone else [])]}

    @r.post("/keystone", response_model=LoginOut, status_code=201,
            summary="Keystone credentials -> a Keystone token scoped to the project (one call to Keystone; "
                    "no token needed)")
    def keystone_login(body: KeystoneLoginIn, request: Request):
        keystone = request.app.state.authenticator.keystone
        if keystone is None:
            raise NotFound("this controller does not use Keystone: log in with a token")
        # the source as the connection guard tells it (the client behind a trusted proxy), else the peer
        source = getattr(request.state, "source", None) or (request.client.host if request.client else "")
        wait = attempts.wait_for(source)
        if wait:
            return _too_many(wait, "too many login attempts from this address: retry later")
        if not attempts.running.acquire(blocking=False):
            return _too_many(1, "too many logins in progress: retry later")
        try:
            made = keystone.login(body.user, body.password.get_secret_value(), body.project, body.domain)
        except KeystoneUnavailable as e:
            raise Unavailable(str(e)) from None
        finally:
            attempts.running.release()
        if made is None:
            raise Unauthenticated("Keystone refused this user name, password or project")
        return JSONResponse(LoginOut(token=made.token, project_id=made.identity.project,
                                     roles=sorted(made.identity.roles), expires_at=made.expires_at).model_dump(),
                            status_code=201, headers={"Cache-Control": "no-store"})

    return r


def events_router(feed) -> APIRouter:
    """/v1/whoami, /v1/topology and /v1/events; `feed`: the controller's change notices
    (fathom.controller.console_feed.ConsoleFeed)."""
    r = APIRouter(prefix="/v1", tags=["console"], responses=ERRORS)

    @r.get("/whoami", summary="The caller's project and roles (what the console shows it)")
    async def whoami(who: Identity = Depends(identity), c: Caller = Depends(caller)):
        return {"project": c.project, "admin": c.admin, "roles": sorted(who.roles)}

    @r.get("/topology", summary="The topology's summary as of the last reconciler pass: per node the caller's "
                                "ports counted by status (an admin: every node with its health); the ports on no node; "
                                "the caller's networks and routers counted by status")
    def topology(c: Caller = Depends(caller)):
        return feed.summary(c.project, c.admin)

    @r.get("/events", summary="Change notices (server-sent events): after each reconciler pass, the caller's "
                              "objects that changed (an admin: anyone's), each with its kind, id and the object "
                              "as the API answers it, or its deletion")
    async def events(request: Request, c: Caller = Depends(caller)):
        listener = feed.listen(c.project, c.admin)
        if listener is None:
            return JSONResponse({"detail": [{"loc": [], "msg": "too many consoles listen: retry later",
                                             "type": "busy"}]}, status_code=503, headers={"Retry-After": "5"})
        token = request.headers.get("authorization", "").partition(" ")[2].strip()
        auth = request.app.state.authenticator
        return StreamingResponse(_stream(feed, listener, lambda: auth.known(token) or auth.identify(token)),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return r


async def _stream(feed, listener, still_valid):
    """`hello` ({seq}: the last pass published), then the notices as the feed made them (`change`,
    or `refresh` for a console that fell behind or a pass that changed too much); a keep-alive
    comment every KEEPALIVE s, when the token is verified again: a revoked or expired one ends the
    stream with `unauthorized`."""
    try:
        yield event("hello", {"seq": feed.seq, "project": listener.project, "admin": listener.admin})
        while True:
            try:
                await asyncio.wait_for(listener.event.wait(), KEEPALIVE)
            except TimeoutError:
                if await run_in_threadpool(still_valid) is None:
                    yield event("unauthorized", {})
                    return
                yield b": keep-alive\n\n"
                continue
            behind, data = listener.take()
            yield event("refresh", {"seq": feed.seq}) if behind else data
    finally:
        feed.leave(listener)


def event(name: str, data: dict) -> bytes:
    """A server-sent event."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def benchmarks_router(directory: Path | None = None) -> APIRouter:
    """/v1/benchmarks (the results files under `directory`, default BENCHMARKS) and
    /v1/benchmarks/<path> (one of them): read-only, any token."""
    r = APIRouter(prefix="/v1/benchmarks", tags=["console"], responses=ERRORS, dependencies=[Depends(caller)])
    root = (directory or BENCHMARKS).resolve()

    def files() -> list[Path]:
        if not root.is_dir():
            return []
        found = sorted(p for p in root.rglob("*.json") if p.is_file())
        return [p for p in found if BENCHMARK_PATH.match(str(p.relative_to(root)))][:MAX_BENCHMARKS]

    @r.get("", summary="The benchmarks' results files (JSON, as `fathom bench ...` writes them)")
    def list_benchmarks():
        return [{"path": str(p.relative_to(root)), "bytes": p.stat().st_size} for p in files()]

    @r.get("/{path:path}", summary="One results file of a benchmark")
    def show_benchmark(path: str):
        file = (root / path).resolve() if BENCHMARK_PATH.match(path) else None
        if file is None or not file.is_relative_to(root) or not file.is_file():
            raise NotFound(f"no benchmark results {path[:200]!r}")
        if file.stat().st_size > MAX_BENCHMARK:
            raise NotFound(f"{path} is larger than {MAX_BENCHMARK} bytes: not served")
        return FileResponse(file, media_type="application/json", headers={"Cache-Control": "no-cache"})

    return r


def _each(fn):
    return lambda s, rows: [fn(s, o) for o in rows]


def _routers(s, rows):
    parts = routers.router_parts(s, rows)
    return [routers.router_out(s, r, parts[r.id]) for r in rows]


def _taps(s, rows):
    named = taps.tap_ports(s, rows)
    return [taps.tap_out(s, t, named) for t in rows]


def _switches(s, rows):
    links = fabric.links_out(s, rows)
    return [fabric.switch_out(s, sw, links[sw.id]) for sw in rows]


# what a change notice may carry: kind -> (its table, load options, fn(session, rows) -> the API's
# answers for those rows, read in a fixed number of statements)
READERS = {
    "port": (m.Port, ports.PORT_LOADS, _each(lambda s, p: ports.port_out(p))),
    "network": (m.Network, (), networks.networks_out),
    "subnet": (m.Subnet, (), _each(lambda s, x: networks.subnet_out(x))),
    "router": (m.Router, (), _routers),
    "tap_policy": (m.TapPolicy, (), _taps),
    "floating_ip": (FloatingIp, (), _each(lambda s, f: floatingips.fip_out(f))),
    "security_group": (m.SecurityGroup, secgroups.GROUP_LOADS, _each(lambda s, g: secgroups.group_out(g))),
    "port_pair": (sm.PortPair, (), _each(sfc.pair_out)),
    "port_pair_group": (sm.PortPairGroup, (), sfc.groups_out),
    "flow_classifier": (sm.FlowClassifier, (), _each(sfc.classifier_out)),
    "port_chain": (sm.PortChain, (), sfc.chains_out),
    "fabric_switch": (FabricSwitch, (), _switches),
}


def read_objects(session_factory, keys) -> dict:
    """(kind, id) -> the object as the API answers it (JSON-ready), for the keys the store holds;
    one read a kind named: what a change notice carries (fathom.controller.console_feed). A kind
    with no reader is left out."""
    wanted: dict[str, set[int]] = {}
    for kind, object_id in keys:
        if kind in READERS:
            wanted.setdefault(kind, set()).add(object_id)
    out = {}
    with session_factory() as s:
        for kind, ids in wanted.items():
            table, options, answers = READERS[kind]
            rows = list(s.scalars(select(table).where(table.id.in_(ids)).options(*options)))
            for o in answers(s, rows) if rows else ():
                out[kind, o.id] = o.model_dump(mode="json")
    return out
