"""The reconciler's store read in a burst of creations, alone: BATCH ports created through the store's
create path, then StoreReads.read(False) (a patch of the ports part by row), ROUNDS times; this
thread's CPU a read over the second half of the rounds (the network then holds ROUNDS/2 x BATCH to
ROUNDS x BATCH ports), with fathom.store.snapshot's _ports_part and _port_rows timed apart.
Run as PYTHONPATH=<tree> python read-cpu.py BATCH ROUNDS (PREFIX: its PostgreSQL's lab prefix)."""
import ipaddress, os, sys, time
import fathom.bench.postgres as pgmod
from fathom.bench.postgres import PostgresServer
from fathom.store.db import open_store, session_factory
from fathom.store import ops
from fathom.store.changes import TableChanges
from fathom.controller.storeread import StoreReads
from sqlalchemy.orm import Session
pgmod.PREFIX = f"fathom-pg-{os.environ.get('PREFIX', 'p0')}-"
pg = PostgresServer(durable=True).start()
engine = open_store(pg.new_database())
Sessions = session_factory(engine)
reads = StoreReads(Sessions)
import fathom.store.snapshot as snap
T = {"part": 0.0, "rows": 0.0}
def timed(name, f):
    def g(*a, **k):
        t = time.thread_time()
        try: return f(*a, **k)
        finally: T[name] += time.thread_time() - t
    return g
snap._ports_part = timed("part", snap._ports_part); snap._port_rows = timed("rows", snap._port_rows)
c = ops.Caller()
with Session(engine) as s, s.begin():
    net = ops.create_network(s, c, ops.Settings(), name="n", type="vxlan").id
    ops.create_subnet(s, c, network_id=net, cidr=ipaddress.IPv4Network("10.0.0.0/16"))
reads.read(True)
BATCH = int(sys.argv[1]); ROUNDS = int(sys.argv[2])
n = 0; cpu = 0
for r in range(ROUNDS):
    for i in range(BATCH):
        with Session(engine) as s, s.begin():
            new = ops.new_port(s, c, network_id=net, name=f"p{n}", claim_at_insert=True); n += 1
            ops.insert_port(s, new, [])
    t0 = time.thread_time()
    pass
    if r == ROUNDS // 2: T.update(part=0.0, rows=0.0)
    reads.read(False)
    pass
    if r >= ROUNDS // 2: cpu += time.thread_time() - t0
import fathom; print(fathom.__file__); print({k: round(1000 * v / (ROUNDS - ROUNDS // 2), 3) for k, v in T.items()}); print(f"read: {1000 * cpu / (ROUNDS - ROUNDS // 2):.2f} ms CPU a read of {BATCH} new ports, written {sorted(map(str, reads.written))[:4]}")

engine.dispose(); pg.stop()
