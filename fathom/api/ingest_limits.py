"""Limits on PPTMon ingestion: whose records a chain holds, how fast, and how many chains there are.

- A chain is named by the node that reports it: records are stored and read as (node, chain),
  so two nodes may report the same chain name without mixing (`GET /v1/pptmon/chains` lists one
  entry per node and chain; `?node=` narrows records and stats), and no node can claim a name
  before the node that really runs the chain reports it. Port chains measured through the API
  (`port_chain:<id>`) are filed under the port chain only when the model says the delivering node
  holds the chain's sink (fathom.api.pptmon.file_under).
- Rate: each node's agent may deliver `rate` records per second on average, in bursts of
  `burst` (a token bucket); beyond that a batch is refused whole with 429 and Retry-After, and
  the agent retries later.
- Cardinality: each node reports at most `max_chains` distinct chain names (they become Prometheus
  label values); records of a further chain of that node are refused (422). One node's reports
  fill its own budget only.

Environment of the controller: FATHOM_PPTMON_RATE (records/s per node, default 20000),
FATHOM_PPTMON_BURST (default 2 x rate), FATHOM_PPTMON_MAX_CHAINS (per node, default 256).
"""
from __future__ import annotations

import os
import threading
import time

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from fathom.store.db import READ_ONLY
from fathom.store.errors import Invalid, StoreError
from fathom.store.pptmon_models import PptmonRecord as Row


class TooMany(StoreError):
    status = 429
    kind = "rate_limited"

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


class IngestLimits:
    def __init__(self, engine: Engine, rate: float | None = None, burst: float | None = None,
                 max_chains: int | None = None, env=os.environ):
        self.engine = engine
        self.rate = rate if rate is not None else float(env.get("FATHOM_PPTMON_RATE", 20_000))
        self.burst = burst if burst is not None else float(env.get("FATHOM_PPTMON_BURST", 2 * self.rate))
        self.max_chains = max_chains if max_chains is not None else int(env.get("FATHOM_PPTMON_MAX_CHAINS", 256))
        self._buckets: dict[str, tuple[float, float]] = {}     # node -> (tokens, at)
        self._chains: dict[str, set[str]] | None = None          # node -> its chain names (from the store)
        self._lock = threading.Lock()

    def forget(self) -> None:
        """Re-read the nodes' chains from the store next time (after retention removed records)."""
        with self._lock:
            self._chains = None

    def admit(self, node: str, chains: list[str], n: int) -> None:
        """Raise unless `node` may store `n` records of `chains` now; on success they count."""
        with self._lock:
            known = self._load_chains().setdefault(node, set())
            new = [c for c in dict.fromkeys(chains) if c not in known]
            if len(known) + len(new) > self.max_chains:
                raise Invalid(f"the controller keeps records of at most {self.max_chains} chains per node "
                              f"(FATHOM_PPTMON_MAX_CHAINS); node {node} has {len(known)}", "records")
            tokens, at = self._buckets.get(node, (self.burst, time.monotonic()))
            now = time.monotonic()
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if n > tokens:
                wait = (n - tokens) / self.rate if self.rate > 0 else 60.0
                self._buckets[node] = (tokens, now)
                raise TooMany(f"node {node} delivers more than {self.rate:g} records/s: retry later", wait)
            self._buckets[node] = (tokens - n, now)
            known.update(new)

    def _load_chains(self) -> dict[str, set[str]]:
        if self._chains is None:
            with Session(self.engine) as s, s.begin():
                s.connection(execution_options=READ_ONLY)
                rows = s.execute(select(Row.node, Row.chain).distinct()).all()
            self._chains = {}
            for node, chain in rows:
                self._chains.setdefault(node, set()).add(chain)
        return self._chains
