"""A small client of fathom's REST API for the drivers (fathom's own fathom.client is not installed
in Neutron's environment: the two pin different libraries).

The driver authenticates with a token of role `service` and acts for the project of each Neutron
object by sending `X-Project` (docs/security.md of fathom).

Several fathom controllers (docs/ha.md of fathom): `urls` lists their endpoints. A call that
cannot reach one, or is answered 503, is made on the next, each endpoint once; the last that
answered is asked first next time; when none answers the journal retries later. Every write
carries an `Idempotency-Key` made once per call: a replica that already ran it answers with the
recorded response, so a write whose answer was lost is not run twice. A write's answer may name its
transaction (`X-Fathom-Commit`, where several fathom processes take writes); the newest is sent back
with each long-poll, so it waits for a status decided after that write, whichever process made it.
"""
from __future__ import annotations

import uuid

import requests

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
COMMIT = "X-Fathom-Commit"


class FathomError(Exception):
    """fathom answered with an error: `status` (4xx, 5xx) and the API's one-line reason."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


class Unreachable(Exception):
    """fathom did not answer (down, restarting, network): the write is retried later."""


class Client:
    def __init__(self, urls: str | list[str], token: str, timeout: float = 10.0):
        items = [urls] if isinstance(urls, str) else urls
        self.bases = [u.strip().rstrip("/") + "/v1" for item in items for u in item.split(",") if u.strip()]
        self.current = 0   # the endpoint asked first: the last one that answered
        self.commit: int | None = None   # the newest write's transaction fathom named
        self.timeout = timeout
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {token}"

    def request(self, method: str, path: str, project: str | None = None, timeout: float | None = None,
                headers: dict | None = None, **kwargs):
        headers = {**(headers or {}), **({"X-Project": project} if project else {})}
        if method in WRITES:
            headers["Idempotency-Key"] = uuid.uuid4().hex
        failures = []
        for attempt in range(len(self.bases)):
            i = (self.current + attempt) % len(self.bases)
            try:
                r = self.http.request(method, self.bases[i] + path, headers=headers,
                                      timeout=timeout or self.timeout, **kwargs)
            except requests.RequestException as e:
                failures.append(f"{self.bases[i]}: {e}")
                continue
            if r.status_code >= 500:
                # the controller restarting or overloaded: the next one, or like unreachable, later
                failures.append(f"{self.bases[i]}: {r.status_code} {r.text[:200]}")
                continue
            self.current = i
            break
        else:
            raise Unreachable(f"{method} {path}: " + "; ".join(failures))
        if (commit := r.headers.get(COMMIT, "")).isdigit():
            self.commit = max(self.commit or 0, int(commit))
        if r.status_code >= 400:
            raise FathomError(r.status_code, _reason(r))
        return r.json() if r.content else None

    def list(self, path: str, project: str | None = None, **params) -> list:
        """Every object of a list endpoint (limit + marker pages)."""
        out: list = []
        while True:
            page = self.request("GET", path, project, params={**params, "limit": 1000,
                                                              **({"marker": out[-1]["id"]} if out else {})})
            out += page
            if len(page) < 1000:
                return out

    def wait_status(self, collection: str, obj_id: int, want: str, timeout: float, project: str | None) -> dict:
        """One server-side long-poll (`GET /v1/<collection>/<id>?wait=<want>&timeout=<s>`): the object
        as soon as fathom decides its status is `want` (or `error`), or as it is after `timeout` s
        (at most 60); as fathom.client.Client.wait_status, without its loop (the caller asks again)."""
        return self.request("GET", f"/{collection}/{obj_id}", project, timeout=timeout + self.timeout,
                            params={"wait": want, "timeout": min(timeout, 60.0)},
                            headers={COMMIT: str(self.commit)} if self.commit is not None else None)

    def by_external_id(self, collection: str, external_id: str, project: str | None) -> dict | None:
        found = self.request("GET", f"/{collection}", project, params={"external_id": external_id})
        return found[0] if found else None


def _reason(r) -> str:
    try:
        detail = r.json().get("detail")
    except ValueError:
        return r.text[:300]
    if isinstance(detail, list):
        return "; ".join(".".join(str(p) for p in d.get("loc", []) if p not in ("body", "query", "path"))
                         + ": " + str(d.get("msg")) for d in detail)
    return str(detail)[:300]
