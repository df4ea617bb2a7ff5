"""The change feed between replicas: PostgreSQL LISTEN/NOTIFY.

`notify_commits(engine, me)`: every transaction of this process that wrote (INSERT, UPDATE,
DELETE) sends a notification on CHANNEL inside that transaction, so it is delivered to the
listeners when, and only if, the transaction commits. Its payload names the replica and
PostgreSQL's clock at the write (for the lag). Statements run with the execution option
`feed=False` (the lease rounds) send none.

`Listener`: one connection per replica that LISTENs on CHANNEL and calls `on_change()` for every
notification another replica sent (this replica's own writes wake its reconciler directly). After
each (re)connection it calls `on_change()` once as well: notifications sent while it was away are
lost, so the reconciler reads the whole store again. Its lag is the time from a notification's
write to its arrival, on PostgreSQL's clock (this host's clock offset from it measured at connect).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import psycopg
from sqlalchemy import Engine, event

LOG = logging.getLogger("fathom.cluster")
CHANNEL = "fathom_store"
RECONNECT = (0.2, 5.0)    # seconds between attempts to reconnect: first, most (doubling)
_WROTE = "fathom_feed_wrote"
_DML = ("insert", "update", "delete")


def libpq_url(engine: Engine) -> str:
    """`engine`'s database as a libpq URL (what a Listener connects to)."""
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


def notify_commits(engine: Engine, me: str) -> None:
    """Make every committed write of `engine` notify CHANNEL with "<me> <PostgreSQL time>"."""
    @event.listens_for(engine, "after_cursor_execute")
    def _wrote(conn, _cursor, statement, _parameters, context, _executemany):
        if (context.execution_options.get("feed", True) and conn.in_transaction()
                and statement.lstrip()[:6].lower() in _DML):
            conn.info[_WROTE] = True

    @event.listens_for(engine, "commit")
    def _commit(conn):   # called before the DBAPI commit: the notification is part of the transaction
        if conn.info.pop(_WROTE, False):
            with conn.connection.dbapi_connection.cursor() as cur:
                cur.execute("SELECT pg_notify(%s, %s || ' ' || extract(epoch FROM clock_timestamp())::text)",
                            (CHANNEL, me))

    @event.listens_for(engine, "rollback")
    def _rollback(conn):
        if not conn.invalidated:   # else its DBAPI connection is gone (the server ended it), info too
            conn.info.pop(_WROTE, None)


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
    """The replica's LISTEN connection on `url` (a libpq URL), in a thread: `on_change()` for each
    other replica's committed write and after each (re)connection."""

    def __init__(self, url: str, me: str, on_change: Callable[[], None]):
        self.url, self.me, self.on_change = url, me, on_change
        self.lag: float | None = None          # seconds, the last notification's
        self.connected = False
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
                    sent = time.time()
                    pg = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float").fetchone()[0]
                    self._offset = pg - (sent + time.time()) / 2
                    self.connected, wait = True, RECONNECT[0]
                    if not first:
                        METRICS.reconnects.inc()
                        LOG.info("change feed connected again: the whole store is read again")
                    first = False
                    self.on_change()    # whatever was missed while away (or before the first LISTEN)
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=1.0):
                            self._received(note.payload)
            except psycopg.Error as e:
                self.connected = False
                LOG.warning("change feed: %s (connecting again in %.1f s)", e, wait)
                self._stop.wait(wait)
                wait = min(RECONNECT[1], wait * 2)

    def _received(self, payload: str) -> None:
        sender, _, at = payload.partition(" ")
        if sender == self.me:
            return
        try:
            self.lag = max(0.0, time.time() + self._offset - float(at))
            METRICS.lag.set(self.lag)
        except ValueError:
            pass
        METRICS.received.inc()
        self.on_change()
