"""A store connection keeps the statements psycopg prepared on it when a transaction that only read
ends without COMMIT (fathom.store.db.make_engine): psycopg forgets them all at a ROLLBACK, and the
requests that next use the connection would each be parsed and planned again. A transaction that
wrote is still rolled back, whichever way it wrote. On a real PostgreSQL server."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from fathom.store.db import open_store


@pytest.fixture(scope="module")
def engine(postgres):
    engine = open_store(postgres.new_database(migrated=True))
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE prepared_kept (k integer)"))
    yield engine
    engine.dispose()


def prepared_on(conn) -> int:
    """The statements the server holds prepared for this connection's session."""
    return conn.exec_driver_sql("SELECT count(*) FROM pg_prepared_statements").scalar_one()


def rows(engine) -> list[int]:
    with engine.begin() as conn:
        return [k for (k,) in conn.execute(text("SELECT k FROM prepared_kept ORDER BY k"))]


def test_a_read_that_ends_without_commit_leaves_the_connection_s_prepared_statements(engine):
    with engine.connect() as conn:
        for _ in range(6):     # psycopg prepares a statement at its fifth run on a connection
            conn.execute(text("SELECT count(*) FROM nodes WHERE id > :i"), {"i": 0})
        conn.commit()
        prepared = prepared_on(conn)    # a read...
        assert prepared >= 1
        conn.rollback()                 # ...that ends without COMMIT, as a Session or Connection closed after it
        assert prepared_on(conn) == prepared


@pytest.mark.parametrize("how", ["sqlalchemy", "driver"])
def test_a_transaction_that_wrote_is_rolled_back_however_it_wrote(engine, how):
    with engine.connect() as conn:
        if how == "sqlalchemy":
            conn.execute(text("INSERT INTO prepared_kept VALUES (1)"))
        else:     # as fathom.store.db.run_prepared and the lease rounds write: unseen by SQLAlchemy
            conn.connection.driver_connection.execute("INSERT INTO prepared_kept VALUES (2)")
        conn.rollback()
    assert rows(engine) == []


def test_a_transaction_whose_statement_failed_is_rolled_back_and_the_connection_serves_again(engine):
    from sqlalchemy.exc import ProgrammingError
    with engine.connect() as conn:
        conn.execute(text("INSERT INTO prepared_kept VALUES (3)"))
        with pytest.raises(ProgrammingError):
            conn.execute(text("SELECT no_such_column FROM prepared_kept"))
        conn.rollback()
        conn.execute(text("INSERT INTO prepared_kept VALUES (4)"))
        conn.commit()
    assert rows(engine) == [4]
