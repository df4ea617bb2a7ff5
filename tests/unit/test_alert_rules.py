"""deploy/prometheus/fathom-alerts.yml: promtool accepts it, every metric it reads is one the controller
exports on /metrics (test_reconciler checks the values of the switches' and objects' gauges), and a real
Prometheus scraping a real controller fires FathomPptmonHopSlow when a node reports slow VNF hops through
the API."""
from __future__ import annotations

import re
import subprocess
import threading
import time

import httpx
import pytest
import uvicorn
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fathom import programs
from fathom.api import create_app
from fathom.controller.reconciler import Reconciler
from fathom.controller.server import install_runtime
from fathom.lab.controller import free_port
from fathom.store.db import session_factory

from . import golden_flows
from .auth import headers_for
from .pptmon_records import record

RULES = golden_flows.ROOT / "deploy/prometheus/fathom-alerts.yml"
WANTED = {"FathomPptmonHopSlow"}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


class Served:
    """The controller's API with its runtime endpoints (/metrics among them) and a reconciler that has run
    a pass (of a cloud with no switches), under uvicorn on a loopback port, run in a thread."""

    def __init__(self, db_url: str):
        self.app = create_app(db_url)
        self.reconciler = Reconciler(session_factory(self.app.state.engine), switches=None, bootstrapper=None)
        install_runtime(self.app, self.reconciler)
        self.reconciler.run_pass(audit=False)
        self.headers = headers_for(self.app)
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", headers=self.headers, timeout=10)

    def stop(self) -> None:
        self.http.close()
        self.server.should_exit = True
        self.thread.join(10)
        self.app.state.engine.dispose()


@pytest.fixture
def served(tmp_path):
    s = Served(f"sqlite:///{tmp_path / 'fathom.db'}")
    yield s
    s.stop()


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def exported_series(served) -> set[str]:
    """The series names /metrics offers (a family's samples by its type, whether or not it has any yet).
    The cluster's families are made at first use, as a controller running as a cluster replica does."""
    from fathom.cluster.feed import METRICS as FEED
    from fathom.cluster.mastership import METRICS as CLUSTER
    for made in (CLUSTER.failures, FEED.lag):
        assert made is not None
    r = served.http.get("/metrics")
    assert r.status_code == 200, r.text
    return {f.name + s for f in text_string_to_metric_families(r.text) for s in SUFFIXES.get(f.type, ())}


def test_promtool_accepts_the_rules():
    promtool = programs.path("promtool")
    assert promtool, programs.missing_message("promtool")
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules())} rules found" in out.stdout
    for r in rules():
        assert r["for"] and r["labels"]["severity"] in ("warning", "critical"), r["alert"]
        assert "Look at" in r["annotations"]["description"], r["alert"]


def test_rules_read_only_exported_metrics(served):
    exported = exported_series(served)
    used = {name for r in rules() for name in re.findall(r"\bfathom_[a-z0-9_]+", r["expr"])}
    assert len(used) >= 5
    assert used <= exported, sorted(used - exported)


def test_prometheus_fires_on_slow_hops(served, tmp_path):
    prometheus = programs.path("prometheus")
    assert prometheus, programs.missing_message("prometheus")
    # the rules as shipped, but evaluated every second and firing at once
    doc = yaml.safe_load(RULES.read_text())
    for g in doc["groups"]:
        g["interval"] = "1s"
        for r in g["rules"]:
            r["for"] = "0s"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(doc))
    token = served.headers["Authorization"].removeprefix("Bearer ")
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(tmp_path / "rules.yml")],
              "scrape_configs": [{"job_name": "fathom", "authorization": {"credentials": token},
                                  "static_configs": [{"targets": [f"127.0.0.1:{served.port}"]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port, log = free_port(), open(tmp_path / "prometheus.log", "w")
    proc = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=log)
    agent = headers_for(served.app, "admin", ("agent",), node="n1")
    try:
        prom = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5)
        deadline = time.monotonic() + 45
        firing, i = [], 0
        while not WANTED <= {a["labels"]["alertname"] for a in firing} and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            # VNF 2 of chain pslow takes 50 ms a packet, VNF 1 takes 3 µs: a new batch each round so
            # the histogram's rate is not zero
            batch = [record(i + k, hops=(3, 50_000), chain="pslow") for k in range(20)]
            i += 20
            r = served.http.post("/v1/pptmon/records", json={"node": "n1", "records": batch}, headers=agent)
            assert r.status_code == 200, r.text
            time.sleep(0.5)
            try:
                alerts = prom.get("/api/v1/alerts").json()["data"]["alerts"]
            except httpx.HTTPError:
                continue      # not listening yet
            firing = [a for a in alerts if a["state"] == "firing"]
        # each fires with its labels and the command to look at it (FathomReconcilerStalled may fire too:
        # the reconciler ran its passes before Prometheus started)
        by_name = {a["labels"]["alertname"]: a for a in firing}
        assert WANTED <= set(by_name), firing
        slow = by_name["FathomPptmonHopSlow"]
        assert (slow["labels"]["chain"], slow["labels"]["vnf"], slow["labels"]["severity"]) == ("pslow", "2", "warning")
        assert "fathom pptmon stats pslow" in slow["annotations"]["description"]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    assert proc.returncode in (0, -15)
