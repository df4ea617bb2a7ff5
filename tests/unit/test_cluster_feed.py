"""The change feed between replicas on a real PostgreSQL server (fathom.cluster.feed): a committed
write notifies every other replica's listener, a rolled-back one and a lease round do not, a replica
does not wake itself, and a listener whose connection was cut reads again (on_change) once it is back."""
from __future__ import annotations

import threading

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import text

from fathom.cluster import feed
from fathom.cluster.mastership import Mastership
from fathom.lab.ovs import wait_for
from fathom.store.changes import ALL
from fathom.store.db import DEAD_SERVER, open_store
from fathom.store.status import write_statuses


@pytest.fixture(scope="module")
def url(postgres):
    return postgres.new_database(migrated=True)


class Count:
    """A listener's notifications: how many, and what each said was written."""

    def __init__(self):
        self.n, self.event, self.written = 0, threading.Event(), []

    def __call__(self, written: set):
        self.n += 1
        self.written.append(written)
        self.event.set()


def listener_on(url: str, me: str) -> tuple[feed.Listener, Count]:
    count = Count()
    listener = feed.Listener(url.replace("postgresql+psycopg", "postgresql"), me, count).start()
    wait_for(lambda: count.n == 1, 10, "the listener to connect (and read once)")
    return listener, count


def test_a_committed_write_wakes_the_other_replicas_listener_only(url):
    engine = open_store(url)
    feed.notify_commits(engine, "writer")
    other, theirs = listener_on(url, "reader")
    own, mine = listener_on(url, "writer")
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO cluster_leases (switch, epoch) VALUES ('00000000000000aa', 0)"))
        wait_for(lambda: theirs.n == 2, 5, "the notification of a committed write")
        assert theirs.written == [{ALL}, {ALL}]   # connected: read whole; raw SQL: its tables are not told
        assert other.lag is not None and 0 <= other.lag < 5
        with pytest.raises(RuntimeError), engine.begin() as conn:   # rolled back: nothing to tell
            conn.execute(text("INSERT INTO cluster_leases (switch, epoch) VALUES ('00000000000000ab', 0)"))
            raise RuntimeError
        with engine.execution_options(feed=False).begin() as conn:   # a lease round's statements
            conn.execute(text("UPDATE cluster_leases SET epoch = 1"))
        with engine.begin() as conn:                                 # a read
            conn.execute(text("SELECT count(*) FROM cluster_leases"))
        with engine.begin() as conn:   # a last write: once it arrived, nothing came before it
            conn.execute(text("DELETE FROM cluster_leases"))
        wait_for(lambda: theirs.n == 3, 5, "the notification of the last write")
        assert mine.n == 1   # the writer's own listener is not woken by its own writes
    finally:
        other.stop()
        own.stop()
        engine.dispose()


def test_a_transaction_s_notification_goes_with_its_commit_in_one_round_trip(url):
    """The notification and the COMMIT are one query: one wait for the server, as a commit without
    a feed takes (libpq's trace of the messages the commit sends and receives)."""
    import tempfile

    from psycopg import pq
    from sqlalchemy.orm import Session
    engine = open_store(url)
    feed.notify_commits(engine, "writer")
    other, theirs = listener_on(url, "reader")
    try:
        with tempfile.TemporaryFile("w+") as trace, Session(engine) as session:
            with session.begin():
                session.execute(text("INSERT INTO cluster_leases (switch, epoch) VALUES ('00000000000000ad', 0)"))
                pgconn = session.connection().connection.dbapi_connection.pgconn
                pgconn.trace(trace.fileno())
                pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            pgconn.untrace()
            trace.seek(0)
            messages = [line.split("\t") for line in trace.read().splitlines()]
        sent = [m for m in messages if m[0] == "F"]
        assert len(sent) == 1 and sent[0][2] == "Query", messages
        assert "pg_notify(" in sent[0][3] and sent[0][3].rstrip('" ').endswith("; COMMIT"), sent
        assert [m[2] for m in messages if m[0] == "B"].count("ReadyForQuery") == 1, messages
        wait_for(lambda: theirs.n == 2, 5, "the notification of the committed write")
        with engine.begin() as conn:
            mine = text("SELECT count(*) FROM cluster_leases WHERE switch = '00000000000000ad'")
            assert conn.execute(mine).scalar() == 1
            conn.execute(text("DELETE FROM cluster_leases WHERE switch = '00000000000000ad'"))
    finally:
        other.stop()
        engine.dispose()


def test_the_statuses_a_replica_writes_reach_the_others_whole_as_they_commit(url):
    """More statuses than one notification holds, and a reason longer than one: every other
    listener gets each status (the long reason cut short), in the writer's transaction only."""
    from sqlalchemy.orm import Session
    engine = open_store(url)
    heard: list[dict] = []
    mine: list[dict] = []
    other = feed.Listener(url.replace("postgresql+psycopg", "postgresql"), "reader", lambda _w: None,
                          lambda statuses, _claim: heard.append(statuses)).start()
    own = feed.Listener(url.replace("postgresql+psycopg", "postgresql"), "writer", lambda _w: None,
                        lambda statuses, _claim: mine.append(statuses)).start()
    try:
        wait_for(lambda: other.connected and own.connected, 10, "both listeners to connect")
        statuses = {("port", i): ("error", f"switch {i} refused it") for i in range(1, 501)}
        statuses[("port", 501)] = ("error", "x" * 20_000)
        statuses[("subnet_dhcp", 7)] = (("c1", "active", None), ("c2", "pending", "waiting"))
        with pytest.raises(RuntimeError), Session(engine) as session, session.begin():   # rolled back
            write_statuses(session, {}, {}, feed.status_notes("writer", {("port", 1): ("active", None)}))
            raise RuntimeError
        with Session(engine) as session, session.begin():
            write_statuses(session, {}, {}, feed.status_notes("writer", statuses))
        wait_for(lambda: sum(map(len, heard)) == len(statuses), 10, "every status at the other replica")
        assert len(heard) > 1     # several notifications
        got = {k: v for part in heard for k, v in part.items()}
        long = got.pop(("port", 501))
        assert got == {k: v for k, v in statuses.items() if k != ("port", 501)}
        assert long[0] == "error" and long[1].startswith("xxx") and len(long[1]) < 8000
        assert mine == []         # a replica is not told its own
    finally:
        other.stop()
        own.stop()
        engine.dispose()


def test_a_listener_s_claim_shows_the_writes_whose_notifications_it_counted_and_no_later_one(url):
    """A write's transaction id is kept for the thread that committed it; a listener's claim (what
    a pass that reads now has read) shows it once its notification arrived, and every write
    committed before it (their snapshots), not one still in progress; a claim sent with statuses
    reads back the same."""
    engine = open_store(url)
    feed.notify_commits(engine, "writer")
    counted: list[set] = []
    listener = feed.Listener(url.replace("postgresql+psycopg", "postgresql"), "reader", counted.append).start()
    try:
        wait_for(lambda: counted == [{ALL}], 10, "the listener to connect")
        feed.committed_xid()              # what the tests before committed on this thread
        xids = []
        for switch in ("00000000000000c1", "00000000000000c2"):
            with engine.begin() as conn:
                conn.execute(text("INSERT INTO cluster_leases (switch, epoch) VALUES (:s, 0)"), {"s": switch})
            xids.append(feed.committed_xid())
        assert all(xids) and xids[0] < xids[1] and feed.committed_xid() is None
        with engine.begin() as conn:      # read by nobody yet: in progress while the claim is taken
            open_xid = int(conn.execute(text("SELECT pg_current_xact_id()::text")).scalar())
            wait_for(lambda: len(counted) == 3, 5, "both notifications")
            claim = listener.claim()
            assert claim.writer == "reader" and all(claim.covers(x) for x in xids)
            assert not claim.covers(open_xid)
            conn.execute(text("DELETE FROM cluster_leases"))
        wait_for(lambda: len(counted) == 4, 5, "the last notification")
        assert listener.claim().covers(open_xid)
        back = feed.Claim.parse("reader", claim.text())
        assert (back.snapshot, back.xids) == (claim.snapshot, claim.xids)
    finally:
        listener.stop()
        engine.dispose()


def test_a_listener_cut_off_connects_again_and_says_so(url):
    engine = open_store(url)
    listener, count = listener_on(url, "reader")
    try:
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE application_name = 'fathom feed reader'"))
        wait_for(lambda: count.n == 2 and listener.connected, 10, "the listener to connect again and read again")
    finally:
        listener.stop()
        engine.dispose()


def test_a_write_whose_session_the_server_ended_fails_with_the_server_s_error(url):
    """A transaction whose session PostgreSQL ended (a restart, an idle-in-transaction timeout) fails
    with OperationalError (the API's 503), not with an error of the listeners' rollback (a 500)."""
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm import Session

    from fathom.store.changes import TableChanges
    engine = open_store(url)
    feed.notify_commits(engine, "writer")
    TableChanges(engine)
    with pytest.raises(OperationalError, match="terminating connection"):
        with Session(engine) as session, session.begin():
            session.execute(text("INSERT INTO cluster_leases (switch, epoch) VALUES ('00000000000000bb', 0)"))
            pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
            with engine.connect() as other:
                other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            session.execute(text("SELECT 1"))
    engine.dispose()


def test_a_write_whose_session_the_server_ended_before_its_commit_fails_with_operational_error(url):
    """The server ends the session between a transaction's last statement and its commit (a
    PostgreSQL stopped meanwhile): the notification sent as it commits fails first, and fails with
    SQLAlchemy's OperationalError (the API's 503), not the driver's own error (a 500)."""
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm import Session
    engine = open_store(url)
    feed.notify_commits(engine, "writer")
    with pytest.raises(OperationalError):
        with Session(engine) as session, session.begin():
            session.execute(text("INSERT INTO cluster_leases (switch, epoch) VALUES ('00000000000000bc', 0)"))
            pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
            with engine.connect() as other:
                other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    engine.dispose()


def test_a_transaction_postgresql_ended_for_idling_is_answered_503_not_500(url):
    """A process stalled inside a transaction past PostgreSQL's idle-in-transaction timeout gets
    InternalError (SQLSTATE 25P03), not OperationalError: the API answers it 503 all the same."""
    import time

    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from sqlalchemy.exc import InternalError

    from fathom.api.deps import install_error_handlers
    engine = open_store(url)
    with pytest.raises(InternalError) as ended:
        with engine.connect() as conn:
            conn.execute(text("SET idle_in_transaction_session_timeout = '100ms'"))
            conn.execute(text("SELECT 1"))
            time.sleep(0.5)
            conn.execute(text("SELECT 1"))
    engine.dispose()
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/stalled")
    def stalled():
        raise ended.value
    r = TestClient(app).post("/stalled")
    assert r.status_code == 503 and "Retry-After" in r.headers and "nothing was changed" in r.text, r.text


def test_the_feed_and_the_lease_rounds_notice_a_vanished_server_within_seconds(url):
    """Both connect with TCP keepalives and a user timeout (fathom.store.db.DEAD_SERVER), as the
    store's pool does, so a server that is gone without a word is noticed in seconds; the store
    URL's own values of them win."""
    engine = open_store(url)
    rounds = Mastership(engine, lambda: [])._rounds
    try:
        with psycopg.connect(feed.libpq_conninfo(engine)) as listening, rounds.connect() as round_conn, engine.connect() as pooled:
            for got in (listening.info.get_parameters(), round_conn.connection.dbapi_connection.info.get_parameters(),
                        pooled.connection.dbapi_connection.info.get_parameters()):
                assert {k: got.get(k) for k in DEAD_SERVER} == {k: str(v) for k, v in DEAD_SERVER.items()}
    finally:
        rounds.dispose()
        engine.dispose()
    own = open_store(url + ("&" if "?" in url else "?") + "keepalives_idle=30")
    try:
        assert conninfo_to_dict(feed.libpq_conninfo(own))["keepalives_idle"] == "30"
    finally:
        own.dispose()
