"""The agent follows its node's host-local desired state and reports back.

Loop: long-poll `GET /v1/agents/<node>/desired?after=<revision>` (the controller answers at once
when the revision moved on, else after `poll` seconds); apply a new revision with every handler
(one per object kind: fathom.agent.routers, fathom.agent.pptmon), each idempotent; report the facts,
the applied revision and every object's status, with its counters where the handler keeps some
(`POST /v1/agents/<node>/report`) when any of them changed, and otherwise only every
`report_interval` seconds (a rare liveness beat: the held long-poll is what tells the controller
this agent is alive). Every `resync` seconds the current state is applied again, repairing what was
changed under us, and the facts are read again.

At rest that is one long-poll renewed every `poll` seconds: no host command, no report. Two things
make the agent look every `busy_interval` seconds instead: an object a handler says is `pending`
(waiting for something on the host, e.g. a VIF not plugged yet) is applied again, and while a handler
keeps counters of what it holds (PPTMon's loaders) they are read and reported when they moved.

The desired state's answer may carry trace requests (fathom.api.agent_traces): each is run at once
(`ovs-appctl ofproto/trace`, fathom.agent.trace) and its output posted back, before anything else;
and capture requests (fathom.api.agent_captures), each started in a thread of its own
(fathom.agent.capture).

Nothing is torn down when the controller is unreachable: the host keeps what it holds and the
agent retries with backoff. After an agent restart the first answer is applied like any other:
handlers adopt what is already right (a router namespace, a running loader), so nothing is rebuilt.
"""
from __future__ import annotations

import logging
import random
import sys
import threading
import time

from fathom.model.hostlocal import from_json

LOG = logging.getLogger("fathom.agent.follow")
# seconds between the spaces of a held long-poll's answer (fathom.api.agents): a controller that
# sends none for fathom.agent.http.KEEPALIVE_MISSED of them is left for the next one
KEEPALIVE = 5.0


class Follower:
    def __init__(self, http, node: str, handlers: list, facts, poll: float = 55.0,
                 report_interval: float = 300.0, resync: float = 300.0, backoff_max: float = 10.0,
                 busy_interval: float = 5.0, tracer=None, capturer=None):
        """`http`: fathom.agent.http.JsonClient (or an httpx.Client) on the controller's URL;
        `facts`: () -> dict, read at the start, after each apply and every `resync` seconds;
        `tracer`: answers the trace requests that come with the desired state (fathom.agent.trace);
        `capturer`: the capture requests (fathom.agent.capture)."""
        self.http = http
        self.tracer = tracer
        self.capturer = capturer
        self.node = node
        self.handlers = {h.KIND: h for h in handlers}
        self.facts = facts                  # () -> dict
        self.poll = poll
        self.report_interval = report_interval
        self.resync = resync
        self.backoff_max = backoff_max
        self.busy_interval = busy_interval
        self.started = time.time()
        self.revision: int | None = None
        self.objects: list = []
        self.statuses: dict[str, dict] = {}
        self.last_apply = 0.0
        self.last_report = 0.0
        self.known_facts: dict | None = None
        self.reported: dict | None = None     # the last report the controller took
        self.failures = 0
        self.last_error: str | None = None
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    # ----- one step each
    def fetch(self, wait: float) -> bool:
        """Ask for the desired state, waiting up to `wait` seconds for a revision after ours (a
        long-poll); True if it is a new revision."""
        params = ({"after": self.revision, "timeout": round(wait, 3), "keepalive": KEEPALIVE}
                  if wait > 0 and self.revision is not None else {})
        r = self.http.get(f"/v1/agents/{self.node}/desired", params=params, timeout=wait + 10)
        if r.status_code != 200:
            raise RuntimeError(f"desired state: HTTP {r.status_code}: {r.text[:300]}")
        body = r.json()
        if "detail" in body:   # a streamed answer that ended in an error (the node went meanwhile)
            raise RuntimeError(f"desired state: {body['detail']}")
        for ask in body.get("traces") or ():
            self.answer_trace(ask)
        if self.capturer is not None:
            for ask in body.get("captures") or ():
                self.capturer.start(ask)
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

    def answer_trace(self, ask: dict) -> None:
        """Run one trace request and post its answer (a failure is the controller's to report: it
        names the hop that got no answer)."""
        try:
            answer = self.tracer.run(ask) if self.tracer else {"error": "this agent runs no traces"}
            r = self.http.post(f"/v1/agents/{self.node}/traces/{int(ask['id'])}", json=answer)
            if r.status_code != 204:
                LOG.warning("trace %s: the controller took no answer: HTTP %d: %s", ask.get("id"), r.status_code,
                            r.text[:300])
        except Exception as e:  # noqa: BLE001 - one trace must not stop the agent's loop
            LOG.warning("trace %s: %s: %s", ask.get("id") if isinstance(ask, dict) else "?", type(e).__name__, e)

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
        self.known_facts = self.facts()
        self.last_apply = time.monotonic()

    def _counting(self) -> list:
        """(handler, its objects) of every handler that keeps counters of objects it holds."""
        return [(h, objs) for kind, h in self.handlers.items() if hasattr(h, "counters")
                and (objs := [o for o in self.objects if o.KIND == kind])]

    def _waiting(self) -> bool:
        with self.lock:
            return any(v.get("status") == "pending" for v in self.statuses.values())

    def report(self, force: bool = False) -> bool:
        """Report when something changed since the last report the controller took (or `force`,
        or the liveness beat is due); True if it reported."""
        counters: dict[str, dict] = {}
        for handler, objs in self._counting():
            counters.update(handler.counters(objs))
        with self.lock:
            objects = {k: {**v, "counters": counters[k]} if k in counters else v for k, v in self.statuses.items()}
            body = {"agent_started": self.started, "applied_revision": self.revision,
                    "facts": self.known_facts if self.known_facts is not None else self.facts(),
                    "objects": objects}
        if not force and body == self.reported and time.monotonic() - self.last_report < self.report_interval:
            return False
        r = self.http.post(f"/v1/agents/{self.node}/report", json=body)
        if r.status_code != 204:
            raise RuntimeError(f"report: HTTP {r.status_code}: {r.text[:300]}")
        self.reported, self.last_report = body, time.monotonic()
        return True

    # ----- the loop
    def run(self) -> None:
        first = True
        while not self.stopping.is_set():
            try:
                # wait for a change until the next resync or beat is due; a fresh start (or a
                # failure) asks at once and reports (the controller may be new)
                waiting = self._waiting()
                resync = self.busy_interval if waiting else self.resync
                poll = self.busy_interval if waiting or self._counting() else self.poll
                now = time.monotonic()
                due = min(self.report_interval - (now - self.last_report), resync - (now - self.last_apply))
                changed = self.fetch(0.0 if first else max(0.0, min(poll, due)))
                if changed or first or time.monotonic() - self.last_apply >= resync:
                    self.apply()
                self.report(force=first)
                first = False
                if self.failures:
                    LOG.info("controller reachable again after %d failures", self.failures)
                self.failures, self.last_error = 0, None
            except Exception as e:  # noqa: BLE001 - the agent outlives a bad moment; the host keeps its state
                if not isinstance(e, _expected()):
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
        """Safe from a signal handler: a long-poll in progress is cut short."""
        self.stopping.set()
        abort = getattr(self.http, "abort", None)
        if abort is not None:
            abort()

    def status(self) -> dict:
        with self.lock:
            return {"revision": self.revision, "objects": dict(self.statuses), "failures": self.failures,
                    "last_error": self.last_error}


def _expected() -> tuple:
    """The failures of a bad moment (no controller, a refusal, a bad answer), logged in one line."""
    httpx = sys.modules.get("httpx")   # a test's client; the agent's own raises ConnectionError
    return (OSError, RuntimeError, ValueError, KeyError) + ((httpx.HTTPError,) if httpx else ())
