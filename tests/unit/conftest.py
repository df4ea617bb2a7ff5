"""Fixtures shared by the unit tests: the store on SQLite and on a real PostgreSQL server."""
import os

# every reconciler (and every lab's controller) checks that its incrementally kept desired state
# equals a full compile after each pass (fathom.controller.reconciler, check_incremental)
os.environ.setdefault("FATHOM_CHECK_INCREMENTAL", "1")

import shutil

import pytest

from .pgserver import PostgresServer


@pytest.fixture(scope="session")
def postgres():
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory):
    """A SQLite store migrated once per test process (a migration costs about 0.2 s of CPU)."""
    from fathom.store.db import open_store
    path = tmp_path_factory.mktemp("template") / "fathom.db"
    open_store(f"sqlite:///{path}").dispose()
    assert not path.with_name("fathom.db-wal").exists(), "the template's WAL was not checkpointed at its close"
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """Each test that asks for a store runs twice: on a new SQLite file and on a new PostgreSQL
    database, both already at the newest schema (copies of a store migrated once; the migrations
    themselves are tested in test_store_migrations.py)."""
    if request.param == "sqlite":
        path = tmp_path / "fathom.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite:///{path}"
    return request.getfixturevalue("postgres").new_database(migrated=True)
