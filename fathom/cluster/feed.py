"""The change feed between replicas (and a controller's API worker processes): PostgreSQL LISTEN/NOTIFY.

`notify_commits(engine, me)`: every transaction of this process that wrote (INSERT, UPDATE, DELETE)
sends a notification on CHANNEL inside that transaction (with its COMMIT, in one round trip), so it
is delivered to the listeners when, and only if, the transaction commits. Its payload is "<me>
<PostgreSQL's clock at the write> <its transaction id> <PostgreSQL's snapshot then> <what it
wrote>": the tables and row tokens fathom.store.changes.TableChanges notes for it, as a JSON list (a
table's name, ALL, or [kind, value] for a row token; a workload port's write also says where the
port was and is: ["port_at", [id, node id before, after, network id]]), or ["*"] (ALL: everything)
when that would not fit a notification (PAYLOAD_MAX). Statements run with the execution option
`feed=False` (the lease rounds) or `model_unchanged=True` (statuses, which each replica writes for
its own objects; an agent's desired-state revision) note nothing, and a transaction that noted
nothing sends none. The transaction id of the last such write committed on a thread is kept for it
(`committed_xid`: the API's long-polls, fathom.controller.board), and what it wrote
(`committed_written`: whether the replica's own pass waits,
fathom.controller.cluster.ClusterMember.wakes_for_own).

`status_notes(me, statuses, claim)`: the notifications of the statuses a replica writes (those it
is the one writer of, fathom.controller.cluster), sent on STATUS_CHANNEL inside the transaction that
writes them (fathom.store.status.write_statuses: with the statement that sets its lock wait, in one
round trip), with their values and the writes the pass that decided them had read (`Claim`), so
the replica a client waits on shows them as they commit, and answers a long-poll with them when
they were decided after the caller's write, without a pass or a store read of its own
(fathom.controller.board.StatusBoard.heard).

Which writes a pass read (`Claim`): PostgreSQL delivers notifications in the order their
transactions committed, and a pass reads again what every notification counted before it says
(fathom.store.changes). So once a notification is counted, so is every write that committed
before it; in particular every write its writer's snapshot (taken in its transaction, before its
commit) shows as committed. A Listener keeps the newest such snapshot and the transaction ids of
the notifications counted that it does not show (`Taken`); a pass takes that (`Listener.claim()`)
before it reads, and its statuses carry it.

`Listener`: one connection per replica that LISTENs on both channels and calls `on_change(written)`
for every notification another replica sent on CHANNEL (this replica's own writes wake its
reconciler directly), `written` being what it wrote ({ALL} when the payload does not say), and
`on_statuses(statuses)` for each on STATUS_CHANNEL. After each (re)connection it calls
`on_change({ALL})` as well: notifications sent while it was away are lost, so the whole store is
read again. Its lag is the time from a notification's write to its arrival, on PostgreSQL's
clock (this host's clock offset from it measured at connect). `follow(engine, me, on_change)`: a
Listener whose notifications every TableChanges of `engine` counts as written by this process (so
a pass re-reads only what they changed), then calls `on_change(written)`.
"""
from __future__ import annotations

import json
import logging
import select
import threading
import time
from contextvars import ContextVar
from typing import Callable

import psycopg
from psycopg.conninfo import make_conninfo
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from fathom.store.changes import ALL, TableChanges, written_elsewhere
from fathom.store.db import dead_server_checks

LOG = logging.getLogger("fathom.cluster")
CHANNEL = "fathom_store"
STATUS_CHANNEL = "fathom_status"
RECONNECT = (0.2, 5.0)    # seconds between attempts to reconnect: first, most (doubling)
# PostgreSQL refuses a payload of 8000 bytes or more; the sender's name and the time take the rest
PAYLOAD_MAX = 7900
# the row tokens a payload may carry: kind -> the types of its value
_ROWS = {"port": (int, type(None)), "ip_allocation": (int,), "port_cascade": (str,), "port_at": (list,)}
# room in a notification for its transaction id and snapshot (PostgreSQL's time and the sender's
# name take the rest of what PAYLOAD_MAX leaves)
SNAPSHOT_ROOM = 1100
# the transaction ids a claim names besides its snapshot, at most (any subset is a claim as true)
CLAIM_XIDS = 64
_COMMITTED = threading.local()   # .xid, .written: the last write this thread committed that notified
# the transaction ids of the writes a request made that notified (set to a list per request by the
# API: fathom.api.commits; the thread pool its handler runs in shares the list)
REQUEST_COMMITS: ContextVar[list | None] = ContextVar("fathom_request_commits", default=None)


def committed_xid() -> int | None:
    """The transaction id of the last write this thread committed with a notification since the
    last call (None: none). A later commit on a thread stands for the earlier ones: whoever read
    it read those (they committed before it)."""
    xid = getattr(_COMMITTED, "xid", None)
    _COMMITTED.xid = None
    return xid


def committed_written() -> set | None:
    """What the last write this thread committed with a notification wrote, as its notification
    says it (the tables and row tokens, {ALL}), since the last call; None: none."""
    written = getattr(_COMMITTED, "written", None)
    _COMMITTED.written = None
    return written


class Claim:
    """The writes a replica's pass had read: every transaction its `snapshot` (xmin, xmax, the ids
    in progress) shows as committed, and those in `xids`. `writer`: the replica."""
    __slots__ = ("writer", "snapshot", "xids")

    def __init__(self, writer: str, snapshot: tuple | None, xids: frozenset):
        self.writer, self.snapshot, self.xids = writer, snapshot, xids

    def covers(self, xid: int) -> bool:
        if xid in self.xids:
            return True
        if self.snapshot is None:
            return False
        xmin, xmax, xip = self.snapshot
        return xid < xmin or (xid < xmax and xid not in xip)

    @property
    def xmin(self) -> int:
        return self.snapshot[0] if self.snapshot is not None else 0

    def text(self) -> str:
        """As a status notification carries it: "<xmin>:<xmax>:<xip,...>/<xid,...>" ("-" for no snapshot)."""
        snap = "-" if self.snapshot is None else \
            f"{self.snapshot[0]}:{self.snapshot[1]}:{','.join(map(str, sorted(self.snapshot[2])))}"
        return f"{snap}/{','.join(map(str, sorted(self.xids)[-CLAIM_XIDS:]))}"

    @classmethod
    def parse(cls, writer: str, text: str) -> "Claim | None":
        snap, _, xids = text.partition("/")
        try:
            return cls(writer, None if snap == "-" else snapshot_in(snap),
                       frozenset(int(x) for x in xids.split(",") if x))
        except ValueError:
            return None


def snapshot_in(text: str) -> tuple:
    """PostgreSQL's text of a snapshot ("xmin:xmax:xip,...") as (xmin, xmax, frozenset of xip)."""
    xmin, xmax, xip = text.split(":")
    return int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x)


class Taken:
    """What a Listener's notifications counted so far say was committed (see the module's
    docstring): the newest of their writers' snapshots, and the ids of the notifications counted
    that it does not show."""

    def __init__(self):
        self._lock = threading.Lock()
        self._snapshot: tuple | None = None
        self._xids: set = set()

    def saw(self, xid: int, snapshot: tuple | None) -> None:
        """A notification was counted: its transaction `xid`, its writer's `snapshot` (None: not sent)."""
        with self._lock:
            old = self._snapshot
            if snapshot is None:
                pass
            elif old is None or (snapshot[1], snapshot[0], -len(snapshot[2])) > (old[1], old[0], -len(old[2])):
                self._snapshot = snapshot
                xmin, xmax, xip = snapshot
                self._xids = {x for x in self._xids if not (x < xmin or (x < xmax and x not in xip))}
            self._xids.add(xid)
            if len(self._xids) > 4 * CLAIM_XIDS:    # the oldest go: a later snapshot shows them
                self._xids = set(sorted(self._xids)[-CLAIM_XIDS:])

    def claim(self, writer: str) -> Claim:
        with self._lock:
            return Claim(writer, self._snapshot, frozenset(self._xids))


def libpq_conninfo(engine: Engine) -> str:
    """`engine`'s database as a libpq connection string (what a Listener connects to): the
    arguments SQLAlchemy's psycopg dialect would connect with, so several hosts in its URL
    (`?host=h1:5432&host=h2:5432&target_session_attrs=read-write`) are libpq's `host=h1,h2
    port=5432,5432`, and the Listener follows a failover as the engine does."""
    _args, params = engine.dialect.create_connect_args(engine.url)
    params.pop("context", None)    # psycopg's adapters, not a connection parameter
    return make_conninfo(**{**dead_server_checks(params), **params})   # as the store's pool connects


def notify_commits(engine: Engine, me: str) -> None:
    """Make every committed write of `engine` notify CHANNEL with "<me> <PostgreSQL time> <what it wrote>"."""
    _Notes(engine, me)


class _Notes(TableChanges):
    """A connection's writes, sent on CHANNEL as its transaction commits (in it)."""
    IN_TRANSACTION = True

    def __init__(self, engine: Engine, me: str):
        super().__init__(engine)
        self.me = me

    def _noted(self, options) -> bool:
        return super()._noted(options) and options.get("feed", True)

    def _committed_on(self, conn, written: set) -> None:
        # a "commit" listener runs before the DBAPI commit: the notification is part of the transaction,
        # sent with its COMMIT in one round trip (a query of two statements, so its values are bound
        # here, quoted by the driver); the DBAPI commit after it finds nothing to commit. It runs on the
        # driver's cursor, so SQLAlchemy does not wrap what fails there: a server that ended the
        # session (a restart) is told as SQLAlchemy's OperationalError, which the API answers 503, as
        # it would have the commit's own failure
        dbapi = conn.connection.dbapi_connection
        statement = f"SELECT {notice_sql('%s', '%s', '%s', '%s')}, pg_current_xact_id()::text"
        if dbapi.pgconn.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
            statement += "; COMMIT"
        text = payload(written, len(self.me.encode()) + SNAPSHOT_ROOM)
        params = (CHANNEL, self.me, SNAPSHOT_ROOM - 100, text)
        try:
            with psycopg.ClientCursor(dbapi) as cur:
                cur.execute(statement, params)
                xid = int(cur.fetchone()[1])
        except psycopg.Error as e:
            raise DBAPIError.instance(statement, params, e, psycopg.Error) from e
        self.noticed(xid, {ALL} if text == _EVERYTHING else written)

    def notice(self, written: str) -> tuple[str, dict]:
        """The notification of a statement that commits on its own (db.AT_ONCE) and writes it itself
        (fathom.store.ops.insert_port's): its SQL, `written` being the SQL of its payload's last part
        (what the statement wrote, as `payload` writes it; short), and its parameters. The statement
        then tells `noticed` its transaction id and fathom.store.changes.port_rows_written that this
        tracker was told."""
        return (notice_sql(":feed_channel", ":feed_me", ":feed_room", written),
                {"feed_channel": CHANNEL, "feed_me": self.me, "feed_room": SNAPSHOT_ROOM - 100})

    def noticed(self, xid: int, written: set) -> None:
        """A write of this thread notified CHANNEL in its transaction `xid`, which committed or is
        committing, that it wrote `written` (committed_written)."""
        _COMMITTED.xid, _COMMITTED.written = xid, written
        if (commits := REQUEST_COMMITS.get()) is not None:
            commits.append(xid)

    def _count(self, written: set, elsewhere: bool = False) -> None:
        """Another process's writes (written_elsewhere): this tracker only sends."""


def notice_sql(channel: str, me: str, room: str, written: str) -> str:
    """The SQL of a notification on `channel` (its arguments SQL expressions) from the writer `me`, in
    the transaction that writes: "<me> <PostgreSQL's clock> <the transaction's id> <its snapshot>
    <written>"; a snapshot of `room` characters or more (hundreds of transactions in progress) is left
    out: "-"."""
    return (f"pg_notify({channel}, {me} || ' ' || extract(epoch FROM clock_timestamp())::text || ' ' || "
            f"pg_current_xact_id()::text || ' ' || (CASE WHEN length(pg_current_snapshot()::text) < {room} "
            f"THEN pg_current_snapshot()::text ELSE '-' END) || ' ' || {written})")


_EVERYTHING = json.dumps([ALL])


def payload(written: set, reserved: int = 0) -> str:
    """What a transaction wrote as a notification's text: a JSON list of tables and [kind, value]
    row tokens, or ["*"] when it and `reserved` bytes would be over PAYLOAD_MAX."""
    text = json.dumps([t if isinstance(t, str) else list(t) for t in written], separators=(",", ":"))
    return text if len(text.encode()) + reserved <= PAYLOAD_MAX else _EVERYTHING


def status_notes(me: str, statuses: dict, claim: Claim | None = None) -> list[tuple[str, str]]:
    """The notifications (channel, payload) that tell `statuses` ((kind, id) -> value, as
    fathom.store.status.write_statuses takes them) on STATUS_CHANNEL: "<me> <claim> <JSON list of
    [kind, id, value]>" (`claim`: the writes the pass that decided them had read, `Claim.text`;
    "-/" none), as many as PAYLOAD_MAX asks (a reason too long for one is cut short)."""
    head = f"{me} {claim.text() if claim is not None else '-/'}"
    chunks, chunk, size = [], [], 0
    reserved = len(head.encode()) + 8
    for (kind, obj), value in statuses.items():
        item = json.dumps([kind, obj, value], separators=(",", ":"))
        if len(item.encode()) + reserved > PAYLOAD_MAX:   # a reason of thousands of characters
            status, reason = value
            cut = (reason or "").encode()[: PAYLOAD_MAX // 2].decode(errors="ignore") + "…"
            item = json.dumps([kind, obj, [status, cut]], separators=(",", ":"))
        if chunk and size + len(item.encode()) + 1 + reserved > PAYLOAD_MAX:
            chunks.append(chunk)
            chunk, size = [], 0
        chunk.append(item)
        size += len(item.encode()) + 1
    if chunk:
        chunks.append(chunk)
    return [(STATUS_CHANNEL, f"{head} [{','.join(items)}]") for items in chunks]


def statuses_in(text: str) -> dict:
    """The statuses a STATUS_CHANNEL notification's JSON carries ((kind, id) -> value); {} when it
    cannot be read."""
    try:
        items = json.loads(text)
    except ValueError:
        return {}
    out = {}
    for item in items if isinstance(items, list) else ():
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and isinstance(item[1], int)
                and isinstance(item[2], list)):
            return {}
        kind, obj, value = item
        # a subnet's DHCP servers: ((node, status, reason), ...); any other: (status, reason)
        out[(kind, obj)] = tuple(tuple(v) if isinstance(v, list) else v for v in value)
    return out


def written_in(text: str) -> set:
    """The tables and row tokens a notification's text names; {ALL} for anything else."""
    try:
        items = json.loads(text)
    except ValueError:
        return {ALL}
    if not isinstance(items, list):
        return {ALL}
    out: set = set()
    for item in items:
        if isinstance(item, str):
            out.add(item)
        elif (isinstance(item, list) and len(item) == 2 and item[0] in _ROWS
              and type(item[1]) in _ROWS[item[0]]):
            if item[0] != "port_at":
                out.add((item[0], item[1]))
            elif len(item[1]) == 4 and all(type(x) is int or (x is None and i in (1, 2))
                                           for i, x in enumerate(item[1])):
                out.add((item[0], tuple(item[1])))
            else:
                return {ALL}
        else:
            return {ALL}
    return out


def follow(engine: Engine, me: str, on_change: Callable[[set], None],
           on_statuses: Callable[[dict, Claim | None], None] | None = None) -> "Listener":
    """A started Listener on `engine`'s database: what another process's notification names is
    counted by every TableChanges of `engine` as written here, then `on_change(written)` is called
    with it (so its `claim()` is one a pass of this process may make); the statuses another replica
    wrote go to `on_statuses(statuses, claim)`."""
    def received(written: set) -> None:
        written_elsewhere(engine, written)
        on_change(written)
    return Listener(libpq_conninfo(engine), me, received, on_statuses).start()


class _Metrics:
    _made: dict = {}

    def __getattr__(self, name):
        if not self._made:
            from prometheus_client import Counter, Gauge
            self._made.update(
                lag=Gauge("fathom_cluster_feed_lag_seconds",
                          "the last change notification's delay from its write to its arrival here"),
                received=Counter("fathom_cluster_feed_notifications", "change notifications from other replicas"),
                reconnects=Counter("fathom_cluster_feed_reconnects",
                                   "change feed connections made again (each followed by a whole store read)"),
            )
        return self._made[name]


METRICS = _Metrics()


class Listener:
    """The replica's LISTEN connection on `url` (a libpq URL or connection string), in a thread: `on_change(written)` for
    each other replica's committed write (what it wrote) and after each (re)connection ({ALL});
    `on_statuses(statuses, claim)` for the statuses another replica wrote (`claim`: the writes the
    pass that decided them had read, None when the notification does not say). `claim()`: the
    writes of the notifications `on_change` was called for so far (see the module's docstring)."""

    def __init__(self, url: str, me: str, on_change: Callable[[set], None],
                 on_statuses: Callable[[dict, Claim | None], None] | None = None):
        self.url, self.me, self.on_change, self.on_statuses = url, me, on_change, on_statuses
        self.taken = Taken()
        self.lag: float | None = None          # seconds, the last notification's
        self.connected = False
        self.reconnects = 0                    # connections made again after one ended
        self._offset = 0.0                     # PostgreSQL's clock minus this host's
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="change-feed")

    def start(self) -> "Listener":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        wait, first = RECONNECT[0], True
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=5,
                                     application_name=f"fathom feed {self.me}") as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    conn.execute(f"LISTEN {STATUS_CHANNEL}")
                    sent = time.time()
                    pg = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float").fetchone()[0]
                    self._offset = pg - (sent + time.time()) / 2
                    self.connected, wait = True, RECONNECT[0]
                    if not first:
                        self.reconnects += 1
                        METRICS.reconnects.inc()
                        LOG.info("change feed connected again: the whole store is read again")
                    first = False
                    self.on_change({ALL})    # whatever was missed while away (or before the first LISTEN)
                    while not self._stop.is_set():
                        # waits on the socket itself: psycopg's own wait for notifications wakes
                        # every 0.1 s (to notice an interrupt), ten times a second at rest
                        if select.select([conn.pgconn.socket], [], [], 1.0)[0]:
                            for note in conn.notifies(timeout=0):
                                if note.channel == STATUS_CHANNEL:
                                    self._statuses(note.payload)
                                else:
                                    self._received(note.payload)
            except psycopg.Error as e:
                self.connected = False
                LOG.warning("change feed: %s (connecting again in %.1f s)", e, wait)
                self._stop.wait(wait)
                wait = min(RECONNECT[1], wait * 2)

    def claim(self) -> Claim:
        return self.taken.claim(self.me)

    def _statuses(self, text: str) -> None:
        sender, _, values = text.partition(" ")
        if sender != self.me and self.on_statuses is not None:
            claim = None
            if not values.startswith("["):
                said, _, values = values.partition(" ")
                claim = Claim.parse(sender, said)
            statuses = statuses_in(values)
            if statuses:
                self.on_statuses(statuses, claim)

    def _received(self, text: str) -> None:
        sender, at, written = (text.split(" ", 2) + ["", ""])[:3]
        xid = snapshot = ""
        if not written.startswith("["):    # a transaction id and snapshot before what it wrote
            xid, snapshot, written = (written.split(" ", 2) + ["", ""])[:3]
        if sender == self.me:   # counted in claims (a pass after it reads it), and nothing else
            self._taken(xid, snapshot)
            return
        try:
            self.lag = max(0.0, time.time() + self._offset - float(at))
            METRICS.lag.set(self.lag)
        except ValueError:
            pass
        METRICS.received.inc()
        self.on_change(written_in(written))
        self._taken(xid, snapshot)   # counted: the writes it stands for are read by the next pass

    def _taken(self, xid: str, snapshot: str) -> None:
        try:
            self.taken.saw(int(xid), snapshot_in(snapshot))
        except ValueError:     # a snapshot left out ("-"): its own write only
            if xid.isdigit():
                self.taken.saw(int(xid), None)
