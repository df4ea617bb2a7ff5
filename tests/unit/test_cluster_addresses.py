"""Port creations in one network through several API processes on one PostgreSQL store (replicas or
API workers): each process is an app of its own (its own engine, connections and in-process address
reservations), all creating ports at once. Every creation succeeds (no 409 after the store's
retries) and no address is handed out twice."""
from __future__ import annotations

import threading
import warnings

from fathom.api import create_app

from .auth import headers_for

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

PROCESSES = 4        # apps, as separate processes would be
THREADS = 3          # concurrent writers per process
PORTS = 5            # creations per writer


def test_concurrent_port_creations_in_one_network_through_several_processes_all_succeed(postgres):
    url = postgres.new_database(migrated=True)
    apps = [create_app(url) for _ in range(PROCESSES)]
    admin = headers_for(apps[0])
    try:
        setup = TestClient(apps[0], headers=admin)
        net = setup.post("/v1/networks", json={"name": "blue"}).json()
        assert setup.post("/v1/subnets", json={"network_id": net["id"], "cidr": "10.0.0.0/22"}).status_code == 201
        failures: list[str] = []
        start = threading.Barrier(PROCESSES * THREADS)

        def create(app):
            client = TestClient(app, headers=admin)
            start.wait()
            for _ in range(PORTS):
                r = client.post("/v1/ports", json={"network_id": net["id"]})
                if r.status_code != 201:
                    failures.append(f"{r.status_code} {r.text}")

        threads = [threading.Thread(target=create, args=(app,)) for app in apps for _ in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        ips = [p["fixed_ips"][0]["ip_address"] for p in setup.get("/v1/ports").json()]
        assert len(ips) == PROCESSES * THREADS * PORTS and len(set(ips)) == len(ips)
    finally:
        for app in apps:
            app.state.engine.dispose()
