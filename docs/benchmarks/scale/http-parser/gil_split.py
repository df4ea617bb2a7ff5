"""Who held the interpreter lock in the controller while 8 writers created ports on PostgreSQL:
py-spy samples taken only while a thread held it (`py-spy record --gil -t -f raw -r 250 -d 9`),
split by thread and, in the event loop, by what it was doing.

    python3 docs/benchmarks/scale/http-parser/gil_split.py docs/benchmarks/scale/http-parser/py-spy-gil-8-writers.raw.gz
"""
import collections
import gzip
import sys

threads, loop = collections.Counter(), collections.Counter()
BUCKETS = (("HTTP parsing (h11)", {"H11Protocol.data_received"}), ("HTTP response (h11)", {"RequestResponseCycle.send"}),
           ("thread-pool hop (anyio)", {"run_in_threadpool"}), ("dependencies", {"solve_dependencies"}),
           ("response model", {"serialize_response"}), ("routing", {"APIRouter.matches", "_IncludedRouter.matches"}),
           ("the rest of the ASGI stack", {"RequestResponseCycle.run_asgi"}))
for line in gzip.open(sys.argv[1], "rt"):
    stack, count = line.rsplit(" ", 1)
    frames = stack.split(";")
    name = frames[0].split(": ", 1)[-1]
    kind = "API worker threads" if name.startswith("AnyIO") else name
    threads[kind] += int(count)
    if kind == "MainThread":
        names = {f.split(" (")[0] for f in frames}
        loop[next((b for b, marks in BUCKETS if names & marks), "event loop, other")] += int(count)
total = sum(threads.values())
for kind, n in threads.most_common():
    print(f"{kind:40s} {n:5d}  {100 * n / total:5.1f} %")
print("the event loop:")
for bucket, n in loop.most_common():
    print(f"  {bucket:38s} {n:5d}  {100 * n / total:5.1f} %")
