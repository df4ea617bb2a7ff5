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
writes reach this one's board as they commit (`heard`, from the change feed) and answer its
long-polls at once, and a pass publishes them as they were written, not as it decided them
(`publish(..., heard_at, mine)`).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time

Status = tuple[str, "str | None"]


class _Waiter:
    """A long-poll on the board: the keys it waits on, for which status, after which write."""
    __slots__ = ("loop", "event", "keys", "want", "need")

    def __init__(self, keys: tuple[tuple[str, int], ...], want: str, need: int):
        self.loop, self.event = asyncio.get_running_loop(), asyncio.Event()
        self.keys, self.want, self.need = keys, want, need


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

    def request(self) -> int:
        """An API write was committed: the statuses published so far may not reflect it."""
        with self._lock:
            self.requested += 1
            return self.requested

    def get(self, key: tuple[str, int]) -> Status | None:
        return self.statuses.get(key)

    def heard(self, statuses: dict) -> None:
        """Statuses another replica wrote (the change feed): shown, and its long-polls answered, now."""
        with self._lock:
            self._heard_count += 1
            for key, value in statuses.items():
                self._heard[key] = (value, self._heard_count)
            self._fresh.update(statuses)
            # a new map: one published is never changed in place (the console diffs them); the
            # listeners, which take a pass's whole statuses, are told with the next publish
            self.statuses = {**self.statuses, **statuses}
        self._wake()

    def take_heard(self) -> tuple[int, dict]:
        """Before a pass reads the store: the arrival number so far (`publish`'s `heard_at`) and the
        statuses heard since the last call (for the statuses the pass keeps of the store)."""
        with self._lock:
            fresh, self._fresh = self._fresh, {}
            return self._heard_count, fresh

    def publish(self, statuses: dict[tuple[str, int], Status], covered: int, heard_at: int | None = None,
                mine=None) -> None:
        """The statuses of a pass that read the store after write number `covered`. `heard_at`
        (take_heard before that read): a status heard since, of a key this replica does not write
        (`mine(key)` false), stands over the pass's."""
        with self._lock:
            if heard_at is not None and self._heard:
                for key, (value, n) in self._heard.items():
                    if n > heard_at and (mine is None or not mine(key)):
                        statuses[key] = value
                self._heard = {k: e for k, e in self._heard.items() if e[1] > heard_at}
            self.statuses = statuses
            self.covered = max(self.covered, covered)
        self._wake()
        for listener in self.listeners:
            try:
                listener(statuses)
            except Exception:  # noqa: BLE001 - a listener must not break the pass
                logging.getLogger(__name__).exception("status board listener failed")

    def _wake(self) -> None:
        """Answer the long-polls the board answers now."""
        with self._lock:
            answered = [w for w in self._waiters if self.answer(w.keys, w.want, w.need) is not None]
            self.woken += len(answered)
        for w in answered:
            try:
                w.loop.call_soon_threadsafe(w.event.set)
            except RuntimeError:   # the waiter's loop is closed: it is gone
                pass

    def answer(self, keys: tuple[tuple[str, int], ...], want: str, need: int) -> Status | None:
        """The status that ends a wait for `want`, or None while it is not there yet."""
        if self.covered < need:
            return None
        for key in keys:
            got = self.statuses.get(key)
            if got is not None and got[0] in (want, "error"):
                return got
        return None

    async def wait(self, keys: tuple[tuple[str, int], ...], want: str, timeout: float) -> Status | None:
        """Until one of `keys` (the object under its possible kinds) has status `want` or `error` in
        statuses covering every write committed before this call; None after `timeout` seconds."""
        waiter = _Waiter(keys, want, self.requested)
        deadline = time.monotonic() + timeout
        with self._lock:
            self._waiters.add(waiter)
        try:
            while True:
                # cleared before the look: a publish after it sets the event again; one that
                # answered and was overtaken by another (the status changed back) waits on
                waiter.event.clear()
                got = self.answer(keys, want, waiter.need)
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
