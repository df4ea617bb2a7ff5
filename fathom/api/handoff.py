"""A request's store write run on a thread of the process's executor, awaited by the event loop.

`await in_thread(fn, *args)` runs `fn(*args)` in a copy of the caller's context (its context
variables: the request's Idempotency-Key in fathom.api.request_ids, its commits in
fathom.cluster.feed.REQUEST_COMMITS), as asyncio.to_thread does, on a ThreadPoolExecutor of at most
MAX_THREADS threads (as many as the store's pool has connections, fathom.store.db.POOL_SIZE) where
anyio's run_in_threadpool takes a capacity limiter and a cancel scope per call. A call that finds
every thread busy waits its turn; cancelled while it waits, it is not run; cancelled while it runs,
it goes on in its thread (it may commit) and its result is dropped.

The executor is made by the process that uses it: an API worker is forked from the controller, and
a fork has none of its parent's threads (a parent's executor, copied, would hand its calls to them).
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from fathom.store.db import POOL_SIZE

MAX_THREADS = POOL_SIZE

_made = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_pid = 0                # the process that made _executor


def executor() -> ThreadPoolExecutor:
    """This process's executor, made at its first call."""
    global _executor, _pid
    if _pid != os.getpid():
        with _made:
            if _pid != os.getpid():
                _executor = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="store write")
                _pid = os.getpid()
    return _executor


async def in_thread(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` on a thread of this process's executor, awaited."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(executor(), call)
