"""One hand-off from the event loop to a thread and back, with nothing to run there: starlette's
run_in_threadpool (anyio's to_thread) against fathom.api.handoff's kept threads; 8 concurrent tasks
on uvloop, 16,000 hops a block after a warm-up, each way twice; the event loop thread's CPU and the
process's a hop. The kept threads are fathom/api/handoff.py's at 85864b6 (today's hand-off is a
ThreadPoolExecutor: ../executor/). Run from the repository: python micro-hop.py"""
import asyncio, subprocess, time, uvloop
from starlette.concurrency import run_in_threadpool
space = {"__name__": "kept_at_85864b6"}
exec(subprocess.run(["git", "show", "85864b6:fathom/api/handoff.py"], capture_output=True, text=True,
                    check=True).stdout, space)
kept = space["KeptThreads"]()


def noop():
    return 1


async def main():
    for name, fn in (("anyio", lambda: run_in_threadpool(noop)), ("kept", lambda: kept.run(noop))) * 2:
        async def w(n):
            for _ in range(n):
                await fn()
        await asyncio.gather(*(w(200) for _ in range(8)))
        t0, p0 = time.thread_time(), time.process_time()
        await asyncio.gather(*(w(2000) for _ in range(8)))
        print(name, f"event loop {1e6 * (time.thread_time() - t0) / 16000:.1f} us, "
                    f"process {1e6 * (time.process_time() - p0) / 16000:.1f} us a hop")
uvloop.run(main())
