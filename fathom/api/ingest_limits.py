"""Limits on PPTMon ingestion: who may report a chain, how fast, and how many chains there are.

- A chain is reported by one node, the one that runs it (its sink): the first node whose agent
  delivers records of a chain owns the chain name; another node's records for it are refused
  (403) until retention has removed every record of the chain. Port chains measured through the
  API (`port_chain:<id>`) are the exception: their sinks may be instances on several nodes, and
  the model, not the first delivery, says which node's records are filed under the chain
  (fathom.api.pptmon.file_under).
- Rate: each node's agent may deliver `rate` records per second on average, in bursts of
  `burst` (a token bucket); beyond that a batch is refused whole with 429 and Retry-After, and
  the agent retries later.
- Cardinality: at most `max_chains` distinct chain names are stored (they become Prometheus
  label values); records of a further chain are refused (422).

Environment of the controller: FATHOM_PPTMON_RATE (records/s per node, default 20000),
FATHOM_PPTMON_BURST (default 2 x rate), FATHOM_PPTMON_MAX_CHAINS (default 256).
"""
from __future__ import annotations

import os
import threading
import time

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from fathom.apps.hostlocal.chains import parse_chain_label
from fathom.store.db import READ_ONLY
from fathom.store.errors import Forbidden, Invalid, StoreError
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
        self._owners: dict[str, str] | None = None               # chain -> node (from the store)
        self._lock = threading.Lock()

    def forget(self) -> None:
        """Re-read chain owners from the store next time (after retention removed records)."""
        with self._lock:
            self._owners = None

    def admit(self, node: str, chains: list[str], n: int) -> None:
        """Raise unless `node` may store `n` records of `chains` now; on success they count."""
        with self._lock:
            owners = self._load_owners()
            new = []
            for chain in dict.fromkeys(chains):
                owner = owners.get(chain)
                if owner is None:
                    new.append(chain)
                elif owner != node and parse_chain_label(chain) is None:
                    raise Forbidden(f"chain {chain!r} is reported by another node", "node")
            if len(owners) + len(new) > self.max_chains:
                raise Invalid(f"the controller keeps records of at most {self.max_chains} chains "
                              "(FATHOM_PPTMON_MAX_CHAINS)", "records")
            tokens, at = self._buckets.get(node, (self.burst, time.monotonic()))
            now = time.monotonic()
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if n > tokens:
                wait = (n - tokens) / self.rate if self.rate > 0 else 60.0
                self._buckets[node] = (tokens, now)
                raise TooMany(f"node {node} delivers more than {self.rate:g} records/s: retry later", wait)
            self._buckets[node] = (tokens - n, now)
            for chain in new:
                owners[chain] = node

    def _load_owners(self) -> dict[str, str]:
        if self._owners is None:
            with Session(self.engine) as s, s.begin():
                s.connection(execution_options=READ_ONLY)
                rows = s.execute(select(Row.chain, Row.node).distinct()).all()
            self._owners = {}
            for chain, node in rows:
                self._owners.setdefault(chain, node)
        return self._owners
