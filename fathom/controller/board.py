"""The status board: every object's status as the reconciler last decided it, in memory, and the
change sequence numbers that say which API writes a status already reflects.

The API bumps `requested` after every committed write (`request()`); a pass covers every write
requested before it read the store, and publishes its statuses with that number (`covered`). A
long-poll (`GET /v1/<collection>/<id>?wait=<status>`) answers once `covered` reaches the number
current when it arrived and the object's status is the one wanted (or `error`): so a status that
predates the caller's own write never answers it. Waiting costs nothing but an asyncio event per
waiter, set from the reconciler's thread when a pass publishes its answer; no store read while
waiting. A publish looks at every waiter in the reconciler's thread (two dictionary lookups each)
and wakes only those it answers: a batch of ports waited on while its passes publish costs one
wake-up a port, not one a port and pass.

In a cluster each status has one writer (fathom.controller.cluster); the statuses another replica
writes reach this one's board as they commit (`heard`, from the change feed) and show at once, and
a pass publishes them as they were written, not as it decided them (`publish(..., heard_at,
mine)`). A heard status answers a long-poll without a pass of this replica's when the writes the
writer's pass had read (its claim, fathom.cluster.feed.Claim) include every write of this process
up to the long-poll's number: `request()` keeps each write's transaction id (`written`, the feed's
`committed_xid`) until every writer's claims show it.

Where several processes take writes (replicas, or `--api-workers`), the caller's write may have
been made on another process than the one holding its long-poll, which has not counted it. A write
made with the change feed on answers with its transaction id (header `X-Fathom-Commit`), and a
long-poll that sends it back (`after`) is answered only by statuses decided from a read that had
it: a pass of this process's whose claim shows it (`publish(..., claim)`), or a heard status whose
writer's claim does. Without a feed (one process takes every write) `after` is not needed, and not
looked at.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time

Status = tuple[str, "str | None"]
# a writer's claims count toward which transaction ids this process still keeps (see `heard`) for
# this long after its last one (a replica gone stops holding them)
CLAIMS_KEEP = 60.0
KEPT_WRITES = 10_000    # transaction ids kept at most (the oldest go first)


class _Waiter:
    """A long-poll on the board: the keys it waits on, for which status, after which write."""
    __slots__ = ("loop", "event", "keys", "want", "need", "after")

    def __init__(self, keys: tuple[tuple[str, int], ...], want: str, need: int, after: int | None):
        self.loop, self.event = asyncio.get_running_loop(), asyncio.Event()
        self.keys, self.want, self.need, self.after = keys, want, need, after


class StatusBoard:
    def __init__(self):
        self._lock = threading.Lock()
        self.statuses: dict[tuple[str, int], Status] = {}
        self.requested = 0      # API writes committed so far
        self.covered = -1       # the last write the published statuses reflect (-1: nothing published)
        self._waiters: set[_Waiter] = set()
        self.woken = 0          # long-polls woken by a publish that answered them
        self.listeners: list = []   # fn(statuses) called after each publish (the console's feed)
        # statuses other replicas wrote, as the change feed brought them: key -> (status, arrival
        # number), kept until a pass that read the store after their arrival publishes; and those
        # the store's statuses kept by the passes (fathom.store.snapshot.StoreReader) do not hold yet
        self._heard: dict = {}
        self._heard_count = 0
        self._fresh: dict = {}
        # in a cluster: () -> the transaction id of the write just committed on this thread (None:
        # it sent no notification; nothing to read); the ids of the writes (number -> id) while a
        # writer's claim may not show them yet, and `_horizon`, below which every id let go is
        self.written = None
        self._writes: dict[int, int] = {}
        self._horizon = 0
        self._claim_xmins: dict[str, tuple[int, float]] = {}   # writer -> (its last claim's xmin, when)
        # key -> (the status heard, the last write number the claim heard with it shows, that claim)
        self._heard_after: dict = {}
        # with a change feed (claims known): the claim of the pass that published last, and this
        # process's own writes (transaction id -> write number), which its claims need not show
        self.claims = False
        self._claim = None
        self._own: dict[int, int] = {}

    def request(self) -> int:
        """An API write was committed: the statuses published so far may not reflect it."""
        xid = self.written() if self.written is not None else None
        with self._lock:
            self.requested += 1
            if xid is not None:
                self._writes[self.requested] = xid
                self._own[xid] = self.requested
                if len(self._own) > KEPT_WRITES:
                    del self._own[next(iter(self._own))]
                if len(self._writes) > KEPT_WRITES:
                    oldest = next(iter(self._writes))
                    self._horizon = max(self._horizon, self._writes.pop(oldest) + 1)
            return self.requested

    def own_writes(self, most: int) -> set[int]:
        """The transaction ids of this process's last `most` API writes kept (see `heard`)."""
        with self._lock:
            return set(list(self._writes.values())[-most:])

    def get(self, key: tuple[str, int]) -> Status | None:
        return self.statuses.get(key)

    def heard(self, statuses: dict, claim=None) -> None:
        """Statuses another replica wrote (the change feed): shown now, and, with `claim` (the
        writes the pass that decided them had read: fathom.cluster.feed.Claim), answering the
        long-polls after every write of this process the claim shows."""
        with self._lock:
            self._heard_count += 1
            for key, value in statuses.items():
                self._heard[key] = (value, self._heard_count)
            self._fresh.update(statuses)
            if claim is not None:
                after = self._shown_by(claim)
                for key, value in statuses.items():
                    self._heard_after[key] = (value, after, claim)
            # a new map: one published is never changed in place (the console diffs them); the
            # listeners, which take a pass's whole statuses, are told with the next publish
            self.statuses = {**self.statuses, **statuses}
        self._wake()

    def _shown_by(self, claim) -> int:
        """The last write number up to which `claim` shows every write of this process (-1: none
        known); the ids no writer's claim may still need are let go. Under the lock."""
        now = time.monotonic()
        self._claim_xmins[claim.writer] = (claim.xmin, now)
        self._claim_xmins = {w: e for w, e in self._claim_xmins.items() if now - e[1] <= CLAIMS_KEEP}
        horizon = min(xmin for xmin, _ in self._claim_xmins.values())
        if horizon > self._horizon:
            self._writes = {n: x for n, x in self._writes.items() if x >= horizon}
            self._horizon = horizon
        if claim.xmin < self._horizon:     # an id let go may be one it does not show
            return -1
        return next((n - 1 for n, x in self._writes.items() if not claim.covers(x)), self.requested)

    def take_heard(self) -> tuple[int, dict]:
        """Before a pass reads the store: the arrival number so far (`publish`'s `heard_at`) and the
        statuses heard since the last call (for the statuses the pass keeps of the store)."""
        with self._lock:
            fresh, self._fresh = self._fresh, {}
            return self._heard_count, fresh

    def publish(self, statuses: dict[tuple[str, int], Status], covered: int, heard_at: int | None = None,
                mine=None, claim=None) -> None:
        """The statuses of a pass that read the store after write number `covered` (and, with a
        change feed, the writes `claim` shows). `heard_at` (take_heard before that read): a status
        heard since, of a key this replica does not write (`mine(key)` false), stands over the pass's."""
        with self._lock:
            if heard_at is not None and self._heard:
                for key, (value, n) in self._heard.items():
                    if n > heard_at and (mine is None or not mine(key)):
                        statuses[key] = value
                self._heard = {k: e for k, e in self._heard.items() if e[1] > heard_at}
            self.statuses = statuses
            self.covered = max(self.covered, covered)
            if claim is not None:
                self._claim = claim
            if self._heard_after:   # kept while it shows more than this pass and still stands
                self._heard_after = {k: e for k, e in self._heard_after.items()
                                     if e[1] > self.covered and statuses.get(k) == e[0]}
        self._wake()
        for listener in self.listeners:
            try:
                listener(statuses)
            except Exception:  # noqa: BLE001 - a listener must not break the pass
                logging.getLogger(__name__).exception("status board listener failed")

    def _wake(self) -> None:
        """Answer the long-polls the board answers now."""
        with self._lock:
            answered = [w for w in self._waiters if self.answer(w.keys, w.want, w.need, w.after) is not None]
            self.woken += len(answered)
        for w in answered:
            try:
                w.loop.call_soon_threadsafe(w.event.set)
            except RuntimeError:   # the waiter's loop is closed: it is gone
                pass

    def answer(self, keys: tuple[tuple[str, int], ...], want: str, need: int, after: int | None = None) -> Status | None:
        """The status that ends a wait for `want`, or None while it is not there yet: decided by a
        pass of this replica's after write `need` (and transaction `after`), or heard from a writer
        whose pass had read them."""
        after = after if self.claims else None
        for key in keys:
            got = self.statuses.get(key)
            if got is not None and got[0] in (want, "error"):
                if self.covered >= need and (after is None or self._shows(after)):
                    return got
                heard = self._heard_after.get(key)
                if heard is not None and heard[0] == got and heard[1] >= need and \
                        (after is None or heard[2] is not None and heard[2].covers(after)):
                    return got
        return None

    def _shows(self, xid: int) -> bool:
        """Whether this process's published statuses were decided from a read that had transaction
        `xid`: its own write a pass covered, or one the pass's claim shows."""
        own = self._own.get(xid)
        if own is not None and self.covered >= own:
            return True
        return self._claim is not None and self._claim.covers(xid)

    async def wait(self, keys: tuple[tuple[str, int], ...], want: str, timeout: float,
                   after: int | None = None) -> Status | None:
        """Until one of `keys` (the object under its possible kinds) has status `want` or `error` in
        statuses covering every write committed before this call (and transaction `after`, a
        write the caller made elsewhere); None after `timeout` seconds."""
        waiter = _Waiter(keys, want, self.requested, after)
        deadline = time.monotonic() + timeout
        with self._lock:
            self._waiters.add(waiter)
        try:
            while True:
                # cleared before the look: a publish after it sets the event again; one that
                # answered and was overtaken by another (the status changed back) waits on
                waiter.event.clear()
                got = self.answer(keys, want, waiter.need, after)
                remaining = deadline - time.monotonic()
                if got is not None or remaining <= 0:
                    return got
                try:
                    await asyncio.wait_for(waiter.event.wait(), remaining)
                except asyncio.TimeoutError:
                    pass
        finally:
            with self._lock:
                self._waiters.discard(waiter)
