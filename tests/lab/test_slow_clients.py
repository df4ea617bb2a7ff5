"""A host that holds the API with half-open connections and slow bodies does not stop the control
plane (docs/security.md, *Connections and slow clients*): a real `fathom controller` on loopback,
the attacker from 127.0.0.66, a node's agent from 127.0.0.2 and a tenant from 127.0.0.3 (the
controller sees each loopback address as its own source)."""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import httpx

from fathom.api.connections import raise_open_files
from fathom.lab.controller import start_controller, stop_controller

from .slow_clients import Client, start_attack

ATTACK_SECONDS = 24
LEGIT_SECONDS = 15


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_half_open_connections_and_slow_bodies_from_one_host():
    raise_open_files()
    with tempfile.TemporaryDirectory(prefix="zd1-") as run:
        ctl = start_controller(Path(run), "127.0.0.1")
        try:
            url = ctl["url"]
            admin = {"Authorization": "Bearer " + Path(ctl["token_file"]).read_text().strip()}
            with httpx.Client(base_url=url, headers=admin, timeout=10) as api:
                assert api.post("/v1/nodes", json={"name": "compute1"}).status_code == 201

                def token(**body) -> str:
                    answer = api.post("/v1/tokens", json=body)
                    assert answer.status_code == 201, answer.text
                    return answer.json()["token"]
                agent = token(project_id="admin", roles=["agent"], node="compute1")
                tenant = token(project_id="tenant-a", roles=["member"])
                mallory = token(project_id="tenant-m", roles=["member"])     # the attacker's own, valid
                assert httpx.post(f"{url}/v1/networks", json={"name": "net1"},
                                  headers={"Authorization": f"Bearer {tenant}"}).status_code == 201
                baseline = rss_kib(ctl["pid"])
                quiet = Client(url, "127.0.0.3", tenant, ["/v1/networks"], rate=20, seconds=5)   # for the message
                quiet.run()

                attack = start_attack(url, "127.0.0.66", half_open=1000, slow_bodies=1000, token=mallory,
                                      seconds=ATTACK_SECONDS)
                time.sleep(5)                       # the attacker holds all it can
                clients = [Client(url, "127.0.0.2", agent, ["/v1/agents/compute1/desired", "/v1/agents/compute1"],
                                  rate=20, seconds=LEGIT_SECONDS),
                           Client(url, "127.0.0.3", tenant, ["/v1/networks", "/v1/ports", "/v1/routers"],
                                  rate=20, seconds=LEGIT_SECONDS)]
                for c in clients:
                    c.start()
                peak = baseline
                while any(c.is_alive() for c in clients):
                    peak = max(peak, rss_kib(ctl["pid"]))
                    time.sleep(0.25)
                guard = api.get("/v1/health").json()["api_connections"]
                out, _ = attack.communicate(timeout=ATTACK_SECONDS + 30)
                attacker = json.loads(out)
        finally:
            stop_controller(Path(run))
    summaries = {"agent": clients[0].summary(), "tenant": clients[1].summary(), "tenant, no attack": quiet.summary()}
    report = json.dumps({"clients": summaries, "attacker": attacker, "guard": guard,
                         "rss_kib": {"baseline": baseline, "peak": peak}})
    print(report)
    # the attack was real: far more connections than the source is served, the rest held; bodies answered 408
    assert attacker["connects"] >= 2000 and guard.get("held", 0) > 1000, report
    assert attacker["answers"].get("408", 0) > 0 and attacker["answers"].get("401", 0) > 0, report
    for name in ("agent", "tenant"):
        s = summaries[name]
        assert s["requests"] == 20 * LEGIT_SECONDS and s["failed"] == 0, (name, report)
        assert s["p99_ms"] <= 100, (name, report)
    # memory bounded: 64 connections served and ~2,000 held cost little
    assert peak - baseline < 64 * 1024, report
