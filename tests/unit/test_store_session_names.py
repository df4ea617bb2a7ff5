"""The store's sessions on PostgreSQL carry the name of what opened them (application_name): an
operator tells a replica's pool, its lease rounds and its change feed apart in pg_stat_activity,
and a name set in the store's URL is kept. On a real PostgreSQL server."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from fathom.cluster import feed
from fathom.cluster.leases import Timing
from fathom.cluster.mastership import Mastership
from fathom.lab.ovs import wait_for
from fathom.store.db import open_store


@pytest.fixture(scope="module")
def url(postgres):
    return postgres.new_database(migrated=True)


def session_name(engine) -> str:
    with engine.connect() as conn:
        return conn.execute(text("SELECT current_setting('application_name')")).scalar_one()


def names_on(engine) -> set[str]:
    """The names of every session on `engine`'s database but the asking one."""
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT application_name FROM pg_stat_activity "
                                     "WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalars())


def test_a_store_s_sessions_are_called_by_the_name_it_was_opened_with(url):
    engine = open_store(url, name="fathom controller r1")
    try:
        assert session_name(engine) == "fathom controller r1"
    finally:
        engine.dispose()


def test_a_name_the_store_s_url_gives_is_kept(url):
    engine = open_store(url + "&application_name=ops-console", name="fathom controller r1")
    try:
        assert session_name(engine) == "ops-console"
    finally:
        engine.dispose()


def test_a_replica_s_lease_rounds_and_change_feed_are_named_after_it(url):
    engine = open_store(url, name="fathom controller r2")
    replica = Mastership(engine, lambda: [], replica_id="r2", timing=Timing(renew=0.05, lease=0.4, guard=0.05)).join()
    listener = feed.follow(engine, "r2", lambda _written: None)
    try:
        replica.run_round()
        wait_for(lambda: listener.connected, 5, "the change feed connected")
        watcher = open_store(url, name="watcher")
        try:
            wait_for(lambda: {"fathom leases r2", "fathom feed r2"} <= names_on(watcher), 5,
                     "the replica's lease rounds and change feed sessions, named after it")
        finally:
            watcher.dispose()
    finally:
        listener.stop()
        replica.stop()
        engine.dispose()
