"""fathom.api.handoff: a store write run on a thread of the process's executor, in the caller's
context, its error raised to the caller; a call cancelled while it waits is not run; a forked
process (an API worker) makes its own executor."""
from __future__ import annotations

import asyncio
import contextvars
import os
import threading

import pytest

from fathom.api.handoff import MAX_THREADS, in_thread

VAR = contextvars.ContextVar("handoff_var", default=None)


def test_a_call_runs_in_a_copy_of_the_callers_context_and_raises_its_errors():
    def call():
        seen = VAR.get()
        seen[1].append("from the thread")    # as a write's commits are told to its request
        VAR.set(("thread", []))              # the copy's own: the caller's value stays
        return seen[0], threading.current_thread().name

    async def main():
        VAR.set(("request", []))
        value, thread = await in_thread(call)
        with pytest.raises(ZeroDivisionError):
            await in_thread(lambda: 1 / 0)
        # more calls than threads: they wait their turn, each gets its own result
        results = await asyncio.gather(*(in_thread(lambda i=i: i * 2) for i in range(3 * MAX_THREADS)))
        return value, thread, VAR.get(), results
    value, thread, after, results = asyncio.run(main())
    assert value == "request" and thread.startswith("store write")
    assert after == ("request", ["from the thread"])
    assert results == [i * 2 for i in range(3 * MAX_THREADS)]


def test_max_threads_calls_run_at_once_and_one_cancelled_while_it_waits_is_not_run():
    all_in = threading.Barrier(MAX_THREADS + 1, timeout=10)   # MAX_THREADS calls and this test
    release, ran = threading.Event(), []

    def busy():
        all_in.wait()
        release.wait(10)

    async def main():
        running = [asyncio.ensure_future(in_thread(busy)) for _ in range(MAX_THREADS)]
        try:
            await asyncio.to_thread(all_in.wait)           # every thread is busy
            waiting = asyncio.ensure_future(in_thread(lambda: ran.append(1)))
            await asyncio.sleep(0.05)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
        finally:
            release.set()
        await asyncio.gather(*running)
        assert await in_thread(lambda: "after") == "after"     # the cancelled call was passed over
    asyncio.run(main())
    assert ran == []


def test_a_forked_process_makes_an_executor_of_its_own():
    """An API worker is a fork: its parent's threads are not in it. With the parent's executor
    (a thread of it idle), its first write would wait forever for a thread that is not there."""
    assert asyncio.run(in_thread(lambda: "parent")) == "parent"     # the parent's thread, now idle
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            async def main():
                return await asyncio.wait_for(in_thread(lambda: "child"), 5)
            code = 0 if asyncio.run(main()) == "child" else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
