"""PostgreSQL failover under a running replica: a primary and a synchronous streaming standby on
127.0.0.1, the store's engine, a Mastership and a change feed Listener on the multi-host URL of
docs/ha.md ("PostgreSQL highly available"); the primary is stopped (immediate) and the standby
promoted: writes fail cleanly (OperationalError, which the API answers 503) until the promotion, then
land on the new primary with the earlier committed write there; the lease rounds go on and the
Listener connects again."""
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from fathom.bench.postgres import BIN, PREFIX, _as_postgres
from fathom.cluster import feed
from fathom.cluster.leases import Timing
from fathom.cluster.mastership import Mastership
from fathom.store.db import open_store
from fathom.store.models import Node

STANDBY = "fathom_standby"
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(*args: str) -> str:
    done = subprocess.run([*_as_postgres(), *map(str, args)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


class _Node:
    """One server's directory (named as fathom.bench.postgres names its own, so an orphan is reaped)."""

    def __init__(self):
        self.base = Path(tempfile.mkdtemp(prefix=PREFIX))
        (self.base / "owner").write_text(str(os.getpid()))
        self.data, self.port = self.base / "data", _free_port()
        if os.geteuid() == 0:
            os.chmod(self.base, 0o755)
            shutil.chown(self.base, "postgres", "postgres")

    def start(self, *settings: str) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.base} " + " ".join(
            f"-c {s}" for s in settings)
        _run(BIN / "pg_ctl", "-D", self.data, "-o", options, "-w", "-t", "30", "-l", self.base / "log", "start")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            _run(BIN / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")

    def remove(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def sql(self, statement: str, database: str = "postgres"):
        import psycopg
        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=database,
                             autocommit=True) as conn:
            cursor = conn.execute(statement)
            return cursor.fetchall() if cursor.description else None


@pytest.fixture
def pair():
    primary, standby = _Node(), _Node()
    try:
        _run(BIN / "initdb", "-D", primary.data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")
        primary.start()
        primary.sql("CREATE ROLE fathom LOGIN")    # the replicas' role: no superuser
        primary.sql("CREATE DATABASE fathom OWNER fathom")
        _run(BIN / "pg_basebackup", "-d", f"host=127.0.0.1 port={primary.port} user=postgres "
             f"application_name={STANDBY}", "-D", standby.data, "-R", "-X", "stream", "-c", "fast", "--no-sync")
        standby.start()
        # from now on a commit returns once the standby has it too (synchronous_commit on, the default)
        primary.sql(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY}'")
        primary.sql("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 30
        while primary.sql(f"SELECT 1 FROM pg_stat_replication WHERE application_name = '{STANDBY}' "
                          "AND sync_state = 'sync'") == []:
            assert time.monotonic() < deadline, "the standby never became synchronous"
            time.sleep(0.1)
        yield primary, standby
    finally:
        primary.remove()
        standby.remove()


def _wait(what: str, condition, seconds: float = 20.0):
    deadline = time.monotonic() + seconds
    while not (got := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return got


def _write(engine, name: str) -> int:
    """One committed store write; the port of the server that took it."""
    with Session(engine) as session, session.begin():
        session.add(Node(name=name, project_id="admin"))
        return session.execute(text("SELECT inet_server_port()")).scalar_one()


def documented_url(primary: int, standby: int) -> str:
    """The --db of docs/ha.md's "PostgreSQL highly available", its hosts db1 and db2 here."""
    found = re.findall(r"--db '(postgresql\+psycopg://[^']*)'", (ROOT / "docs" / "ha.md").read_text())
    assert len(found) == 1, "docs/ha.md shows one multi-host --db"
    url = found[0].replace("db1:5432", f"127.0.0.1:{primary}").replace("db2:5432", f"127.0.0.1:{standby}")
    assert url.count("127.0.0.1") == 2, url
    return url


def test_controllers_follow_a_promoted_standby(pair):
    primary, standby = pair
    url = documented_url(primary.port, standby.port)
    engine = open_store(url)
    timing = Timing(renew=0.2, lease=1.0, guard=0.1)
    mastership = Mastership(engine, lambda: ["s1"], replica_id="r1", timing=timing).start()
    listener = feed.Listener(feed.libpq_conninfo(engine), "r1", lambda _written: None).start()
    try:
        assert _write(engine, "before") == primary.port
        epoch = _wait("the lease", lambda: mastership.held().get("s1"))
        _wait("the change feed", lambda: listener.connected)

        primary.stop()
        # the standby refuses read-write sessions until promoted: a clean store error (503), not a hang
        with pytest.raises(OperationalError):
            _write(engine, "during")
        _run(BIN / "pg_ctl", "-D", standby.data, "-w", "promote")

        refused = []

        def written() -> int | None:
            try:
                return _write(engine, "after")
            except OperationalError as e:    # a dead pooled connection fails once: the pool drops them all
                refused.append(e)
                return None
        assert _wait("a write after the promotion", written) == standby.port
        assert len(refused) <= 1, refused
        with engine.connect() as conn:
            keys = set(conn.execute(text("SELECT name FROM nodes")).scalars())
        assert {"before", "after"} <= keys and "during" not in keys

        _wait("the feed's reconnection", lambda: listener.reconnects == 1 and listener.connected)
        assert mastership.failures > 0, "no lease round saw the primary go"
        # rounds succeed again on the new primary: its heartbeat is fresh there, no round fails any
        # more, and the lease is held under an epoch never lower than before
        fresh = ("SELECT 1 FROM cluster_replicas WHERE id = 'r1' "
                 "AND heartbeat > clock_timestamp() - interval '0.5 s'")
        _wait("lease rounds on the new primary", lambda: standby.sql(fresh, "fathom"))
        failures = mastership.failures
        time.sleep(5 * timing.renew)
        assert mastership.failures == failures
        assert mastership.held()["s1"] >= epoch
        assert standby.sql("SELECT pg_is_in_recovery()") == [(False,)]
    finally:
        listener.stop()
        mastership.stop()
        engine.dispose()
