"""Fixtures shared by the unit tests: the store on SQLite and on a real PostgreSQL server."""
import os

# every reconciler (and every lab's controller) checks that its incrementally kept desired state
# equals a full compile after each pass (fathom.controller.reconciler, check_incremental)
os.environ.setdefault("FATHOM_CHECK_INCREMENTAL", "1")

import pytest

from .pgserver import PostgresServer


@pytest.fixture(scope="session")
def postgres():
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """Each test that asks for a store runs twice: on a SQLite file and on a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fathom.db'}"
    return request.getfixturevalue("postgres").new_database()
