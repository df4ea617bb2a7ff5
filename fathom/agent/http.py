"""The agent's HTTP client: JSON over one kept-alive HTTP/1.1 connection, on the standard library.

The agent is a small process on every node: it needs GET with a query and POST of a body (JSON,
or bytes of another type), nothing more, so it does not load httpx (and its TLS context,
certificate bundle and HTTP/2 machinery) for it. The interface is the subset of httpx.Client the
agent uses (`get`, `post`, `close`; responses with `status_code`, `text`, `json()`), so tests may
hand it an httpx client.

Failures of the transport (refused, reset, timed out, TLS) raise ConnectionError, an OSError. A
request on a kept-alive connection that the server closed meanwhile (it closes idle ones after a
few seconds) is sent once more on a new connection: the server had not read it.

Several controllers (docs/ha.md): `base_url` may list endpoints, comma separated. A request that
fails on one (transport failure, or 503) is made once on each of the others in turn, the last that
answered asked first next time; the agent's own loop backs off when none answers. Its writes are
idempotent by themselves (a report is the node's whole state, PPTMon records are stored once per
record key), so they carry no request id.
"""
from __future__ import annotations

import http.client
import json as jsonlib
import socket
import ssl
import threading
from urllib.parse import urlencode, urlsplit

from fathom.model.hostlocal import KEEPALIVE_HEADER


# how many of a held long-poll's spaces (fathom.api.agents) may go missing before its controller
# counts as stopped
KEEPALIVE_MISSED = 3


def _seconds(header: str | None) -> float | None:
    try:
        value = float(header) if header is not None else None
    except ValueError:
        return None
    return value if value is not None and 0 < value <= 3600 else None


class Response:
    def __init__(self, status_code: int, content: bytes):
        self.status_code = status_code
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self):
        return jsonlib.loads(self.content)


class JsonClient:
    def __init__(self, base_url: str, timeout: float = 10.0, headers: dict | None = None,
                 verify: bool | str = True):
        self.endpoints = []
        for item in base_url.split(","):
            url = urlsplit(item.strip().rstrip("/"))
            if url.scheme not in ("http", "https") or not url.hostname:
                raise ValueError(f"not an http(s) URL: {item!r}")
            self.endpoints.append((url.scheme, url.hostname, url.port or (443 if url.scheme == "https" else 80),
                                   url.path))
        self.current = 0   # the endpoint asked first: the last one that answered
        self.timeout = timeout
        self.headers = {"Accept": "application/json", "User-Agent": "fathom-agent", **(headers or {})}
        self.context: ssl.SSLContext | None = None
        if any(e[0] == "https" for e in self.endpoints):
            if verify is False:
                self.context = ssl._create_unverified_context()   # the operator's explicit choice
            else:
                self.context = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
        self._conn: http.client.HTTPConnection | None = None
        self._keepalive: dict[int, float] = {}   # endpoint -> the seconds between its long-polls' spaces
        self._lock = threading.Lock()
        self._aborted = False

    def get(self, path: str, params: dict | None = None, timeout: float | None = None) -> Response:
        """GET with `params` as its query. One that asks `keepalive` (a long-poll whose waiting answer
        is a space every `keepalive` seconds: fathom.api.agents) waits at most KEEPALIVE_MISSED of them
        for each byte on an endpoint whose answers said it sends them, so a controller that stopped
        (paused, hung) is left for the next endpoint in seconds, not at `timeout`."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        return self.request("GET", path + (f"?{urlencode(query)}" if query else ""), None, timeout,
                            keepalive="keepalive" in query)

    def post(self, path: str, json=None, timeout: float | None = None, content: bytes | None = None,
             headers: dict | None = None) -> Response:
        """POST `json` (as JSON), or `content` as it is with its Content-Type in `headers`."""
        if content is None:
            content = jsonlib.dumps(json, separators=(",", ":")).encode() if json is not None else b""
            headers = {"Content-Type": "application/json", **(headers or {})}
        return self.request("POST", path, content, timeout, headers)

    def request(self, method: str, path: str, body: bytes | None, timeout: float | None,
                extra_headers: dict | None = None, keepalive: bool = False) -> Response:
        """On each endpoint in turn from the current one, until one answers other than 503."""
        headers = {**self.headers, **(extra_headers or {})}
        failures = []
        for attempt in range(len(self.endpoints)):
            if attempt:
                with self._lock:
                    if self._aborted:
                        break
                    self._drop()
                    self.current = (self.current + 1) % len(self.endpoints)
            try:
                r = self._request(method, path, body, timeout, headers, keepalive)
            except ConnectionError as e:
                failures.append(f"{self._name()}: {e}")
                continue
            if r.status_code != 503 or attempt == len(self.endpoints) - 1:
                return r
            failures.append(f"{self._name()}: 503")
        raise ConnectionError("; ".join(failures))

    def _name(self) -> str:
        scheme, host, port, _ = self.endpoints[self.current]
        return f"{scheme}://{host}:{port}"

    def _request(self, method: str, path: str, body: bytes | None, timeout: float | None,
                 headers: dict, keepalive: bool = False) -> Response:
        with self._lock:
            self.scheme, self.host, self.port, self.prefix = self.endpoints[self.current]
            self._aborted = False
            wait = timeout if timeout is not None else self.timeout
            every = self._keepalive.get(self.current) if keepalive else None
            for attempt in (0, 1):
                reused = self._conn is not None
                try:
                    conn = self._connection(wait if every is None else min(wait, KEEPALIVE_MISSED * every))
                    conn.request(method, self.prefix + path, body=body, headers=headers)
                    r = conn.getresponse()
                    if keepalive and (said := _seconds(r.getheader(KEEPALIVE_HEADER))) is not None:
                        self._keepalive[self.current] = said
                        conn.sock.settimeout(min(wait, KEEPALIVE_MISSED * said))
                    content = r.read()
                    if r.will_close:
                        self._drop()
                    return Response(r.status, content)
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                    self._drop()
                    if reused and attempt == 0 and not self._aborted:
                        continue          # the server closed the idle connection: once more, anew
                    raise ConnectionError(f"{method} {path.split('?')[0]}: {e}") from None
                except (OSError, http.client.HTTPException, ssl.SSLError) as e:
                    self._drop()
                    raise ConnectionError(f"{method} {path.split('?')[0]}: {type(e).__name__}: {e}") from None
        raise AssertionError("unreachable")

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._conn is None:
            if self.context is not None:
                self._conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self.context)
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            self._conn.connect()
            self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        else:
            self._conn.sock.settimeout(timeout)
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self._drop()

    def abort(self) -> None:
        """End a request in progress (a long-poll) from another thread or a signal handler: its
        connection is shut down and the request fails with ConnectionError. Takes no lock."""
        self._aborted = True
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
