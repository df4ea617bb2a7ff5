"""The agent follows its node's host-local desired state and reports back.

Loop: long-poll `GET /v1/agents/<node>/desired?after=<revision>` (the controller answers at once
when the revision moved on, else after `poll` seconds); apply a new revision with every handler
(one per object kind: fathom.agent.routers, fathom.agent.pptmon), each idempotent; report the facts,
the applied revision and every object's status, with its counters where the handler keeps some
(`POST /v1/agents/<node>/report`) at once after an
apply and every `report_interval` seconds otherwise (the controller takes silence for death).
Every `resync` seconds the current state is applied again, repairing what was changed under us
(every `report_interval` while a handler says an object is `pending`, waiting for the host).

Nothing is torn down when the controller is unreachable: the host keeps what it holds and the
agent retries with backoff. After an agent restart the first answer is applied like any other:
handlers adopt what is already right (a router namespace, a running loader), so nothing is rebuilt.
"""
from __future__ import annotations

import logging
import random
import threading
import time

import httpx

from fathom.model.hostlocal import from_json

LOG = logging.getLogger("fathom.agent.follow")


class Follower:
    def __init__(self, http: httpx.Client, node: str, handlers: list, facts, poll: float = 20.0,
                 report_interval: float = 5.0, resync: float = 30.0, backoff_max: float = 10.0):
        self.http = http
        self.node = node
        self.handlers = {h.KIND: h for h in handlers}
        self.facts = facts                  # () -> dict
        self.poll = poll
        self.report_interval = report_interval
        self.resync = resync
        self.backoff_max = backoff_max
        self.started = time.time()
        self.revision: int | None = None
        self.objects: list = []
        self.statuses: dict[str, dict] = {}
        self.last_apply = 0.0
        self.last_report = 0.0
        self.failures = 0
        self.last_error: str | None = None
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    # ----- one step each
    def fetch(self, wait: float) -> bool:
        """Ask for the desired state, waiting up to `wait` seconds for a revision after ours (a
        long-poll); True if it is a new revision."""
        params = {"after": self.revision, "timeout": round(wait, 3)} if wait > 0 and self.revision is not None else {}
        r = self.http.get(f"/v1/agents/{self.node}/desired", params=params, timeout=wait + 10)
        if r.status_code != 200:
            raise RuntimeError(f"desired state: HTTP {r.status_code}: {r.text[:300]}")
        body = r.json()
        self.report_interval = min(self.report_interval, float(body.get("report_interval_s") or self.report_interval))
        if body["revision"] == self.revision:
            return False
        objects = []
        for data in body["objects"]:
            try:
                objects.append(from_json(data))
            except (ValueError, TypeError) as e:   # a kind this agent does not know (a newer controller)
                LOG.warning("ignoring a host-local object: %s", e)
        self.revision, self.objects = body["revision"], objects
        LOG.info("desired state revision %d: %d objects", self.revision, len(objects))
        return True

    def apply(self) -> None:
        statuses: dict[str, dict] = {}
        for kind, handler in self.handlers.items():
            statuses.update(handler.apply([o for o in self.objects if o.KIND == kind]))
        for o in self.objects:
            if o.KIND not in self.handlers:
                key = f"{o.owner[0]}:{o.owner[1]}"
                statuses[key] = {"status": "error", "reason": f"this agent cannot hold {o.KIND} objects"}
        with self.lock:
            self.statuses = statuses
        self.last_apply = time.monotonic()

    def _resync_after(self) -> float:
        """`resync`, or the report interval while an object waits for something on the host (a
        handler said `pending`, e.g. a VIF not plugged yet): it is applied again soon."""
        with self.lock:
            waiting = any(v.get("status") == "pending" for v in self.statuses.values())
        return self.report_interval if waiting else self.resync

    def report(self) -> None:
        counters = {}
        for kind, handler in self.handlers.items():   # what a handler measures (PPTMon's counters)
            if hasattr(handler, "counters"):
                counters.update(handler.counters([o for o in self.objects if o.KIND == kind]))
        with self.lock:
            objects = {k: {**v, "counters": counters[k]} if k in counters else v for k, v in self.statuses.items()}
            body = {"agent_started": self.started, "applied_revision": self.revision, "facts": self.facts(),
                    "objects": objects}
        r = self.http.post(f"/v1/agents/{self.node}/report", json=body)
        if r.status_code != 204:
            raise RuntimeError(f"report: HTTP {r.status_code}: {r.text[:300]}")
        self.last_report = time.monotonic()

    # ----- the loop
    def run(self) -> None:
        first = True
        while not self.stopping.is_set():
            try:
                # wait for a change until the next report is due; a fresh start (or a failure) asks at once
                until_report = self.report_interval - (time.monotonic() - self.last_report)
                changed = self.fetch(0.0 if first else max(0.0, min(self.poll, until_report)))
                if changed or time.monotonic() - self.last_apply >= self._resync_after():
                    self.apply()
                    self.report()
                elif time.monotonic() - self.last_report >= self.report_interval:
                    self.report()
                first = False
                if self.failures:
                    LOG.info("controller reachable again after %d failures", self.failures)
                self.failures, self.last_error = 0, None
            except Exception as e:  # noqa: BLE001 - the agent outlives a bad moment; the host keeps its state
                if not isinstance(e, (httpx.HTTPError, RuntimeError, ValueError, KeyError)):
                    LOG.exception("host-local step")
                self.failures += 1
                delay = min(self.backoff_max, 0.5 * 2 ** (self.failures - 1)) * random.uniform(0.5, 1.0)
                why = f"{type(e).__name__}: {e}"
                if why != self.last_error or self.failures in (1, 5) or self.failures % 20 == 0:
                    LOG.warning("controller: %s (retry in %.1f s; the host keeps what it holds)", why, delay)
                self.last_error = why
                first = True
                self.stopping.wait(delay)

    def stop(self) -> None:
        self.stopping.set()

    def status(self) -> dict:
        with self.lock:
            return {"revision": self.revision, "objects": dict(self.statuses), "failures": self.failures,
                    "last_error": self.last_error}
