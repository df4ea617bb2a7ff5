"""The one HTTP client of the controller's REST API (CLI, lab, demo, benchmarks, agent-less tools).

    api = Client("http://127.0.0.1:8080")                 # token: FATHOM_TOKEN / FATHOM_TOKEN_FILE
    api = Client.for_lab(lab.state())                      # a lab's controller, with its admin token
    net = api.post("/networks", json={"name": "blue"})   # paths are relative to /v1
    api.find("routers", "r1")                              # by id or by name
    api.list("/ports")                                     # every page (limit + marker)
    api.patch(f"/routers/{rid}", json={"mode": "fabric"})

Every answer of 400 and above raises `ApiError`, whose text is one line naming the fields at fault
(the API's error shape, docs/api.md); a controller that cannot be reached raises `Unreachable`
(an ApiError with status 0).

Several controllers (replicas, docs/ha.md): the URL may be a list of endpoints, comma separated
("https://a:8080,https://b:8080"). A call that cannot reach one, or is answered 503, is made again
on the next, each endpoint at most FAILOVER_ROUNDS times with a growing pause between rounds; the
last endpoint that answered is asked first next time. Every write (POST, PUT, PATCH, DELETE)
carries an `Idempotency-Key` made once per call, the same on every retry: a controller that already
ran the write answers with its recorded response instead of running it again (docs/api.md).
"""
from __future__ import annotations

import time
import uuid

import httpx

from fathom.auth.client import NoToken, lab_token, resolve_token

DEFAULT_CONTROLLER = "http://127.0.0.1:8080"
LONG_POLL = 30.0   # seconds one long-poll request may wait (the API allows up to 60)
BUSY_RETRIES = 2   # times a request answered 503 with Retry-After (store busy, nothing changed) is made again
FAILOVER_ROUNDS = 2   # times each endpoint is tried by one call that cannot reach any
FAILOVER_PAUSE = 0.25   # seconds between rounds over the endpoints, doubled each round
REQUEST_ID = "Idempotency-Key"
# a write's transaction, where several processes take writes; sent back with a long-poll, which then
# answers only from statuses that saw it (fathom.api.commits)
COMMIT = "X-Fathom-Commit"
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def endpoints(url: str | list[str]) -> list[str]:
    """The controller endpoints of a URL list: comma separated, or a list (each maybe a list)."""
    items = url if isinstance(url, (list, tuple)) else [url]
    found = [e.strip().rstrip("/") for item in items for e in item.split(",") if e.strip()]
    if not found:
        raise ValueError("no controller endpoint given")
    return list(dict.fromkeys(found))


def _retry_after(response: httpx.Response) -> float:
    """The wait a 503 asks for (Retry-After in seconds), between 0.1 and 5 s."""
    try:
        return min(max(float(response.headers.get("Retry-After", "1")), 0.1), 5.0)
    except ValueError:
        return 1.0


class ApiError(Exception):
    def __init__(self, status: int, message: str, detail: list | None = None):
        super().__init__(message)
        self.status = status
        self.detail = detail or []


class Unreachable(ApiError):
    def __init__(self, url: str, error: Exception | str):
        super().__init__(0, f"cannot reach the controller at {url}: {error}")


def error_line(response: httpx.Response) -> str:
    """One line from an API error: `409 conflict: fixed_ips.0.ip_address: 10.0.0.2 is in use`."""
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = None
    if isinstance(detail, list):
        parts = []
        for d in detail:
            loc = [str(p) for p in d.get("loc", []) if p not in ("body", "query", "path")]
            msg = str(d.get("msg")).removeprefix("Value error, ")
            parts.append(f"{'.'.join(loc)}: {msg}" if loc else msg)
        text = "; ".join(parts)
    else:
        text = str(detail or response.text or response.reason_phrase)
    return f"{response.status_code} {response.reason_phrase.lower()}: {text}"


class Client:
    """`token`: the bearer token (default: fathom.auth.client.resolve_token, i.e. FATHOM_TOKEN or
    FATHOM_TOKEN_FILE); `project`: the project a service token acts for (X-Project)."""

    def __init__(self, url: str | list[str] = DEFAULT_CONTROLLER, *, token: str | None = None,
                 project: str | None = None, timeout: float = 30.0):
        self.endpoints = endpoints(url)
        self.url = self.endpoints[0]
        self.missing_token: str | None = None
        if token is None:
            try:
                token = resolve_token()
            except NoToken as e:
                self.missing_token = str(e)
        headers = {**({"Authorization": f"Bearer {token}"} if token else {}),
                   **({"X-Project": project} if project else {})}
        self._clients = [httpx.Client(base_url=e + "/v1", headers=headers, timeout=timeout) for e in self.endpoints]
        self.http = self._clients[0]
        self.current = 0   # the endpoint asked first: the last one that answered
        self.commit: int | None = None   # the newest write's transaction id the controller named

    @classmethod
    def for_lab(cls, state: dict, **kwargs) -> "Client":
        """The controller of a lab (Lab.state()), with the lab's admin token."""
        return cls(state["controller"]["url"], token=lab_token(state), **kwargs)

    def request(self, method: str, path: str, *, project: str | None = None, raw: bool = False, **kwargs):
        """The decoded answer (None for 204), or with `raw` its bytes. `project` acts as that project
        for this request."""
        if self.missing_token:
            raise ApiError(401, self.missing_token)
        headers = {**kwargs.get("headers", {}), **({"X-Project": project} if project else {})}
        if method in WRITES:
            headers.setdefault(REQUEST_ID, uuid.uuid4().hex)   # once per call: every retry runs it at most once
        kwargs["headers"] = headers
        response = self._failover(method, path, kwargs)
        if (commit := response.headers.get(COMMIT, "")).isdigit():
            self.commit = max(self.commit or 0, int(commit))
        if response.is_error:
            try:
                detail = response.json().get("detail")
            except ValueError:
                detail = None
            raise ApiError(response.status_code, error_line(response),
                           detail if isinstance(detail, list) else None)
        if raw:
            return response.content
        return None if response.status_code == 204 or not response.content else response.json()

    def _failover(self, method: str, path: str, kwargs: dict) -> httpx.Response:
        """The answer of the first endpoint that gives one other than a 503 with Retry-After (busy:
        nothing was changed), starting with the current one. Unreachable names every endpoint and
        its failure when none answers; the last busy answer is returned when retries run out."""
        n = len(self.endpoints)
        failed: dict[str, str] = {}
        busy: httpx.Response | None = None
        pause = FAILOVER_PAUSE
        for attempt in range(max(FAILOVER_ROUNDS * n, BUSY_RETRIES + 1)):
            i = (self.current + attempt) % n
            if attempt and i == self.current:   # a round over every endpoint ended: pause, then again
                time.sleep(_retry_after(busy) if busy is not None else pause)
                pause *= 2
            busy = None
            try:
                response = self._clients[i].request(method, path, **kwargs)
            except httpx.HTTPError as e:
                failed[self.endpoints[i]] = f"{type(e).__name__}: {e}".rstrip(": ")
                continue
            if response.status_code != 503 or "Retry-After" not in response.headers:
                self.current = i
                return response
            busy = response
            failed[self.endpoints[i]] = error_line(response)
        if busy is not None:
            return busy
        raise Unreachable(", ".join(self.endpoints), "; ".join(f"{e}: {why}" for e, why in failed.items()))

    def get(self, path: str, **kwargs):
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs):
        return self.request("POST", path, **kwargs)

    def patch(self, path: str, **kwargs):
        return self.request("PATCH", path, **kwargs)

    def delete(self, path: str, **kwargs):
        return self.request("DELETE", path, **kwargs)

    def find(self, collection: str, ref: str | int) -> dict:
        """The object of `collection` ("networks", ...) whose id or name is `ref`."""
        ref = str(ref)
        if ref.isdigit():
            return self.get(f"/{collection}/{ref}")
        found = self.list(f"/{collection}", params={"name": ref})
        if not found:
            raise ApiError(404, f"no {collection[:-1]} named {ref!r}")
        if len(found) > 1:
            raise ApiError(409, f"{len(found)} {collection} are named {ref!r} (ids "
                                f"{', '.join(str(o['id']) for o in found)}): use an id")
        return found[0]

    def list(self, path: str, params: dict | None = None, page: int = 1000) -> list:
        """Every object of a list endpoint, page by page (limit + marker)."""
        out: list = []
        while True:
            batch = self.get(path, params={**(params or {}), "limit": page,
                                           **({"marker": out[-1]["id"]} if out else {})})
            out += batch
            if len(batch) < page:
                return out

    # ------------------------------------------------------------------ runtime (read from the switches)

    def health(self) -> dict:
        return self.get("/health")

    def sync(self) -> dict:
        """Run one reconcile pass now; per-node results."""
        return self.post("/sync")

    def node_flows(self, node: str) -> dict:
        return self.get(f"/nodes/{node}/flows")

    def tap_stats(self, tap_id: int) -> dict:
        return self.get(f"/taps/{tap_id}/stats")

    def wait_until(self, path: str, done, timeout: float, interval: float = 0.2) -> dict:
        """GET `path` until `done(answer)`; the last answer (ApiError 408 after `timeout` s)."""
        deadline = time.monotonic() + timeout
        while True:
            answer = self.get(path)
            if done(answer):
                return answer
            if time.monotonic() > deadline:
                raise ApiError(408, f"GET /v1{path}: not there after {timeout:g} s: {answer}")
            time.sleep(interval)

    def wait_status(self, collection: str, obj_id: int, want: str = "active", timeout: float = 10.0) -> dict:
        """The object of `collection` once its status is `want` (or `error`); ApiError 408 after
        `timeout` s. Every caller that waits for an object to come up uses this one method.

        A server-side long-poll (`GET /v1/<collection>/<id>?wait=<want>&timeout=<s>`): the
        controller answers as soon as a reconcile pass that saw every write made before the call
        (and this client's last write, wherever it was made: COMMIT) decides that status, so
        nothing polls. Long waits are made of requests of at most
        LONG_POLL seconds each."""
        path = f"/{collection}/{obj_id}"
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            chunk = min(max(remaining, 0.001), LONG_POLL)
            asked = time.monotonic()
            answer = self.get(path, params={"wait": want, "timeout": round(chunk, 3)}, timeout=chunk + 10,
                              headers={COMMIT: str(self.commit)} if self.commit is not None else {})
            if answer.get("status") in (want, "error"):
                return answer
            if time.monotonic() >= deadline:
                raise ApiError(408, f"GET /v1{path}: status {answer.get('status')!r}, not {want!r} after "
                                    f"{timeout:g} s: {answer.get('status_reason')}")
            if time.monotonic() - asked < chunk / 2:
                time.sleep(0.05)   # answered early without the status: a server with no reconciler

    def close(self) -> None:
        for client in self._clients:
            client.close()
