"""The status board: every object's status as the reconciler last decided it, in memory, and the
change sequence numbers that say which API writes a status already reflects.

The API bumps `requested` after every committed write (`request()`); a pass covers every write
requested before it read the store, and publishes its statuses with that number (`covered`). A
long-poll (`GET /v1/<collection>/<id>?wait=<status>`) answers once `covered` reaches the number
current when it arrived and the object's status is the one wanted (or `error`): so a status that
predates the caller's own write never answers it. Waiting costs nothing but an asyncio event per
waiter, set from the reconciler's thread when a pass publishes; no store read while waiting.
"""
from __future__ import annotations

import asyncio
import threading
import time

Status = tuple[str, "str | None"]


class StatusBoard:
    def __init__(self):
        self._lock = threading.Lock()
        self.statuses: dict[tuple[str, int], Status] = {}
        self.requested = 0      # API writes committed so far
        self.covered = -1       # the last write the published statuses reflect (-1: nothing published)
        self._waiters: set = set()   # (event loop, asyncio.Event) of the long-polls waiting

    def request(self) -> int:
        """An API write was committed: the statuses published so far may not reflect it."""
        with self._lock:
            self.requested += 1
            return self.requested

    def get(self, key: tuple[str, int]) -> Status | None:
        return self.statuses.get(key)

    def publish(self, statuses: dict[tuple[str, int], Status], covered: int) -> None:
        """The statuses of a pass that read the store after write number `covered`."""
        with self._lock:
            self.statuses = statuses
            self.covered = max(self.covered, covered)
            waiters = list(self._waiters)
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
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
        need = self.requested
        deadline = time.monotonic() + timeout
        token = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.add(token)
        try:
            while True:
                token[1].clear()
                got = self.answer(keys, want, need)
                remaining = deadline - time.monotonic()
                if got is not None or remaining <= 0:
                    return got
                try:
                    await asyncio.wait_for(token[1].wait(), remaining)
                except asyncio.TimeoutError:
                    pass
        finally:
            with self._lock:
                self._waiters.discard(token)
