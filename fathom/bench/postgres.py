"""A throw-away PostgreSQL server for tests and benchmarks: Debian's PostgreSQL 15 binaries, a data
directory in a temp dir, a unix socket only (no TCP port). Run as user `postgres` when we are root
(initdb refuses root).

`durable=False` (tests) turns fsync and synchronous commit off and keeps the data directory in memory
(/dev/shm, where there is one: a test run makes a database per test, hundreds of megabytes it would
otherwise write to disk and remove again); a benchmark keeps PostgreSQL's defaults (`durable=True`)
and a data directory on disk, as a production store would.

Each server's directory names the process that started it (`owner`); starting a server first stops
and removes those whose owner is gone (a test run killed before its teardown).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

BIN = Path("/usr/lib/postgresql/15/bin")
PORT = 5432   # only names the socket file (.s.PGSQL.5432) inside our private directory
PREFIX = "fathom-pg-"
IN_MEMORY = Path("/dev/shm")


def _parents() -> list[Path]:
    """Where servers' directories are made: the temp dir, and memory for the non-durable ones."""
    return [Path(tempfile.gettempdir()), *([IN_MEMORY] if IN_MEMORY.is_dir() else [])]


def reap_orphans() -> list[Path]:
    """Stop and remove the throw-away servers whose owner process is gone; returns their directories."""
    reaped = []
    for base in (b for parent in _parents() for b in parent.glob(PREFIX + "*")):
        try:
            owner = int((base / "owner").read_text())
        except (OSError, ValueError):
            continue          # being created, or not one of ours
        if Path(f"/proc/{owner}").exists():
            continue
        if (base / "data" / "postmaster.pid").exists():
            subprocess.run([*_as_postgres(), str(BIN / "pg_ctl"), "-D", str(base / "data"), "-m", "immediate",
                            "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)
        reaped.append(base)
    return reaped


def _as_postgres() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


class PostgresServer:
    def __init__(self, durable: bool = False):
        if not (BIN / "initdb").exists():
            raise RuntimeError(f"{BIN}/initdb is missing: run scripts/setup (Debian package postgresql)")
        self.durable = durable
        reap_orphans()
        self.base = Path(tempfile.mkdtemp(prefix=PREFIX, dir=None if durable else _parents()[-1]))
        (self.base / "owner").write_text(str(os.getpid()))
        self.data = self.base / "data"
        self.socket_dir = self.base / "sock"
        self._counter = 0
        self._has_migrated = False

    def _run(self, *args: str) -> str:
        cmd = [*_as_postgres(), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def start(self) -> "PostgresServer":
        self.socket_dir.mkdir()
        if os.geteuid() == 0:
            os.chmod(self.base, 0o755)
            shutil.chown(self.base, "postgres", "postgres")
            shutil.chown(self.socket_dir, "postgres", "postgres")
        self._run(str(BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
                  "--no-sync", "-E", "UTF8")
        options = f"-k {self.socket_dir} -p {PORT} -c listen_addresses=''"
        if not self.durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._options = options
        self.resume()
        return self

    def halt(self) -> None:
        """Stop the server (fast shutdown: its clients are disconnected), keeping its data (`resume`)."""
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def resume(self) -> None:
        """Start the server on its data directory (after `start`'s initdb, or a `halt`)."""
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-o", self._options, "-w", "-t", "30",
                  "-l", str(self.base / "server.log"), "start")

    def stop(self) -> None:
        try:
            self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def pid(self) -> int:
        """The postmaster's process id (its backends are its children)."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@/{database}?host={self.socket_dir}&port={PORT}"

    def new_database(self, migrated: bool = False) -> str:
        """A fresh database, its SQLAlchemy URL: empty, or (`migrated`) already at fathom's newest
        schema, a copy of one this server migrated once (a migration costs about a second of CPU,
        a copy a few milliseconds)."""
        template = self._migrated() if migrated else "template1"
        self._counter += 1
        name = f"fathom_test_{self._counter}"
        self._create(name, template)
        return self.url(name)

    def _create(self, name: str, template: str) -> None:
        import psycopg
        with psycopg.connect(host=str(self.socket_dir), port=PORT, user="postgres",
                             dbname="postgres", autocommit=True) as conn:
            # a copy of the template's files: cheaper than WAL-logging each of its blocks (the default)
            conn.execute(f"CREATE DATABASE {name} TEMPLATE {template} STRATEGY FILE_COPY")

    def _migrated(self) -> str:
        name = "fathom_migrated"
        if not self._has_migrated:
            from fathom.store.db import open_store
            self._create(name, "template1")
            open_store(self.url(name)).dispose()    # no connection may stay on a template being copied
            self._has_migrated = True
        return name
