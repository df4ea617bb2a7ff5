"""A request's store write handed from the event loop to a kept thread, and its result back.

`await in_thread(fn, *args)` runs `fn(*args)` on one of the process's kept threads, in a copy of the
caller's context (its context variables: the request's Idempotency-Key, fathom.api.request_ids),
as starlette's run_in_threadpool does, for less of the event loop's CPU: a C queue's put, and the
thread's one call_soon_threadsafe back, where anyio takes a capacity limiter, a cancel scope and a
condition's notify per call. The threads (at most MAX_THREADS, started as calls need them) wait on
the queue; a call that finds them all busy waits there, in order, as it would for a connection of
the store's pool (fathom.store.db.POOL_SIZE). A request cancelled while its call waits is not run;
one cancelled while it runs goes on in its thread (it may commit), and its result is dropped.
"""
from __future__ import annotations

import asyncio
import contextvars
import os
import queue
import threading

from fathom.store.db import POOL_SIZE

MAX_THREADS = POOL_SIZE


class KeptThreads:
    def __init__(self, size: int = MAX_THREADS):
        self.size = size
        self._fresh()
        # a forked process (an API worker) has none of its parent's threads: it starts its own
        os.register_at_fork(after_in_child=self._fresh)

    def _fresh(self) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0        # threads waiting for a call (read without the lock: a hint to start one)

    async def run(self, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self._idle == 0 and self._threads < self.size:
            self._start()
        self._calls.put((loop, future, contextvars.copy_context(), fn, args, kwargs))
        return await future

    def _start(self) -> None:
        with self._lock:
            if self._threads >= self.size:
                return
            self._threads += 1
        threading.Thread(target=self._serve, name="store write", daemon=True).start()

    def _serve(self) -> None:
        calls, lock = self._calls, self._lock
        while True:
            with lock:
                self._idle += 1
            loop, future, context, fn, args, kwargs = calls.get()
            with lock:
                self._idle -= 1
            if future.cancelled():      # its request ended while it waited: nothing run
                continue
            try:
                result = context.run(fn, *args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting request
                loop.call_soon_threadsafe(_failed, future, e)
            else:
                loop.call_soon_threadsafe(_done, future, result)
            # nothing of a request is kept while the thread waits
            loop = future = context = fn = args = kwargs = result = e = None


def _done(future: asyncio.Future, result) -> None:
    if not future.cancelled():
        future.set_result(result)


def _failed(future: asyncio.Future, error: BaseException) -> None:
    if not future.cancelled():
        future.set_exception(error)


KEPT = KeptThreads()


async def in_thread(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` on a kept thread (KEPT), awaited."""
    return await KEPT.run(fn, *args, **kwargs)
