"""CPU of the reconciler's store read after an API call created one port (the read of a pass woken
by that call: the ports part patched by row), on a store of 104 ports and more. Run from a worktree
(PYTHONPATH=<worktree> for another commit's code):

    .venv/bin/python docs/benchmarks/scale/store-read/store_read.py sqlite:////run/sr.db   # or a postgresql:// URL

prints JSON: milliseconds of this thread's CPU per read, in 5 runs of 300 reads each; the store grows by
a port a read (154 -> 1,654 ports), so each run is at its own size (a read still costs in proportion to
the ports: it lists their ids to find the new one, and rebuilds the ports part's tuples).
"""
import ipaddress
import json
import sys
import time

from fathom.store import ops
from fathom.store.changes import TableChanges
from fathom.store.db import READ_ONLY, make_engine, migrate, session_factory
from fathom.store.snapshot import StoreReader

engine = make_engine(sys.argv[1])
migrate(engine)
changes = TableChanges(engine)
Session = session_factory(engine)
caller = ops.Caller()
with Session() as s, s.begin():
    net = ops.create_network(s, caller, ops.Settings(), name="n", type="vxlan")
    ops.create_subnet(s, caller, network_id=net.id, cidr=ipaddress.IPv4Network("198.19.0.0/16"))
    for i in range(104):
        ops.create_port(s, caller, network_id=net.id, name=f"p{i}")
reader = StoreReader()
last: set = set()


def read(whole: bool = False) -> None:
    """As Reconciler._read_store: the tables written since, and those of the read before."""
    global last
    taken = changes.take()
    written = None if whole else taken | last
    last = taken
    with Session() as s:
        s.connection(execution_options=READ_ONLY)
        reader.read(s, {}, written)


read(whole=True)
created = 0


def one() -> float:
    global created
    created += 1
    with Session() as s, s.begin():
        ops.create_port(s, caller, network_id=net.id, name=f"q{created}")
    start = time.thread_time()
    read()
    return time.thread_time() - start


for _ in range(50):
    one()
runs = []
for _ in range(5):
    first = 104 + created
    runs.append({"ports": f"{first}-{first + 300}", "ms_cpu_per_read": round(sum(one() for _ in range(300)) / 300 * 1000, 3)})
print(json.dumps({"store": sys.argv[1].split(":")[0], "runs": runs}))
