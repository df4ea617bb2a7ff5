"""Neutron's API app for gunicorn, on SQLite, for tests and labs.

- Neutron parses sys.argv for its own options, so gunicorn's must not be there when it boots (the
  configuration comes from OS_NEUTRON_CONFIG_DIR/_FILES).
- SQLite: every transaction begins IMMEDIATE (SQLAlchemy's pysqlite recipe). With SQLite's default
  deferred transactions, a request that read and then writes while the journal thread writes gets
  "database is locked" at once (SQLite refuses the lock upgrade rather than deadlock); IMMEDIATE
  makes them queue on the busy timeout instead. MySQL and PostgreSQL need none of this.
"""
import sys

from sqlalchemy import event
from sqlalchemy.engine import Engine

sys.argv = sys.argv[:1]


@event.listens_for(Engine, "connect")
def _busy_timeout(dbapi_connection, record):
    if type(dbapi_connection).__module__.startswith("sqlite3"):
        dbapi_connection.execute("PRAGMA busy_timeout = 30000")


@event.listens_for(Engine, "begin")
def _begin_immediate(connection):
    # runs before oslo.db's own begin hook, which then sees the marker and emits no plain BEGIN
    if connection.dialect.name == "sqlite" and "in_transaction" not in connection.info:
        connection.exec_driver_sql("BEGIN IMMEDIATE")
        connection.info["in_transaction"] = True


from neutron.wsgi.api import application  # noqa: E402,F401
