"""A/B of a port creation's store write (the create route as it runs in the controller: its closure,
its answer and Idempotency-Key, through fathom.api.ports.create_port) in one thread, alternating
blocks: this thread's CPU and the PostgreSQL backends' schedstat per creation.

A is the code at REF (default main) for the functions named, B the working tree's: each function's
source at REF is run in its module's namespace and swapped in for A's blocks; a method named
`module:Class.method` is taken from the module at REF run whole. With --a-sql STATEMENT
(repeatable) A and B write to a database each, A's changed by the statements after its migration.
--feed: the store notifies the change feed (as an API worker's), another connection listening;
--a-transaction: A's blocks write in a transaction (no `at_once`). PREFIX (environment): PostgreSQL's
directories are named fathom-pg-PREFIX-*. Run from the repository:
    python micro-ab.py BLOCK ROUNDS [module:function ...] [--ref REF] [--a-sql STATEMENT ...] [--feed] [--a-transaction]"""
import ipaddress, os, re, subprocess, sys, time, importlib
sys.path.insert(0, ".")
import fathom.bench.postgres as _pgmod
if os.environ.get("PREFIX"):
    _pgmod.PREFIX = f"fathom-pg-{os.environ['PREFIX']}-"
from fathom.bench.postgres import PostgresServer
from fathom.store.db import open_store
from fathom.store import ops
from fathom.store.changes import TableChanges
from fathom.api.deps import Store
from fathom.api import request_ids, schemas as sc
from fathom.store.ops import Caller, Settings
import fathom.api.ports as ports_mod

args = sys.argv[1:]
ref = "main"
if "--ref" in args:
    i = args.index("--ref"); ref = args[i + 1]; del args[i:i + 2]
# --feed: the store's engine notifies the change feed (as an API worker's), another connection
# listening; --a-transaction: A's blocks write in a transaction (Store.write without at_once)
feed_on = "--feed" in args
a_transaction = "--a-transaction" in args
args = [a for a in args if a not in ("--feed", "--a-transaction")]
a_sql = []
while "--a-sql" in args:
    i = args.index("--a-sql"); a_sql.append(args[i + 1]); del args[i:i + 2]
N, R, names = int(args[0]), int(args[1]), args[2:]


SPACES = {}   # module -> the namespace its functions at REF run in (they call each other's REF version)


def old_function(module, name):
    if "." in name:   # Class.method: the module at REF run whole, its class's method taken
        source = subprocess.run(["git", "show", f"{ref}:{module.replace('.', '/')}.py"], capture_output=True,
                                text=True, check=True).stdout
        space = {"__name__": module + "_ref"}
        exec(compile(source, f"{ref}:{module}", "exec"), space)
        cls, meth = name.split(".")
        mod = importlib.import_module(module)
        return getattr(mod, cls), meth, space[cls].__dict__[meth]
    source = subprocess.run(["git", "show", f"{ref}:{module.replace('.', '/')}.py"], capture_output=True,
                            text=True, check=True).stdout
    found = re.search(rf"^(?:@[^\n]*\n)*(?:async )?def {name}\(.*?(?=^\S)", source, re.S | re.M)
    mod = importlib.import_module(module)
    space = SPACES.setdefault(module, dict(mod.__dict__))
    exec(compile(found.group(0), f"{ref}:{module}", "exec"), space)
    return mod, name, space[name]


async def direct(fn, *a, **k):   # the route's coroutine run here: its thread hop made a call
    return fn(*a, **k)
ports_mod.run_in_threadpool = ports_mod.in_thread = direct   # the hop of older codes and today's
swaps = [old_function(*n.split(":")) for n in names]
news = [(mod, name, mod.__dict__[name] if isinstance(mod, type) else getattr(mod, name)) for mod, name, _ in swaps]
# the modules holding each function (its own, and those that imported it by name)
holders = {(mod, name): [mod] if isinstance(mod, type) else
           [m for m in list(sys.modules.values()) if getattr(m, "__name__", "").startswith("fathom")
            and getattr(m, name, None) is getattr(mod, name)] for mod, name, _ in swaps}


def use(which):
    if a_transaction:
        stores["A"][0]._at_once = None if which is swaps else AT_ONCE
    for mod, name, fn in which:
        for holder in holders[mod, name]:
            setattr(holder, name, fn)


pg = PostgresServer(durable=True).start()
c = Caller()


def store(statements=()):
    """A store with a network, its subnet and a node: (Store, network id)."""
    engine = open_store(pg.new_database())
    with engine.begin() as conn:
        for statement in statements:
            conn.exec_driver_sql(statement)
    TableChanges(engine)
    if feed_on:
        from fathom.cluster import feed
        feed.notify_commits(engine, "api-worker-1")
    st = Store(engine, Settings(), None)
    net = st.write(lambda s: ops.create_network(s, c, Settings(), name="n", type="vxlan").id)
    st.write(lambda s: ops.create_subnet(s, c, network_id=net, cidr=ipaddress.IPv4Network("10.0.0.0/16")) and None)
    st.write(lambda s: ops.create_node(s, c, name="node1", management_ip="127.0.0.1", tunnel_ip="127.0.0.1") and None)
    return st, net


stores = {"B": store()}
stores["A"] = store(a_sql) if a_sql else stores["B"]
AT_ONCE = stores["B"][0]._at_once
listening = None
if feed_on:
    import psycopg
    from fathom.cluster.feed import libpq_conninfo
    listening = psycopg.connect(libpq_conninfo(stores["B"][0].engine), autocommit=True)
    listening.execute("LISTEN fathom_store")

n = 0


def one(variant):
    global n
    n += 1
    st, net = stores[variant]
    body = sc.PortCreate(network_id=net, name=f"p{n}", node="node1", interface_name=f"if{n}")
    tok = request_ids.PENDING.set(request_ids.Pending("scope", f"k{n}", "fp"))
    try:
        co = ports_mod.create_port(body, c, st)
        try:
            co.send(None)
        except StopIteration as e:
            assert e.value.status_code == 201, e.value.body
    finally:
        request_ids.PENDING.reset(tok)


def ns_of(pid):
    try:
        return sum(int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0]) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def backends():
    return [int(p) for p in os.popen(f"pgrep -P {pg.pid()}").read().split()]


VARIANTS = {"A": swaps, "B": news}
for k, which in VARIANTS.items():
    use(which)
    for _ in range(30):
        one(k)
res = {k: [0, 0, 0] for k in VARIANTS}
for r in range(R):
    for k, which in VARIANTS.items():
        use(which)
        b = backends(); b0 = {p: ns_of(p) for p in b}
        t0 = time.thread_time_ns()
        for _ in range(N):
            one(k)
        res[k][0] += time.thread_time_ns() - t0
        res[k][1] += sum(ns_of(p) - b0[p] for p in b)
        res[k][2] += N
        if listening is not None:
            for _ in listening.notifies(timeout=0):   # the listener's queue drained between blocks
                pass
print(f"A: {(ref + ' ' + ' '.join(names)) if names else 'the working tree'}{' with ' + '; '.join(a_sql) if a_sql else ''}"
      f"{' in a transaction' if a_transaction else ''}{'; the change feed on' if feed_on else ''}; B: the working tree; "
      f"{N} creations a block, {R} rounds; load {os.getloadavg()[0]:.1f}")
for k, (cli, srv, cnt) in res.items():
    print(f"{k}: client {cli/cnt/1e6:.3f} ms  PG {srv/cnt/1e6:.3f} ms  per creation ({cnt})")
for st, _ in stores.values():
    st.engine.dispose()
pg.stop()
