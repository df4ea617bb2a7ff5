"""One hand-off from the event loop to a thread and back with nothing to run there: the kept threads
of fathom/api/handoff.py at REF (a C queue's put, one call_soon_threadsafe back), today's
fathom.api.handoff.in_thread (loop.run_in_executor on a ThreadPoolExecutor, in a copy of the
context) and in_thread_C.py (that executor's submit, one call_soon_threadsafe back). On uvloop,
blocks rotating, ROUNDS rounds; with 8 concurrent tasks (the threads rarely wait for work) and with
1 (every hop wakes a waiting thread); the event loop thread's CPU and the process's a hop. Run from
the repository:
    python docs/benchmarks/scale/api-postgresql/steps/executor/micro-hop.py [ROUNDS] [REF]"""
import asyncio, subprocess, sys, time, uvloop
from pathlib import Path
sys.path.insert(0, ".")
import fathom.api.handoff as handoff

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
REF = sys.argv[2] if len(sys.argv) > 2 else "85864b6"
space = {"__name__": "kept_at_ref"}
exec(subprocess.run(["git", "show", f"{REF}:fathom/api/handoff.py"], capture_output=True, text=True,
                    check=True).stdout, space)
kept = space["KeptThreads"]()
c_space = dict(vars(handoff))
exec(Path(__file__).with_name("in_thread_C.py").read_text(), c_space)
ARMS = [("kept", kept.run), ("executor", handoff.in_thread), ("C", c_space["in_thread"])]


def noop():
    return 1


async def block(fn, tasks, hops):
    async def w(n):
        for _ in range(n):
            await fn(noop)
    await asyncio.gather(*(w(hops // tasks // 10) for _ in range(tasks)))    # warm-up
    t0, p0 = time.thread_time(), time.process_time()
    await asyncio.gather(*(w(hops // tasks) for _ in range(tasks)))
    return 1e6 * (time.thread_time() - t0) / hops, 1e6 * (time.process_time() - p0) / hops


async def main():
    print(f"REF {REF} (kept), working tree (executor), in_thread_C.py (C); event loop / process CPU a hop, us")
    for tasks, hops in ((8, 16000), (1, 8000)):
        for r in range(ROUNDS):
            for name, fn in ARMS[r % 3:] + ARMS[:r % 3]:
                loop_us, process_us = await block(fn, tasks, hops)
                print(f"{tasks} task(s) round {r + 1} {name:8} event loop {loop_us:5.1f}  process {process_us:5.1f}",
                      flush=True)
uvloop.run(main())
