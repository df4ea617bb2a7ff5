"""Connections to the API: how many, from where, for how long (the controller's uvicorn server).

The API port is reachable from every node's management network, so one misbehaving host must not
be able to hold it. `Guard` keeps the server's connections and decides, per connection and per
request (docs/security.md, *Connections and slow clients*):

- **Per source**: at most `per_source` connections served at once from one address (an IPv6 /64
  counts as one). A further connection from a source at its limit is held: accepted but not read,
  in a queue of its source, until one of the source's served connections closes (the oldest held
  is served next) or `hold_timeout` seconds pass (it is closed). Holding, not closing, is what
  keeps a host that reconnects whatever is closed from making the server accept and close
  connections as fast as it can: its excess connections cost a file and a few kilobytes each, no
  CPU. At most `max_held` connections are held in all; beyond that a new excess connection is
  closed at once. Addresses in `trusted_proxies` (a reverse proxy that limits its clients itself)
  have no per-source limit.
- **In total**: at most `max_connections`. At the limit a new connection replaces the oldest
  connection waiting for a head, those that never carried an authenticated request first; a
  connection serving a request is never closed for another. Nothing answers 503 for want of room.
- **Deadlines**: a request head must arrive whole within `head_timeout` seconds of the connection
  (or of the previous response); heads longer than `max_head` bytes are refused with 431 even when
  they arrive in one piece with their body (`GuardedProtocol`). The body's deadline
  is fathom.api.limits.BoundedInput's.
- **Requests without a valid token** (`Gate`): they are answered before their body is read — 401,
  and the connection closed — and cost their source one token of a bucket refilled at
  `source_rate` per second (bursts of `source_burst`): an empty bucket gets 429 with Retry-After,
  before the token is looked up in the store (or Keystone). A request whose token turns out valid
  costs nothing; its connection becomes authenticated and is the last to be closed under pressure. The source of a request that came
  through a trusted proxy is the last address of its X-Forwarded-For.

Environment of the controller (read by `ConnectionLimits.from_env`): FATHOM_API_MAX_CONNECTIONS
(default 4096, at most half the process's open-file limit), FATHOM_API_SOURCE_CONNECTIONS (64),
FATHOM_API_SOURCE_RATE (requests/s without a valid token, 50), FATHOM_API_SOURCE_BURST (2 x rate),
FATHOM_API_HEAD_TIMEOUT (s, 10), FATHOM_API_HOLD_TIMEOUT (s, 60), FATHOM_API_MAX_HELD (default
the connection limit), FATHOM_API_TRUSTED_PROXIES (addresses, comma-separated; none).
"""
from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import resource
import time
from collections import Counter, OrderedDict

from starlette.concurrency import run_in_threadpool
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from fathom.api.auth import Unauthenticated
from fathom.api.deps import store_error_response
from fathom.api.ingest_limits import TooMany

MAX_HEAD = 64 * 1024
SERVE, HOLD, REFUSE = "serve", "hold", "refuse"        # what the guard does with a new connection
MAX_BUCKETS = 65536      # sources whose request-rate bucket is remembered (least recently used dropped)


@dataclasses.dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 4096
    per_source: int = 64
    source_rate: float = 50.0
    source_burst: float = 100.0
    head_timeout: float = 10.0
    hold_timeout: float = 60.0
    max_held: int = 4096
    max_head: int = MAX_HEAD
    trusted_proxies: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, env=os.environ) -> ConnectionLimits:
        rate = float(env.get("FATHOM_API_SOURCE_RATE", cls.source_rate))
        proxies = [a for a in env.get("FATHOM_API_TRUSTED_PROXIES", "").split(",") if a.strip()]
        max_connections = int(env.get("FATHOM_API_MAX_CONNECTIONS", cls.max_connections))
        return cls(max_connections=max_connections, max_held=int(env.get("FATHOM_API_MAX_HELD", max_connections)),
                   hold_timeout=float(env.get("FATHOM_API_HOLD_TIMEOUT", cls.hold_timeout)),
                   per_source=int(env.get("FATHOM_API_SOURCE_CONNECTIONS", cls.per_source)),
                   source_rate=rate, source_burst=float(env.get("FATHOM_API_SOURCE_BURST", 2 * rate)),
                   head_timeout=float(env.get("FATHOM_API_HEAD_TIMEOUT", cls.head_timeout)),
                   trusted_proxies=frozenset(str(ipaddress.ip_address(a.strip())) for a in proxies))


def raise_open_files() -> int:
    """Raise the soft limit on open files to the hard one (each connection is a file); the new
    soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:          # the kernel's own ceiling, then
        with open("/proc/sys/fs/nr_open") as f:
            target = int(f.read())
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def source_of(host: str) -> str:
    """The source an address counts under: itself, or its /64 for IPv6 (one host's usual share)."""
    if ":" not in host:          # IPv4, as the kernel spells it
        return host
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return f"{ipaddress.IPv6Network((address, 64), strict=False).network_address}/64"


class _Source:
    __slots__ = ("open", "waiting", "held")

    def __init__(self):
        self.open = 0
        self.waiting: OrderedDict[GuardedProtocol, None] = OrderedDict()   # oldest first
        self.held: OrderedDict[GuardedProtocol, None] = OrderedDict()      # oldest first


class Guard:
    """The connections of one server, by source and by state (see the module's text)."""

    def __init__(self, limits: ConnectionLimits):
        self.limits = limits
        self.open = 0
        self.held = 0
        self.sources: dict[str, _Source] = {}
        # connections waiting for a request head, oldest first: [0] never authenticated, [1] authenticated
        self.waiting: tuple[OrderedDict, OrderedDict] = (OrderedDict(), OrderedDict())
        self.by_client: dict[tuple, GuardedProtocol] = {}
        self.buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()   # source -> (tokens, at)
        self.counts: Counter[str] = Counter()   # refused, shed, head_timeouts, heads_too_large, rate_limited, unauthenticated
        self.protocol = type("GuardedHttpTools", (GuardedProtocol,), {"guard": self})

    def stats(self) -> dict:
        return {"open": self.open, "held_now": self.held, "sources": len(self.sources),
                "waiting_for_head": len(self.waiting[0]) + len(self.waiting[1]), **self.counts}

    # --- connections
    def admit(self, conn: GuardedProtocol, host: str) -> str:
        """What becomes of a new connection from `host`: SERVE it (room made by closing others if need
        be), HOLD it until its source has room, or REFUSE it."""
        key = source_of(host)
        source = self.sources.get(key)
        if source is not None and source.open >= self.limits.per_source and host not in self.limits.trusted_proxies:
            if self.held >= self.limits.max_held:
                self.counts["refused"] += 1
                return REFUSE
            self.counts["held"] += 1
            self.held += 1
            conn.source_key, conn.source = key, source
            source.held[conn] = None
            return HOLD
        if self.open >= self.limits.max_connections:
            victims = self.waiting[0] or self.waiting[1]
            if not victims:
                self.counts["refused"] += 1
                return REFUSE
            self.shed(next(iter(victims)))
        source = self.sources.get(key) or self.sources.setdefault(key, _Source())
        conn.source_key, conn.source = key, source
        source.open += 1
        self.open += 1
        return SERVE

    def shed(self, conn: GuardedProtocol) -> None:
        self.counts["shed"] += 1
        self.release(conn)
        conn.transport.close()

    def release(self, conn: GuardedProtocol) -> None:
        source = conn.source
        if source is None:
            return
        conn.source = None
        if conn.held is not None:
            del source.held[conn]
            self.held -= 1
        else:
            self.busy(conn, source)
            self.by_client.pop(conn.client, None)
            source.open -= 1
            self.open -= 1
            if source.held:                      # the oldest held connection of the source is served next
                nxt = next(iter(source.held))
                del source.held[nxt]
                self.held -= 1
                source.open += 1
                self.open += 1
                nxt.source = source
                nxt.loop.call_soon(nxt.serve)
        if source.open == 0 and not source.held:
            del self.sources[conn.source_key]

    def awaiting_head(self, conn: GuardedProtocol) -> None:
        self.waiting[conn.authenticated][conn] = None
        conn.source.waiting[conn] = None

    def busy(self, conn: GuardedProtocol, source: _Source | None = None) -> None:
        self.waiting[0].pop(conn, None)
        self.waiting[1].pop(conn, None)
        (source or conn.source).waiting.pop(conn, None)

    # --- requests
    def take(self, key: str) -> float:
        """0 if a request from source `key` may look its token up now, else the seconds until it may."""
        rate, burst = self.limits.source_rate, self.limits.source_burst
        now = time.monotonic()
        tokens, at = self.buckets.pop(key, (burst, now))
        tokens = min(burst, tokens + (now - at) * rate)
        if len(self.buckets) >= MAX_BUCKETS:
            self.buckets.popitem(last=False)
        if tokens < 1:
            self.buckets[key] = (tokens, now)
            return (1 - tokens) / rate if rate > 0 else 60.0
        self.buckets[key] = (tokens - 1, now)
        return 0.0

    def refund(self, key: str) -> None:
        """The request `take` let through had a valid token after all: it costs nothing."""
        tokens, at = self.buckets.get(key, (0.0, 0.0))
        self.buckets[key] = (min(self.limits.source_burst, tokens + 1), at)


class _HeadTooLarge(Exception):
    pass


class OneWrite:
    """A response's transport for uvicorn's request cycle, which writes the head at
    http.response.start and the body at http.response.body: the head is held and written with the
    body's first write, one send (and one segment to the client) instead of two. A 100 Continue
    goes out at once; closing writes a head still held."""
    __slots__ = ("transport", "head", "started")

    def __init__(self, transport):
        self.transport, self.head, self.started = transport, b"", False

    def write(self, data: bytes) -> None:
        if not self.started and not data.startswith(b"HTTP/1.1 100 "):
            self.started, self.head = True, data
            return
        if self.head:
            data, self.head = self.head + data, b""
        self.transport.write(data)

    def close(self) -> None:
        if self.head:
            self.transport.write(self.head)
            self.head = b""
        self.transport.close()

    def __getattr__(self, name):
        return getattr(self.transport, name)


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under a `Guard` (use `Guard.protocol`, whose class names it).

    A request head is measured twice: while it is incomplete, by the bytes received since the
    previous request ended (httptools keeps a header value that never ends in memory: it is refused
    beyond `max_head`); when it is complete, by its request line and header fields (a head that
    arrived in one piece with its body)."""
    guard: Guard

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.source: _Source | None = None
        self.source_key = ""
        self.authenticated = False
        self._head_timer = None
        self.held = None           # (transport, timer) while held for room at its source
        self._early = b""          # what a held connection sent before its reading was paused
        self._received = 0         # bytes received while the head being read is incomplete (None: in a body)
        self._head = 0             # its request line and header fields so far
        self.refused_status = 400  # of the last request refused by the parser

    def connection_made(self, transport) -> None:
        peer = transport.get_extra_info("peername")
        verdict = self.guard.admit(self, peer[0] if isinstance(peer, tuple) else "")
        if verdict is REFUSE:
            transport.abort()
        elif verdict is HOLD:       # reading is paused at its first data (the loop starts reading after this call)
            self.held = (transport, self.loop.call_later(self.guard.limits.hold_timeout, self._hold_timed_out))
        else:
            self._serve(transport)

    def serve(self) -> None:
        """Serve a held connection: its source has room now (the guard counted it)."""
        transport, timer = self.held
        timer.cancel()
        self.held = None
        if transport.is_closing():
            self.guard.release(self)
            return
        transport.resume_reading()
        self._serve(transport)
        early, self._early = self._early, b""
        if early:
            self.data_received(early)

    def data_received(self, data: bytes) -> None:
        if self.held is not None:
            self.held[0].pause_reading()
            self._early += data
            if len(self._early) > self.guard.limits.max_head:
                self._hold_timed_out()
            return
        if self._received is not None:
            self._received += len(data)
        super().data_received(data)
        if self._received is not None and self._received > self.guard.limits.max_head \
                and not self.transport.is_closing():
            self._refuse_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head = 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._head += len(url) + 16         # the method and version around it

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._head += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        if self._head > self.guard.limits.max_head:
            self.refused_status = 431
            raise _HeadTooLarge     # the parser fails the request: send_400_response answers 431
        self._received = None
        previous = self.cycle
        super().on_headers_complete()
        if self.cycle is not previous and self.cycle.scope["method"] != "HEAD":   # HEAD: uvicorn writes no body
            self.cycle.transport = OneWrite(self.transport)
        if self.source is not None:             # a request head arrived
            self.guard.busy(self)
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._received = 0

    def _serve(self, transport) -> None:
        super().connection_made(transport)
        self.guard.by_client[self.client] = self
        self._await_head()

    def _hold_timed_out(self) -> None:
        self.guard.counts["hold_timeouts"] += 1
        transport, _ = self.held
        self.guard.release(self)
        self.held = None
        transport.abort()

    def connection_lost(self, exc) -> None:
        if self.held is not None:         # closed while held
            self.held[1].cancel()
            self.guard.release(self)
            self.held = None
            return
        if self.transport is None:        # refused in connection_made, or closed while held
            return
        self.guard.release(self)
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.source is not None:
            self._await_head()

    def _await_head(self) -> None:
        self.guard.awaiting_head(self)
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.guard.limits.head_timeout, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        waiting_for_head = self.cycle is None or self.cycle.response_complete
        if waiting_for_head and not self.transport.is_closing():
            self.guard.counts["head_timeouts"] += 1
            self.transport.close()

    def _refuse_head(self) -> None:
        self.refused_status = 431
        self.send_400_response("")

    def send_400_response(self, msg: str) -> None:
        """A request the parser refused: 400, or 431 for a head too large; the connection closed."""
        status = self.refused_status
        if status == 431:
            self.guard.counts["heads_too_large"] += 1
            msg = f"the request head is larger than {self.guard.limits.max_head} bytes"
        body = msg.encode()
        self.transport.write(b"".join([
            STATUS_LINE[status], b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body]))
        self.transport.close()


class Gate:
    """ASGI middleware in front of the API (`api`, its FastAPI app) under a `Guard`: requests
    without a valid token are limited per source and answered before their body is read."""

    def __init__(self, api, guard: Guard):
        self.api, self.guard = api, guard
        self.public = {p for p in (api.openapi_url, api.docs_url, api.redoc_url,
                                   api.swagger_ui_oauth2_redirect_url) if p}
        # paths that hold no data (the console's pages and scripts: fathom.api.console)
        self.public_prefixes = tuple(getattr(api.state, "public_prefixes", ()))
        # paths any method may reach without a token (the console's login: it makes the token)
        self.public_paths = frozenset(getattr(api.state, "public_paths", ()))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.api(scope, receive, send)
        conn = self.guard.by_client.get(tuple(scope.get("client") or ()))
        token = _bearer(scope)
        auth = self.api.state.authenticator
        who = auth.known(token) if token else None
        if who is None:
            source = self._source(scope)
            scope.setdefault("state", {})["source"] = source     # the route's request.state.source
            wait = self.guard.take(source)
            if wait:
                self.guard.counts["rate_limited"] += 1
                return await _closing(store_error_response(TooMany(
                    f"too many requests without a valid token from {source}: retry later", wait)),
                    math.ceil(wait))(scope, receive, send)
            if token:
                try:
                    who = await run_in_threadpool(auth.identify, token)
                except Exception:          # the store failed: the API authenticates and answers itself
                    return await self.api(scope, receive, send)
                if who is not None:
                    self.guard.refund(source)
            if who is None and scope["path"] not in self.public_paths and not (scope["method"] in ("GET", "HEAD") and (
                    scope["path"] in self.public or scope["path"].startswith(self.public_prefixes))):
                self.guard.counts["unauthenticated"] += 1
                message = ("the token is unknown, expired or revoked" if token else
                           "give a token: Authorization: Bearer <token> (see `fathom token`)")
                return await _closing(store_error_response(Unauthenticated(message)))(scope, receive, send)
        if who is not None and conn is not None:
            conn.authenticated = True
        await self.api(scope, receive, send)

    def _source(self, scope) -> str:
        host = (scope.get("client") or ("",))[0]
        if host in self.guard.limits.trusted_proxies:
            forwarded = [v for k, v in scope["headers"] if k == b"x-forwarded-for"]
            if forwarded:
                last = forwarded[-1].decode("latin-1").rsplit(",", 1)[-1].strip()
                try:
                    host = str(ipaddress.ip_address(last))
                except ValueError:
                    pass
        return source_of(host)


def _bearer(scope) -> str | None:
    for k, v in scope["headers"]:
        if k == b"authorization":
            scheme, _, token = v.decode("latin-1").partition(" ")
            return token.strip() or None if scheme.lower() == "bearer" else None
    return None


def _closing(response, retry_after: int | None = None):
    response.headers["Connection"] = "close"
    if retry_after is not None:
        response.headers["Retry-After"] = str(retry_after)
    return response
