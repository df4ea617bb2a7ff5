"""Engine, sessions and schema migrations.

`open_store(url)` returns an engine whose schema is at the newest Alembic revision: migrations run
programmatically at start-up (no alembic.ini). SQLite files get foreign keys switched on, which
SQLite leaves off by default.
"""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import psycopg
from psycopg.pq import ExecStatus, TransactionStatus
from sqlalchemy import Connection, Engine, create_engine, event, inspect, make_url, text
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

from fathom.store.errors import Busy

MIGRATIONS = Path(__file__).parent / "migrations"
# Execution option for sessions that only read (snapshots, GET requests): on SQLite they then take
# no write lock. Use: session.connection(execution_options=READ_ONLY).
READ_ONLY_OPTION = "fathom_read_only"
READ_ONLY = {READ_ONLY_OPTION: True}
DEFAULT_URL = "sqlite:///fathom.db"
# How long a SQLite writer queues for the write lock before its request is refused (503, retry)
SQLITE_BUSY_MS = 10000


# A PostgreSQL server that vanishes without closing its connections (power lost, a partition) is
# noticed within about 10 s on an idle connection (TCP keepalives: the change feed's LISTEN, a pooled
# one) and on one waiting for an answer (tcp_user_timeout), not when TCP gives up (two hours idle,
# about 15 minutes busy, with Linux's defaults); the request then fails (503) and the next connection
# goes to the server that answers. Parameters of the same names in the store's URL take precedence.
DEAD_SERVER = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
               "tcp_user_timeout": 10000}


def dead_server_checks(given) -> dict:
    """DEAD_SERVER's parameters that `given` (a URL's query, a connection's parameters) does not set."""
    return {k: v for k, v in DEAD_SERVER.items() if k not in given}


def connect_args(given, name: str | None = None) -> dict:
    """A PostgreSQL engine's connection parameters beside `given` (its URL's query): dead_server_checks,
    and `name` as the sessions' application_name (what pg_stat_activity and the server's log call
    them: "fathom controller <replica>", "fathom leases <replica>", ...), unless `given` names them."""
    named = {"application_name": name} if name and "application_name" not in given else {}
    return {**dead_server_checks(given), **named}


def make_engine(url: str, name: str | None = None) -> Engine:
    """The store's engine for `url`; on PostgreSQL its sessions are called `name` (connect_args)."""
    if url.startswith("sqlite"):
        # One engine serves FastAPI's worker threads.
        engine = create_engine(url, connect_args={"check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_connection, _record):
            # Python's sqlite3 only opens a transaction before a write, so the reads of one
            # request (or one snapshot) would not see a single state: take transaction control
            # away from it and BEGIN ourselves (the SQLAlchemy documentation's pysqlite recipe).
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
            if not _in_memory(url):
                # Readers never block the writer and the writer never blocks readers.
                cursor.execute("PRAGMA journal_mode=WAL")
            cursor.close()

        # This process's writers queue on a lock of its own before they ask SQLite: SQLite's busy
        # handler polls with sleeps growing to 100 ms, so with eight writers waiting on it the
        # slowest call waited 0.6-0.7 s; the lock hands the write lock over as soon as it is free.
        # A writer of another process still queues on busy_timeout.
        writers = threading.Lock()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(connection):
            # A deferred transaction that reads and then writes fails at once ("database is
            # locked") when another writer got in between: writers take the write lock up
            # front and queue for it instead. Read-only work says so (READ_ONLY).
            if connection.get_execution_options().get(READ_ONLY_OPTION):
                connection.exec_driver_sql("BEGIN")
                return
            if not writers.acquire(timeout=SQLITE_BUSY_MS / 1000):
                raise Busy("the store is busy; nothing was changed: retry")
            connection.info[_WRITER] = True
            try:
                connection.exec_driver_sql("BEGIN IMMEDIATE")
            except BaseException:
                _end_write(connection)
                raise

        @event.listens_for(engine, "commit")
        @event.listens_for(engine, "rollback")
        def _end_write(connection):
            if connection.info.pop(_WRITER, False):
                writers.release()

        @event.listens_for(engine, "checkin")
        def _returned(_dbapi_connection, record):
            # a connection given back with its write still open (closed without commit or
            # rollback): the pool rolls it back, and its turn ends here
            if record.info.pop(_WRITER, False):
                writers.release()
        return engine
    engine = create_engine(url, connect_args=connect_args(make_url(url).query, name),
                           pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW, pool_use_lifo=True)

    # A pooled connection is checked (one round trip) before use only if it has been idle for
    # PING_IDLE_SECONDS: one dropped by the server (restart, idle timeout) is then replaced before a
    # request uses it, while a busy API does not pay a round trip per transaction for it.
    @event.listens_for(engine, "connect")
    def _fresh(dbapi_connection, record):
        record.info[_LAST_USED] = time.monotonic()
        # a transaction left open by a process that stopped running (SIGSTOP, a frozen VM) would hold
        # its row locks for as long: PostgreSQL ends its session after IDLE_IN_TRANSACTION_MS instead
        autocommit, dbapi_connection.autocommit = dbapi_connection.autocommit, True
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_MS}")
        dbapi_connection.autocommit = autocommit

    # psycopg forgets every statement it prepared on a connection when a transaction on it rolls back
    # (DEALLOCATE ALL: the transaction may have changed the schema), and prepares one again only at
    # its fifth execution there; every transaction that ends without COMMIT rolls back (a Session or a
    # Connection closed after reading), so one GET would make the next requests on that connection
    # parse and plan each of their statements. A transaction that wrote nothing (PostgreSQL gave it
    # no transaction id: every write, the driver's own too, takes one; and every statement of ours
    # that sends a notification, delivered only at COMMIT, takes one with pg_current_xact_id) ends
    # with COMMIT instead, which for it does what ROLLBACK does; as many round trips as ROLLBACK and
    # DEALLOCATE ALL.
    @event.listens_for(engine, "rollback")
    def _end_read(conn):
        if conn.invalidated:
            return
        dbapi_connection = conn.connection.dbapi_connection
        if dbapi_connection.pgconn.transaction_status != TransactionStatus.INTRANS:
            return
        # on the libpq handle: a statement of its own, not one of psycopg's to count towards preparing
        nothing = dbapi_connection.pgconn.exec_(_NOTHING_WRITTEN)
        if nothing.status == ExecStatus.TUPLES_OK and nothing.get_value(0, 0) == b"t":
            try:
                dbapi_connection.commit()    # the rollback that follows finds no transaction
            except psycopg.Error:   # the connection went: the rollback that follows says so as SQLAlchemy's
                pass

    @event.listens_for(engine, "checkin")
    def _used(_dbapi_connection, record):
        record.info[_LAST_USED] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_connection, record, _proxy):
        if time.monotonic() - record.info.get(_LAST_USED, 0.0) > PING_IDLE_SECONDS:
            try:
                engine.dialect.do_ping(dbapi_connection)
            except Exception as e:   # the pool replaces the connection and checks out another
                raise DisconnectionError(f"stale pooled connection: {e}") from e
    return engine


PING_IDLE_SECONDS = 1.0
# PostgreSQL connections a process keeps (and at most POOL_OVERFLOW more, closed when given back).
# The API's concurrent requests, the reconciler and the change feed fit in the kept ones: a connection
# opened and closed per request costs PostgreSQL a backend's start (fork, caches) each time, several
# ms of CPU, more than the request's SQL. The last connection given back is lent first: at a low
# request rate the others stay idle (and are checked after PING_IDLE_SECONDS), not every one in turn.
POOL_SIZE = 12
POOL_OVERFLOW = 8
IDLE_IN_TRANSACTION_MS = 30000
_LAST_USED = "fathom_last_used"
_WRITER = "fathom_sqlite_writer"     # a connection's info: it holds this process's SQLite write turn
_NOTHING_WRITTEN = b"SELECT pg_current_xact_id_if_assigned() IS NULL"


# Execution options of a write whose every statement commits as it runs (fathom.api.deps.Store.write's
# `at_once`, PostgreSQL): no BEGIN and COMMIT round trips, so it may write with one statement only.
AT_ONCE_OPTION = "fathom_at_once"
AT_ONCE = {"isolation_level": "AUTOCOMMIT", AT_ONCE_OPTION: True}


class NeedsTransaction(Exception):
    """Raised, before it writes anything, by a write run `at_once` that would write with more than one
    statement: it is run again in a transaction."""


def at_once(session: Session) -> bool:
    """Whether `session`'s statements commit as they run (AT_ONCE)."""
    return bool(session.connection().get_execution_options().get(AT_ONCE_OPTION))


class AtOnceSession:
    """What a write run `at_once` is given in place of a Session (fathom.api.deps.Store.write): the
    one connection (AT_ONCE) its statements run on, as a Session's `connection()` and `get_bind()`
    name them. No ORM: its unit of work writes with statements of its own, which such a write may
    not. A Session's transaction bookkeeping (begin, commit, close) cost as much CPU in the writing
    thread as the write's statement, for a write that has no transaction."""

    def __init__(self, connection: Connection):
        self._connection = connection
        self.info: dict = {}

    def connection(self, execution_options=None) -> Connection:
        return self._connection

    def get_bind(self, *_args, **_kwargs) -> Engine:
        return self._connection.engine


def run_prepared(conn: Connection, statement: str, params: dict, rows: bool = True,
                 plan_kept: bool = True) -> list[tuple]:
    """`statement` (psycopg's `%(name)s` parameters) run on the connection's psycopg cursor, prepared,
    in the connection's transaction: its rows (`rows`), as tuples. `plan_kept=False`: parsed and
    planned for its values at each run, not prepared on the server (a prepared statement's generic
    plan, made at its sixth run, is kept until its tables are next analyzed: a read whose best plan
    depends on how many rows it asks for, and on the tables' size, must not keep one made while they
    were small). For the API's most frequent write
    (a port's creation), where SQLAlchemy's execution and result layers cost about as much CPU as
    the driver's. The trackers of fathom.store.changes do not see such a statement: its caller tells
    them what it wrote. A driver error is raised as SQLAlchemy's (IntegrityError, OperationalError),
    as the API's write and error handlers expect."""
    dbapi = conn.dialect.loaded_dbapi
    pooled = conn.connection
    cur = pooled.info.get(_PREPARED_CURSOR)
    if cur is None or cur.closed or cur.connection is not pooled.driver_connection:
        cur = pooled.info[_PREPARED_CURSOR] = pooled.driver_connection.cursor()
    try:
        cur.execute(statement, params, prepare=plan_kept)
        return cur.fetchall() if rows else []
    except dbapi.Error as e:
        raise DBAPIError.instance(statement, params, e, dbapi.Error) from e


# A pooled connection's info (kept while its DBAPI connection lives): the cursor run_prepared runs on.
# One cursor kept, not one a statement: its adaptation of the parameters' types is made once (a new
# cursor looked each up again: some 20 µs of CPU for a port's creation's 30 parameters). It holds
# its last statement's result until its next.
_PREPARED_CURSOR = "fathom_prepared_cursor"


def driver_sql(statement, dialect) -> tuple[str, dict]:
    """A SQLAlchemy statement as run_prepared takes it: its text for `dialect` and its parameters'
    defaults (the values SQLAlchemy binds itself, such as a LIMIT's)."""
    compiled = statement.compile(dialect=dialect)
    return compiled.string, {k: v for k, v in compiled.params.items() if v is not None}


def _in_memory(url: str) -> bool:
    return url in ("sqlite://", "sqlite:///:memory:") or "mode=memory" in url


def alembic_config():
    from alembic.config import Config
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def head_revision() -> str | None:
    """The newest migration's revision, read from the scripts' text: the one no other script names
    as its down_revision (None when that is not one script: alembic decides then)."""
    revisions, downs = set(), set()
    for path in (MIGRATIONS / "versions").glob("*.py"):
        source = path.read_text()
        revision = re.search(r'^revision = "([^"]+)"$', source, re.M)
        down = re.search(r'^down_revision = (?:"([^"]+)"|None)$', source, re.M)
        if revision is None or down is None:
            return None
        revisions.add(revision[1])
        downs.add(down[1])
    heads = revisions - downs
    return heads.pop() if len(heads) == 1 else None


def current_revision(engine: Engine) -> str | None:
    """The store's schema revision (None: a new store)."""
    with engine.connect() as connection:
        if not inspect(connection).has_table("alembic_version"):
            return None
        return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision` inside one transaction. A store already at the newest
    revision is left as it is without loading alembic (and its templates, some MB of memory that
    a running controller would keep for nothing)."""
    if revision == "head" and (head := head_revision()) is not None and current_revision(engine) == head:
        return
    from alembic import command
    cfg = alembic_config()
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, revision)


def open_store(url: str = DEFAULT_URL, migrate_apart: bool = False, name: str | None = None) -> Engine:
    """The store's engine, its schema brought to the newest revision. With `migrate_apart` (the
    controller) a migration runs in a child process, so this long-lived one never loads alembic.
    The child is forked: it has the parent's modules already (a spawned one spent about half a
    second of CPU importing them again), and it uses none of the parent's pooled connections
    (closed before the fork). `name`: its sessions' name on PostgreSQL (connect_args)."""
    engine = make_engine(url, name)
    if not migrate_apart or _in_memory(url):
        migrate(engine)
    elif (head := head_revision()) is None or current_revision(engine) != head:
        import multiprocessing
        engine.dispose()
        child = multiprocessing.get_context("fork").Process(target=_migrate_url, args=(url,), name="fathom-migrate")
        child.start()
        child.join()
        if child.exitcode != 0:
            raise RuntimeError(f"migrating the store failed (exit code {child.exitcode}): see the error above")
    return engine


def _migrate_url(url: str) -> None:
    """The migration child of open_store(migrate_apart=True). It inherits the parent's logging: alembic's
    step-by-step INFO lines stay out of the controller's log, as they did from a spawned child."""
    import logging
    logging.getLogger("alembic").setLevel(logging.WARNING)
    migrate(make_engine(url))


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
