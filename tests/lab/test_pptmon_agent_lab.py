"""PPTMon records reach the controller: a 2-VNF chain with PPTMon on, `fathom agent run` on this
host delivering the sink's records to a real `fathom controller` process, and
`fathom pptmon stats --controller` answering for every VNF (root; veth, tc, iptables).

Names start with 'pa' (chain pa1, namespaces pa1-*); addresses 198.18.231-233.0/24."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fathom.auth.client import lab_headers
from fathom.auth.tokens import write_secret
from fathom.lab.controller import start_controller, stop_controller
from fathom.pptmon import control, measure, native

from .test_pptmon_lab import make_chain  # noqa: F401  (fixture)

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0 or not native.built() or not shutil.which("iptables"),
                       reason="needs root, the native build and iptables"),
]

FATHOM = [str(Path(sys.executable).with_name("fathom"))] if Path(sys.executable).with_name("fathom").exists() \
    else [sys.executable, "-m", "fathom.cli.main"]


def fathom(*args, timeout=30, token_file=None) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"FATHOM_TOKEN_FILE": str(token_file)} if token_file else {})}
    return subprocess.run([*FATHOM, *args], capture_output=True, text=True, timeout=timeout, env=env)


def until(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out ({timeout} s) waiting for {what}")


def test_records_reach_the_controller(make_chain, tmp_path):  # noqa: F811
    ctl_dir = tmp_path / "ctl"
    ctl_dir.mkdir()
    agent = None
    ctl = start_controller(ctl_dir, "127.0.0.1")
    try:
        url = ctl["url"]
        admin = lab_headers({"controller": ctl})
        # the agent delivers with its node's agent token, written to a 0600 file as an operator would
        agent_token = tmp_path / "agent-token"
        made = httpx.post(url + "/v1/tokens", headers=admin, json={"project_id": "admin", "roles": ["agent"],
                                                                    "node": "pa-node"}).json()
        write_secret(agent_token, made["token"])
        c = make_chain("pa1", ["firewall:20", "forward"], base=230)
        control.enable(c.name, period_ns=5_000_000)          # 200 samples/s
        state = tmp_path / "agent"
        agent = subprocess.Popen([*FATHOM, "agent", "run", "--controller", url, "--chain", c.name,
                                  "--node", "pa-node", "--state-dir", str(state), "--flush", "0.2",
                                  "--poll", "0.1", "--log-interval", "1", "--token-file", str(agent_token)],
                                 stdout=open(tmp_path / "agent.log", "wb"), stderr=subprocess.STDOUT,
                                 start_new_session=True)
        sent, got = measure.transfer(c, "udp", count=600, rate=1000)
        assert got == sent
        sent, got = measure.transfer(c, "tcp", bytes=100_000)
        assert got == sent
        local = until(lambda: len(control.records(c.name)) >= 50 and control.records(c.name), 5,
                      "local records")
        time.sleep(0.3)                                      # the loader drains every 100 ms
        n_local = len(control.records(c.name))
        api = httpx.Client(base_url=url, headers=admin, timeout=10)

        def delivered():
            s = api.get("/v1/pptmon/stats", params={"chain": c.name, "window": "10m"}).json()
            return s if s["records"] >= n_local else None
        s = until(delivered, 20, f"{n_local} records at the controller "
                                 f"(agent log: {(tmp_path / 'agent.log').read_text()[-500:]})")
        assert s["records"] == n_local, "every record once, none twice"
        assert set(s["vnfs"]) == {"1", "2"} and s["e2e"]["count"] == n_local
        stored = api.get("/v1/pptmon/records", params={"chain": c.name, "limit": 10_000}).json()
        assert {(r["ktime_ns"], r["seq"]) for r in stored} == {(r["ktime_ns"], r["seq"]) for r in local} | \
            {(r["ktime_ns"], r["seq"]) for r in control.records(c.name)}
        assert all(r["node"] == "pa-node" and [h["vnf"] for h in r["hops"]] == [1, 2] for r in stored)
        assert {r["flow"]["proto"] for r in stored} == {"udp", "tcp"}

        # the operator's view, from the controller
        out = fathom("pptmon", "stats", c.name, "--controller", url, "--json", token_file=ctl["token_file"])
        assert out.returncode == 0, out.stderr
        js = json.loads(out.stdout)
        assert set(js["vnfs"]) == {"1", "2"} and all(v["count"] == n_local for v in js["vnfs"].values())
        out = fathom("pptmon", "stats", c.name, "--controller", url, token_file=ctl["token_file"])
        assert out.returncode == 0 and "vnf1" in out.stdout and "vnf2" in out.stdout and "end-to-end" in out.stdout
        # Prometheus on the controller's /metrics
        metrics = api.get("/metrics").text
        for vnf in ("1", "2"):
            line = f'fathom_pptmon_vnf_processing_seconds_count{{chain="{c.name}",node="pa-node",vnf="{vnf}"}} {float(n_local)}'
            assert line in metrics
        assert f'fathom_pptmon_chain_processing_seconds_count{{chain="{c.name}",node="pa-node"}} {float(n_local)}' in metrics
        # the agent's own account
        until(lambda: json.loads((state / "status.json").read_text())["counters"]["delivered"] == n_local, 3,
              "agent status")
        st = json.loads(fathom("agent", "status", "--state-dir", str(state), "--json").stdout)
        assert st["running"] and st["counters"]["rejected"] == 0 and st["counters"]["invalid"] == 0
        assert st["counters"]["dropped_overflow"] == 0
    finally:
        if agent is not None:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(10)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait(5)
        control.disable("pa1", missing_ok=True)
        stop_controller(ctl_dir)
        control.down("pa1")
