"""Wake-ups across the processes sharing one PostgreSQL store: a committed write calls
`notify_change(engine)`; every process that runs `listen(engine, on_change)` has `on_change()`
called soon after. A NOTIFY is a hint only (lost while a listener is disconnected), so a listener
calls `on_change()` at every (re)connection too, and what it wakes reads the store itself.

Notifications are coalesced per process: a burst of writes sends one NOTIFY per COALESCE seconds
(notifying transactions serialise on a cluster-wide lock at commit; docs/ha.md).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from sqlalchemy import Engine

LOG = logging.getLogger(__name__)
CHANNEL = "fathom_change"
COALESCE = 0.005   # seconds: notifications of one process at most this often
RECONNECT = 1.0    # seconds between attempts of a listener whose connection failed

_senders: dict[int, threading.Event] = {}
_lock = threading.Lock()


def _dsn(engine: Engine) -> str:
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


def notify_change(engine: Engine) -> None:
    """Tell every listener on `engine`'s database that something was committed (asynchronous)."""
    with _lock:
        wanted = _senders.get(id(engine))
        if wanted is None:
            wanted = _senders[id(engine)] = threading.Event()
            threading.Thread(target=_send, args=(engine, wanted), daemon=True, name="notify-change").start()
    wanted.set()


def _send(engine: Engine, wanted: threading.Event) -> None:
    import psycopg
    conn = None
    while True:
        wanted.wait()
        wanted.clear()
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(_dsn(engine), autocommit=True)
            conn.execute(f"NOTIFY {CHANNEL}")
        except psycopg.Error as e:
            LOG.warning("change notification not sent: %s", e)   # listeners resync when they reconnect
            conn = None
        time.sleep(COALESCE)


def listen(engine: Engine, on_change: Callable[[], None]) -> threading.Thread:
    """Call `on_change()` at each notification (and at each (re)connection), from a thread."""
    import psycopg

    def run() -> None:
        while True:
            try:
                with psycopg.connect(_dsn(engine), autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    on_change()
                    for _ in conn.notifies():
                        on_change()
            except psycopg.Error as e:
                LOG.warning("change feed: %s (again in %.0f s)", e, RECONNECT)
            time.sleep(RECONNECT)
    thread = threading.Thread(target=run, daemon=True, name="listen-change")
    thread.start()
    return thread
