"""The throw-away PostgreSQL server of the tests and benchmarks cleans up after a killed run."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fathom.bench.postgres import reap_orphans

STARTER = "from fathom.bench.postgres import PostgresServer; s = PostgresServer().start(); print(s.base, flush=True); input()"


def _postmaster(base: Path) -> int:
    return int((base / "data" / "postmaster.pid").read_text().split()[0])


def test_a_server_whose_owner_was_killed_is_stopped_and_removed():
    owner = subprocess.Popen([sys.executable, "-c", STARTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    base = Path(owner.stdout.readline().strip())
    pid = _postmaster(base)
    assert base not in reap_orphans()          # its owner is alive: left alone
    assert base.exists() and Path(f"/proc/{pid}").exists()
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    assert base in reap_orphans()
    assert not base.exists()
    deadline = time.monotonic() + 10           # the stop waits for its pid file; the exit follows
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()
