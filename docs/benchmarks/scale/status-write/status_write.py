"""CPU of one reconciler status write (one port's status and reason, in a transaction of its own, as a
pass writes a new port's `down` and then `active`) on a store of 100 ports: the store's
`write_statuses` as it is, against the read-then-update it replaced. Run from a worktree:

    .venv/bin/python docs/benchmarks/scale/status-write/status_write.py sqlite:////run/sw.db   # or a postgresql:// URL

prints JSON: milliseconds of this thread's CPU per write, median of 5 runs of 2,000 writes each.
"""
import ipaddress
import json
import statistics
import sys
import time

from sqlalchemy import bindparam, select, update

from fathom.store import models as m
from fathom.store import ops
from fathom.store.changes import TableChanges
from fathom.store.db import make_engine, migrate, session_factory
from fathom.store.status import write_statuses

engine = make_engine(sys.argv[1])
migrate(engine)
TableChanges(engine)   # the controller's engine notes every write; so does this one
Session = session_factory(engine)
caller = ops.Caller()
with Session() as s, s.begin():
    net = ops.create_network(s, caller, ops.Settings(), name="n", type="vxlan")
    ops.create_subnet(s, caller, network_id=net.id, cidr=ipaddress.IPv4Network("198.19.0.0/20"))
    port_id = [ops.create_port(s, caller, network_id=net.id, name=f"p{i}").id for i in range(100)][50]


def value(i: int) -> tuple:
    return ("active", None) if i % 2 else ("down", "not plugged")


def store_now(i: int) -> None:
    with Session() as s, s.begin():
        write_statuses(s, {("port", port_id): value(i)})


def read_then_update(i: int) -> None:
    """What write_statuses did before: read the rows' statuses, update those that differ."""
    values = {port_id: value(i)}
    table = m.Port.__table__
    with Session() as s, s.begin():
        changed = [{"row": row.id, "new_status": values[row.id][0], "new_reason": values[row.id][1]}
                   for row in s.execute(select(m.Port.id, m.Port.status, m.Port.status_reason)
                                        .where(m.Port.id.in_(list(values))))
                   if (row.status, row.status_reason) != tuple(values[row.id])]
        if changed:
            s.connection().execute(update(table).where(table.c.id == bindparam("row"))
                                   .values(status=bindparam("new_status"), status_reason=bindparam("new_reason"))
                                   .execution_options(model_unchanged=True), changed)


def cost(write, n: int = 2000) -> float:
    for i in range(200):
        write(i)
    start = time.thread_time()
    for i in range(n):
        write(i)
    return (time.thread_time() - start) / n * 1000


runs = {"read_then_update": [], "write_statuses": []}
for _ in range(5):
    runs["read_then_update"].append(cost(read_then_update))
    runs["write_statuses"].append(cost(store_now))
print(json.dumps({"store": sys.argv[1].split(":")[0], "ms_cpu_per_write_median": {k: round(statistics.median(v), 3) for k, v in runs.items()},
                  "runs": {k: [round(x, 3) for x in v] for k, v in runs.items()}}))
