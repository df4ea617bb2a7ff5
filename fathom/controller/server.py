"""`fathom controller`: one process with the REST API, the OpenFlow controller and the reconciler."""
from __future__ import annotations

import asyncio
import atexit
import dataclasses
import gc
import logging
import os
import socket
import threading
import time

import uvicorn

from fathom.api import create_app
from fathom.api.console import benchmarks_router, console_router, events_router, LOGIN_PATHS, login_router, read_objects
from fathom.api.runtime import port_runtime_router, runtime_router, tap_runtime_router
from fathom.api.traces import traces_router
from fathom.api.connections import ConnectionLimits, Gate, Guard, raise_open_files
from fathom.api.deps import store_error_response
from fathom.auth.tokens import ensure_admin_token
from fathom.controller import channels, ofapp, ofgate
from fathom.controller import switch as sw
from fathom.controller.bootstrap import Bootstrapper
from fathom.controller.console_feed import ConsoleFeed
from fathom.model import datapath_id
from fathom.controller.external import ExternalRuntime
from fathom.controller.fabric import FabricRuntime
from fathom.controller.hostlocal import HostLocalStatus
from fathom.controller.memory import GC_THRESHOLDS
from fathom.controller.metrics import export_state
from fathom.controller.reconciler import Reconciler
from fathom.controller import workers
from fathom.controller.port_counters import port_counters
from fathom.controller.taps import TapCollector, policy_stats
from fathom.cluster import feed, leases
from fathom.cluster.mastership import new_replica_id
from fathom.store.db import head_revision, make_engine, open_store, session_factory
from fathom.store.errors import Busy, Unavailable

LOG = logging.getLogger("fathom.controller")


def install_runtime(api, reconciler: Reconciler, guard: Guard | None = None) -> None:
    """The endpoints that read the switches (fathom.api.runtime), answered by this reconciler; its
    switches and statuses on /metrics."""
    def actual_of(node_id: int):
        dp = reconciler.switches.app.datapath(datapath_id(node_id))
        return sw.read_state(reconciler.switches.app, dp) if dp else None

    api.include_router(runtime_router(reconciler, actual_of, sw.COMMIT_TIMES.totals, guard))
    export_state(reconciler)
    api.include_router(tap_runtime_router(reconciler.Session, lambda tap_id: policy_stats(reconciler, tap_id),
                                          TapCollector(reconciler)))
    api.include_router(port_runtime_router(reconciler.Session, lambda port_id: port_counters(reconciler, port_id)))
    # simulated traces over the desired state the last pass compiled
    api.include_router(traces_router(lambda: (reconciler.model, reconciler.last.desired)))


def install_console(api, reconciler: Reconciler) -> ConsoleFeed:
    """The web console (fathom.api.console): its pages, and change notices after each pass."""
    feed = ConsoleFeed(mirror=reconciler.applier.known.get, heard=api.state.agent_hub.last_heard,
                       read=lambda keys: read_objects(reconciler.Session, keys))
    reconciler.extensions.append(feed)
    reconciler.board.listeners.append(feed.published)
    api.state.public_prefixes = ("/console",)    # pages and scripts need no token (fathom.api.connections.Gate)
    api.state.public_paths = LOGIN_PATHS           # nor the login
    api.include_router(console_router())
    api.include_router(login_router())
    api.include_router(events_router(feed))
    api.include_router(benchmarks_router())
    return feed


def serve(db_url: str, api_hosts: str | list[str], api_port: int, of_host: str, of_port: int, interval: float,
          pki_dir: str | None = None, state_dir: str = "/var/lib/fathom", max_body: int | None = None,
          audit_interval: float | None = None, datapath_settle: float = sw.DATAPATH_SETTLE,
          cluster: bool = False, advertise: str | None = None, api_workers: int = 1) -> None:
    """Run the controller: the store opened once (one engine, one migration run) and shared by the API,
    the reconciler and the fabric; OpenFlow and OVSDB over TLS with the PKI in `pki_dir`, plain TCP
    without. Its admin credential is `state_dir`/admin-token (created at the first start). The API's
    connections are limited as the environment says (fathom.api.connections). With `cluster`, it is
    one replica of the controllers sharing this PostgreSQL store (fathom.controller.cluster); the
    switches reach its OpenFlow listener at `advertise` (default: `of_host` unless a wildcard). With
    `api_workers` > 1 (PostgreSQL only) that many processes serve the API (fathom.controller.workers)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # ovsdbapp logs an unreachable node's OVSDB at ERROR on every try; our bootstrap logs the
    # same failure once per pass as the node's state (WARNING), and retries
    logging.getLogger("ovsdbapp.backend.ovs_idl.idlutils").setLevel(logging.CRITICAL)
    gc.set_threshold(*GC_THRESHOLDS)
    open_files = raise_open_files()     # every API connection is a file: thousands must not hit EMFILE
    limits = ConnectionLimits.from_env()
    if limits.max_connections > open_files // 2:
        LOG.warning("at most %d API connections: the open-file limit is %d", open_files // 2, open_files)
        limits = dataclasses.replace(limits, max_connections=open_files // 2)
    guard = Guard(limits)
    # the store's sessions as pg_stat_activity names them: which replica (or API worker) holds each
    replica_id = new_replica_id() if cluster else None
    name = f"fathom controller {replica_id}" if cluster else "fathom controller"
    if cluster:   # a live replica on another schema: refused before this one migrates the store under it
        if (head := head_revision()) is not None:
            probe = make_engine(db_url, name)
            try:
                leases.check_schema(probe, head)
            finally:
                probe.dispose()
    engine = open_store(db_url, migrate_apart=True, name=name)
    hosts = list(dict.fromkeys([api_hosts] if isinstance(api_hosts, str) else api_hosts))
    sockets = api_sockets(hosts, api_port)
    if api_workers > 1:   # forked before any thread starts; each worker opens its own engine
        engine.dispose()
        internal = workers.internal_socket()
        to_controller = f"http://127.0.0.1:{internal.getsockname()[1]}"
        atexit.register(workers.stop, workers.fork(api_workers - 1, lambda index: serve_worker(
            index, db_url, sockets, to_controller, guard, max_body)))
        sockets.append(internal)
    transport = channels.use_tls(pki_dir) if pki_dir else channels.use_plain_tcp()
    gate = ofgate.Gate(transport.tls, ofgate.expected_from_store(session_factory(engine)))
    mastership = None
    if cluster:   # joined first: a refusal (SQLite, another schema or PKI) stops it before it listens
        from fathom.controller import cluster as replica
        host = advertise or ("" if of_host in ("0.0.0.0", "::") else of_host)
        # where the other replicas reach its API (a wildcard: at the advertised address)
        api_host = hosts[0] if hosts[0] not in ("0.0.0.0", "::") else (advertise or "127.0.0.1")
        mastership = replica.join(engine, address=f"http://{api_host}:{api_port}", openflow=f"{host}:{of_port}",
                                  pki_dir=pki_dir, replica_id=replica_id)
    app = ofapp.start(of_host, of_port, gate,
                      channels.server_context(transport.files) if transport.tls else None)
    switches = sw.OsKenSwitches(app, datapath_settle)
    reconciler = Reconciler(session_factory(engine), switches, Bootstrapper(of_port), interval=interval,
                            audit_interval=audit_interval, freeze_memory=True)
    app.on_switch = reconciler.switch_changed
    app.on_port_status = reconciler.port_status
    threading.Thread(target=reconciler.run_forever, daemon=True, name="reconciler").start()
    api = create_app(engine, on_change=reconciler.wake, max_body=max_body)
    api.state.status_board = reconciler.board   # long-polls (GET ...?wait=) wait on it
    LOG.info("admin credential: %s (root only)", ensure_admin_token(engine, state_dir))
    install_runtime(api, reconciler, guard)
    # fabric switches and br-phy under OpenFlow, LLDP discovery (a cluster's replicas sign alike)
    lldp_key = leases.shared_key(engine, "lldp") if mastership is not None else None
    FabricRuntime(app, session_factory(engine), of_port, reconciler.wake, lldp_key=lldp_key).install(reconciler, api)
    # floating IPs moved or removed: their conntrack zones flushed on the gateway node
    ExternalRuntime().install(reconciler)
    # what the nodes' agents hold (router namespaces, PPTMon attachments), in the statuses
    reconciler.extensions.append(HostLocalStatus(session_factory(engine), presence=api.state.agent_hub.last_heard,
                                                ask_flush=api.state.agent_hub.ask_flush))
    if mastership is not None:
        member = replica.run(mastership, switches, reconciler, app, api.state.agent_hub)
        gate.quiet = lambda dpid: not member.masters(dpid)   # its keepalive leaves them to their probe
        api.state.flow_records.peers = lambda: mastership.replicas   # a query answers for the cluster
    elif api_workers > 1:   # a write in a worker wakes the reconciler (to read what it wrote) and the agents' long-polls
        listener = feed.follow(engine, f"controller-{os.getpid()}",
                               lambda _written: (reconciler.written_elsewhere(), api.state.agent_hub.changed()))
        reconciler.claims, reconciler.board.claims = listener.claim, True   # long-polls `after` a worker's write
    install_console(api, reconciler)
    reconciler.wake()
    LOG.info("API on %s, OpenFlow on %s:%d (%s), store %s", ", ".join(f"http://{h}:{api_port}" for h in hosts),
             of_host, of_port,
             "TLS" if transport.tls else "plain TCP, insecure", db_url)
    # Slow clients and many connections: fathom.api.connections (per source, in total, the head's
    # deadline and size), fathom.api.limits (the body's deadline and size); an idle kept-alive
    # connection is closed after 5 s. No limit_concurrency: uvicorn's counts every connection, a
    # half-sent one too, and answers 503 to anyone beyond it. No proxy_headers: uvicorn would believe
    # X-Forwarded-For from 127.0.0.1; a trusted proxy is named explicitly (FATHOM_API_TRUSTED_PROXIES).
    # One server on every API address (the agents on the nodes reach it over the management network).
    try:
        run_api(workers.WorkerHeader(api, 0) if api_workers > 1 else api, guard, sockets,
                on_stop=api.state.agent_hub.close)
    finally:
        if mastership is not None:   # its leases freed: the other replicas take them at once
            mastership.stop()


# seconds a stopping API waits for the requests in flight (the agents' held long-polls are answered
# at once by `on_stop`): then it closes them, and their clients ask again, another replica if there is one
STOP_GRACE_S = 2


def run_api(app, guard: Guard, sockets: list[socket.socket], on_stop=None) -> None:
    """Serve `app` on the listening `sockets` until SIGTERM or SIGINT; `on_stop()` is called on the
    server's event loop when it starts to stop."""
    config = uvicorn.Config(DateHeader(CutShort(Gate(app, guard))), log_level="warning", http=guard.protocol,
                            loop="uvloop", timeout_keep_alive=5, date_header=False, proxy_headers=False,
                            timeout_graceful_shutdown=STOP_GRACE_S)
    QuietServer(config, on_stop).run(sockets=sockets)


def serve_worker(index: int, db_url: str, sockets: list[socket.socket], to_controller: str, guard: Guard,
                 max_body: int | None) -> None:
    """An API worker (fathom.controller.workers): the store's routes here, the rest on the controller.
    Its committed writes notify the change feed, which wakes the controller process (and the other
    replicas of a cluster)."""
    engine = make_engine(db_url, f"fathom api-worker {os.getpid()}")
    feed.notify_commits(engine, f"api-worker-{os.getpid()}")
    api = create_app(engine, max_body=max_body)
    LOG.info("API worker %d (pid %d)", index, os.getpid())
    run_api(workers.WorkerHeader(workers.ToController(api, to_controller), index), guard, sockets)


def api_sockets(hosts: list[str], port: int) -> list[socket.socket]:
    """The API's listening sockets, one per address. They name IPPROTO_TCP: asyncio turns Nagle
    off (TCP_NODELAY) only on connections whose socket says TCP; with protocol 0 a response's body
    waited for the client's delayed ACK of its head, 40 ms per call on a kept-alive connection."""
    sockets = []
    for host in hosts:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.set_inheritable(True)
        sockets.append(sock)
    return sockets


class QuietServer(uvicorn.Server):
    """uvicorn's server, with no periodic tick: uvicorn wakes ten times a second to refresh the
    Date header and to notice a shutdown request. Here the Date header is written per response
    (`DateHeader`, give the app wrapped in it and `date_header=False`) and a shutdown request
    (SIGTERM, SIGINT) wakes the loop itself, so an idle controller's event loop sleeps; it still
    looks at `should_exit` every WATCH seconds."""
    WATCH = 60.0

    def __init__(self, config: uvicorn.Config, on_stop=None):
        super().__init__(config)
        self.on_stop = on_stop

    async def shutdown(self, sockets=None) -> None:
        if self.on_stop is not None:
            self.on_stop()
        await super().shutdown(sockets)

    async def main_loop(self) -> None:
        self._exit_asked, self._loop = asyncio.Event(), asyncio.get_running_loop()
        while not await self.on_tick(0):
            try:
                await asyncio.wait_for(self._exit_asked.wait(), self.WATCH)
            except TimeoutError:
                pass

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        loop = getattr(self, "_loop", None)
        if loop is not None:
            loop.call_soon_threadsafe(self._exit_asked.set)


class DateHeader:
    """ASGI middleware: the Date header on every HTTP response (RFC 9110 asks it of a server with a
    clock), formatted once per second."""

    def __init__(self, app):
        self.app = app
        self._second, self._value = None, b""

    def _date(self) -> bytes:
        from email.utils import formatdate
        now = int(time.time())
        if now != self._second:
            self._second, self._value = now, formatdate(now, usegmt=True).encode()
        return self._value

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_dated(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (b"date", self._date())]}
            await send(message)
        return await self.app(scope, receive, send_dated)


class CutShort:
    """ASGI middleware: a request still running STOP_GRACE_S after SIGTERM is cancelled by uvicorn,
    which would answer it 500; it is answered 503 with Retry-After instead, so its client asks
    another replica. Whether a write so cut short is applied cannot be told (its thread may still
    commit it): a write with a request id runs at most once whichever replica the retry reaches
    (fathom.api.request_ids); a client without one reads before it retries
    (fathom.store.errors.Unavailable)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)
        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if started:     # too late for another status: uvicorn closes the connection
                raise
            response = store_error_response(Unavailable(
                "the controller is stopping and cut the request short; a write may have been applied: "
                "retry it with the same Idempotency-Key, or read the objects first"))
            response.headers["Retry-After"] = str(Busy.RETRY_AFTER)
            await response(scope, receive, send)
