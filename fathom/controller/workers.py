"""`fathom controller --api-workers N`: the REST API served by N processes on the same sockets.

The controller's process (worker 0) binds the API's sockets, then forks N-1 API workers before it
starts any thread; every process accepts on the same listening sockets, so the kernel spreads
connections over them. Each worker opens its own engine on the PostgreSQL store and serves every
route of the store (create_app). What only the controller's process holds — the reconciler, the
switches, the status board, the agents' presence and long-polls — it keeps: a worker makes the
requests it has no route for (flows, sync, health, metrics, traces, fabric status), the long-polls
`GET ...?wait=` and the agents' calls (/v1/agents/) on the controller process, over a loopback
socket of its own. A write committed in a worker wakes the controller process through the store
(fathom.cluster.feed: a NOTIFY in each writing transaction): its reconciler and the agents' long-polls. Every answer names the process that made it: header `X-Fathom-Worker`.

SQLite is refused: its writers serialise on one file lock and it has no notifications.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import time
from typing import Callable

import httpx
from starlette.routing import Match

from fathom.api.direct import ROUTES as DIRECT_ROUTES

LOG = logging.getLogger("fathom.controller")
WORKER_HEADER = b"x-fathom-worker"
# kept by the controller process alone: the agents' long-polls and reports (their presence), and
# the flow records the agents send and the queries of them (held in its memory)
CONTROLLER_PATHS = ("/v1/agents/", "/v1/flow-records")
HOP_HEADERS = {b"connection", b"keep-alive", b"transfer-encoding", b"date", b"content-length", b"host", b"server"}


def refuse_sqlite(db_url: str, api_workers: int) -> str | None:
    """Why `api_workers` cannot serve `db_url` (None: they can)."""
    if api_workers > 1 and not db_url.startswith("postgresql"):
        return (f"--api-workers {api_workers} needs a PostgreSQL store (--db postgresql+psycopg://...): "
                "SQLite serialises every write on one file lock and cannot tell other processes of a change")
    return None


def internal_socket() -> socket.socket:
    """The controller process's loopback socket that workers forward to."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.set_inheritable(True)
    return sock


def fork(count: int, run: Callable[[int], None]) -> list[int]:
    """Fork `count` workers running `run(index)` (index 1..count); each ends with its parent."""
    pids = []
    for index in range(1, count + 1):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                threading.Thread(target=_end_with, args=(os.getppid(),), daemon=True, name="parent-watch").start()
                run(index)
            except BaseException:   # noqa: BLE001 - a worker's end is logged, never raised into the parent's code
                LOG.exception("API worker %d failed", index)
                code = 1
            finally:
                os._exit(code)
        pids.append(pid)
    return pids


def _end_with(parent: int) -> None:
    """A worker's watch: once its parent (the controller's process) is gone, SIGTERM to itself."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def stop(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


class Wrapper:
    """ASGI middleware that passes for the FastAPI app it wraps (fathom.api.connections.Gate reads
    the app's state and documentation paths)."""

    def __getattr__(self, name):
        return getattr(self.app, name)


class WorkerHeader(Wrapper):
    """ASGI: the `X-Fathom-Worker` header (the index of the process) on every answer."""

    def __init__(self, app, index: int):
        self.app, self.value = app, str(index).encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def named(message):
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", ()) if h[0] != WORKER_HEADER]
                message = {**message, "headers": [*headers, (WORKER_HEADER, self.value)]}
            await send(message)
        return await self.app(scope, receive, named)


class ToController(Wrapper):
    """ASGI, in a worker: a request for a route the worker's app lacks, or a long-poll (`wait=`),
    made on the controller process at `url`; its answer passed back as it is."""

    def __init__(self, app, url: str):
        self.app = app
        self.client = httpx.AsyncClient(base_url=url, timeout=None, limits=httpx.Limits(max_connections=48))

    def _local(self, scope) -> bool:
        if (scope["method"], scope["path"]) in DIRECT_ROUTES:     # the most frequent, told without matching
            return True
        if scope["method"] == "GET" and b"wait=" in scope.get("query_string", b""):
            return False
        if scope["path"].startswith(CONTROLLER_PATHS):
            return False
        return any(route.matches(scope)[0] != Match.NONE for route in self.app.router.routes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self._local(scope):
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        query = scope.get("query_string", b"").decode("latin-1")
        headers = [(k, v) for k, v in scope["headers"] if k not in HOP_HEADERS]
        request = self.client.build_request(scope["method"], scope["path"] + (f"?{query}" if query else ""),
                                            headers=headers, content=body)
        try:
            r = await self.client.send(request, stream=True)
        except httpx.HTTPError as e:
            LOG.warning("controller process unreachable from API worker: %s", e)
            content = b'{"detail":[{"loc":[],"msg":"the controller process is not answering: retry","type":"busy"}]}'
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                                    (b"content-length", str(len(content)).encode())]})
            await send({"type": "http.response.body", "body": content})
            return
        # passed on as it comes (a server-sent event stream, /v1/events, never ends), until it ends
        # or the client goes (then the controller's stream is closed too)
        async def pass_on():
            await send({"type": "http.response.start", "status": r.status_code,
                        "headers": [(k, v) for k, v in r.headers.raw if k.lower() not in HOP_HEADERS]})
            async for chunk in r.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

        async def client_gone():
            while (await receive())["type"] != "http.disconnect":
                pass
        tasks = [asyncio.ensure_future(pass_on()), asyncio.ensure_future(client_gone())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if tasks[0].done() and not tasks[0].cancelled() and isinstance(tasks[0].exception(), httpx.HTTPError):
                LOG.warning("controller process ended an answer early: %s", tasks[0].exception())
        finally:
            for task in tasks:
                task.cancel()
            await r.aclose()
