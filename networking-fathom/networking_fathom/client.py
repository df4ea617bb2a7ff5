"""A small client of fathom's REST API for the drivers (fathom's own fathom.client is not installed
in Neutron's environment: the two pin different libraries).

The driver authenticates with a token of role `service` and acts for the project of each Neutron
object by sending `X-Project` (docs/security.md of fathom).
"""
from __future__ import annotations

import requests


class FathomError(Exception):
    """fathom answered with an error: `status` (4xx, 5xx) and the API's one-line reason."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


class Unreachable(Exception):
    """fathom did not answer (down, restarting, network): the write is retried later."""


class Client:
    def __init__(self, url: str, token: str, timeout: float = 10.0):
        self.base = url.rstrip("/") + "/v1"
        self.timeout = timeout
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {token}"

    def request(self, method: str, path: str, project: str | None = None, **kwargs):
        headers = {"X-Project": project} if project else {}
        try:
            r = self.http.request(method, self.base + path, headers=headers, timeout=self.timeout, **kwargs)
        except requests.RequestException as e:
            raise Unreachable(f"{method} {path}: {e}") from None
        if r.status_code >= 500:
            # the controller restarting or overloaded: like unreachable, try again later
            raise Unreachable(f"{method} {path}: {r.status_code} {r.text[:200]}")
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
