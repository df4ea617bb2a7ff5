"""A replica that stops (SIGSTOP: its kernel still answers TCP keepalives, so PostgreSQL keeps its
sessions) has its sessions ended by a live replica once its heartbeat is older than the keep time:
its change feed's LISTEN session, which stopped reading, no longer holds PostgreSQL's notification
queue, and its open transaction no longer holds its row locks. Until then, and while it runs, its
sessions stay; when it runs again it connects again. A real PostgreSQL server, a real second process."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from sqlalchemy import text

from fathom.cluster import feed, leases, mastership
from fathom.cluster.leases import Timing
from fathom.cluster.mastership import Mastership
from fathom.lab.ovs import wait_for
from fathom.store.db import open_store

TIMING = Timing(renew=0.05, lease=0.3, guard=0.05)    # keep: 3 s

# replica "b": joins, runs its rounds and its change feed, holds a row lock in an open transaction on its
# pool, says so, then says each time its change feed connected again
REPLICA_B = """
import sys, time
from sqlalchemy import text
from fathom.cluster import feed
from fathom.cluster.leases import Timing
from fathom.cluster.mastership import Mastership
from fathom.store.db import open_store
engine = open_store(sys.argv[1], name="fathom controller b")
listener = feed.follow(engine, "b", lambda written: None)
Mastership(engine, lambda: [], replica_id="b", timing=Timing(renew=0.05, lease=0.3, guard=0.05)).start()
pool = engine.connect()
pool.execute(text("SELECT 1 FROM cluster_keys WHERE name = 'held' FOR UPDATE"))
while not listener.connected:
    time.sleep(0.05)
print("ready", flush=True)
told = 0
while True:
    if listener.connected and listener.reconnects > told:
        told = listener.reconnects
        print("connected again", flush=True)
    time.sleep(0.05)
"""


def names(engine, like: str) -> set[str]:
    """The names of the sessions on `engine`'s database that are LIKE `like` (read in a transaction of
    their own: PostgreSQL shows a transaction the sessions as it first read them)."""
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT application_name FROM pg_stat_activity WHERE datname = current_database() "
                                     "AND application_name LIKE :like"), {"like": like}).scalars())


def test_a_stopped_replica_s_sessions_are_ended_once_its_heartbeat_is_older_than_the_keep_time(postgres):
    url = postgres.new_database(migrated=True)
    engine = open_store(url, name="fathom controller a")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO cluster_keys (name, key) VALUES ('held', '\\x00')"))
    a = Mastership(engine, lambda: [], replica_id="a", timing=TIMING)
    b = subprocess.Popen([sys.executable, "-c", REPLICA_B, url], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    ended_before = mastership.METRICS.ended._value.get()
    try:
        assert b.stdout.readline().strip() == "ready"
        a.start()
        named = {"fathom controller b", "fathom leases b", "fathom feed b"}
        assert names(engine, "% b") == named
        # while b runs, a's checks (one every keep time) leave its sessions alone
        time.sleep(TIMING.keep + 1)
        assert names(engine, "% b") == named
        os.kill(b.pid, signal.SIGSTOP)
        # notifications (distinct: a transaction sends each once) b's listening session cannot pass on:
        # it blocks on its socket, the queue grows
        with engine.connect() as conn:
            conn.execute(text("SET lock_timeout = '100ms'"))
            payload = "x" * 1000
            for _ in range(40):
                conn.execute(text("SELECT pg_notify(:c, :p || g) FROM generate_series(1, 500) AS g"),
                             {"c": feed.CHANNEL, "p": payload})
                conn.commit()
            assert conn.execute(text("SELECT pg_notification_queue_usage()")).scalar_one() > 0
            conn.commit()
            wait_for(lambda: not names(engine, "% b"), TIMING.keep + 10, "the stopped replica's sessions ended")
            # no sooner than the keep time after b's last heartbeat (its row stays: it did not leave)
            assert conn.execute(text("SELECT extract(epoch FROM clock_timestamp() - heartbeat) FROM cluster_replicas "
                                     "WHERE id = 'b'")).scalar_one() >= TIMING.keep
            conn.commit()
            wait_for(lambda: conn.execute(text("SELECT pg_notification_queue_usage()")).scalar_one() == 0, 5,
                     "the notification queue read again to its end")
            # the row b's transaction had locked is free
            conn.execute(text("SELECT 1 FROM cluster_keys WHERE name = 'held' FOR UPDATE")).all()
            conn.commit()
        assert mastership.METRICS.ended._value.get() == ended_before + 1
        os.kill(b.pid, signal.SIGCONT)
        assert b.stdout.readline().strip() == "connected again"
        wait_for(lambda: "fathom feed b" in names(engine, "% b"), 5, "b's change feed connected again")
    finally:
        os.kill(b.pid, signal.SIGCONT)
        b.kill()
        b.wait()
        a.stop()
        engine.dispose()


def test_only_the_sessions_of_a_stale_replica_s_row_opened_before_the_keep_time_are_ended(postgres):
    url = postgres.new_database(migrated=True)
    engine = open_store(url, name="checker")
    engines = {name: open_store(url, name=name) for name in ("fathom feed c", "fathom leases live", "fathom feed gone")}
    try:
        with engine.begin() as conn:
            for replica, age in (("c", "1 hour"), ("live", "0 s")):
                conn.execute(text("INSERT INTO cluster_replicas (id, address, started, heartbeat, schema_version, "
                                  "pki_fingerprint) VALUES (:r, '', now(), now() - CAST(:age AS interval), 'x', 'y')"),
                             {"r": replica, "age": age})
        held = {name: e.connect() for name, e in engines.items()}   # c's, live's, and one with no row
        with engine.connect() as conn:
            assert leases.end_stale_sessions(conn, TIMING)[0] == []    # c's session is younger than that
            conn.commit()
            time.sleep(TIMING.keep)
            conn.execute(text("UPDATE cluster_replicas SET heartbeat = clock_timestamp() WHERE id = 'live'"))
            ended, usage = leases.end_stale_sessions(conn, TIMING)
            assert ended == ["c"] and 0 <= usage < 0.01
            wait_for(lambda: names(engine, "fathom %") == {"fathom leases live", "fathom feed gone"}, 5,
                     "c's session ended, the others left")
        for c in held.values():
            c.invalidate()
    finally:
        for e in engines.values():
            e.dispose()
        engine.dispose()
