"""`GET /v1/cluster` and `fathom cluster status` over a real PostgreSQL store with two replicas (running
their rounds), admin only; on SQLite they say there is no cluster."""
from __future__ import annotations

import json
import warnings

import pytest
from click.testing import CliRunner

from fathom import client as client_module
from fathom.api import create_app
from fathom.cli.main import cli
from fathom.cluster.leases import Timing
from fathom.cluster.mastership import Mastership
from fathom.lab.ovs import wait_for

from .auth import headers_for

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


def _cli(app, monkeypatch):
    monkeypatch.setenv("FATHOM_TOKEN", headers_for(app)["Authorization"].split()[1])
    monkeypatch.setattr(client_module.httpx, "Client",
                        lambda base_url, headers, timeout: TestClient(app, base_url=base_url, headers=headers))
    runner = CliRunner()
    return lambda *args: runner.invoke(cli, list(args), catch_exceptions=False)


def test_status_shows_replicas_leases_and_epochs(postgres, monkeypatch):
    app = create_app(postgres.new_database(migrated=True))
    timing = Timing()      # the API judges liveness with the product's lease time: the replicas run theirs
    dpids = ["00000000000000a1", "00000000000000a2", "00000000000000a3"]
    a = Mastership(app.state.engine, lambda: dpids, replica_id="rep-a", address="198.18.0.1:8080", timing=timing)
    b = Mastership(app.state.engine, lambda: dpids, replica_id="rep-b", address="198.18.0.2:8080", timing=timing)
    try:
        a.start()
        b.start()
        wait_for(lambda: (len(a.held()), len(b.held())) == (2, 1), 10, "the leases shared out")
        run = _cli(app, monkeypatch)
        seen = []

        def agrees() -> bool:
            """The status read agrees with what the replicas hold (on a busy machine a renewal can
            be late by more than the 1 s lease, and the status then rightly shows it: read again)."""
            held = {s: (r.id, e) for r in (a, b) for s, e in r.held().items()}
            out = json.loads(run("cluster", "status", "--json").output)
            seen[:] = [out]
            return ([(r["id"], r["address"], r["live"], r["switches"]) for r in out["replicas"]] == [
                ("rep-a", "198.18.0.1:8080", True, 2), ("rep-b", "198.18.0.2:8080", True, 1)]
                and {x["switch"]: (x["holder"], x["epoch"]) for x in out["leases"]} == held)
        wait_for(agrees, 10, "the status showing the replicas' leases")
        assert seen[0]["store"] == "postgresql" and seen[0]["timing"] == {"renew": 0.33, "lease": 1.0, "guard": 0.1}
        assert 0 <= seen[0]["notify_queue_usage"] < 0.01     # every listener of this server reads as it goes
        table = run("cluster", "status").output
        assert "rep-a" in table and "198.18.0.2:8080" in table and "00000000000000a3" in table
        assert "notification queue 0.0% used" in table
        member = TestClient(app, headers=headers_for(app, "p1", ("member",)))
        assert member.get("/v1/cluster").status_code == 403
    finally:
        a.stop()
        b.stop()
        app.state.engine.dispose()


def test_status_on_sqlite_says_there_is_no_cluster(tmp_path, monkeypatch):
    app = create_app(f"sqlite:///{tmp_path / 'one.db'}")
    run = _cli(app, monkeypatch)
    out = json.loads(run("cluster", "status", "--json").output)
    assert (out["replicas"], out["notify_queue_usage"]) == ([], None)
    assert "no cluster: the store is sqlite" in run("cluster", "status").output
    app.state.engine.dispose()
