"""The controller's CPU per port create (one writer, ports bound to node n000), first with no
agent long-poll held, then with one long-poll of `GET /v1/agents/<node>/desired` held for each of
NODES nodes (as their agents hold them; an admin token, so none counts as a heartbeat), and the
long-polls answered meanwhile. SQLite store; the nodes are unreachable lab addresses.

    PYTHONPATH=<tree> .venv/bin/python docs/benchmarks/scale/agent-wake/agentwake.py [NODES] [CREATES] >> results.jsonl
"""
import http.client
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from fathom.bench.scale import Controller
NODES = int(sys.argv[1]) if len(sys.argv) > 1 else 100
K = int(sys.argv[2]) if len(sys.argv) > 2 else 200
d = Path(tempfile.mkdtemp(prefix="agentwake-", dir="/run"))
ctl = Controller(d, f"sqlite:///{d}/s.db").start()
out = {"nodes": NODES, "creates": K}
stop = threading.Event()
answers = [0] * NODES
try:
    api = ctl.api
    for i in range(NODES):
        api.post("/nodes", json={"name": f"n{i:03d}", "management_ip": f"198.18.{i // 200}.{i % 200 + 1}",
                                 "tunnel_ip": f"198.19.{i // 200}.{i % 200 + 1}"})
    net = api.post("/networks", json={"name": "aw-net", "type": "vxlan"})
    api.post("/subnets", json={"network_id": net["id"], "cidr": "10.100.0.0/16"})
    host, port = ctl.url.split("//")[1].split(":")

    def creates(tag):
        c0 = ctl.cpu()
        for i in range(K):
            api.post("/ports", json={"network_id": net["id"], "name": f"{tag}{i}", "node": "n000",
                                     "interface_name": f"{tag}{i}"})
        time.sleep(1.5)
        return round(1000 * (ctl.cpu() - c0) / K, 2)

    out["cpu_ms_per_create_no_polls"] = creates("a")

    def poller(i):
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        rev = None
        while not stop.is_set():
            q = f"?after={rev}&timeout=30" if rev is not None else ""
            try:
                conn.request("GET", f"/v1/agents/n{i:03d}/desired{q}", headers={"Authorization": f"Bearer {ctl.token}"})
                rev = json.loads(conn.getresponse().read())["revision"]
            except OSError:   # the controller stopped
                return
            answers[i] += 1
    threads = [threading.Thread(target=poller, args=(i,), daemon=True) for i in range(NODES)]
    for t in threads:
        t.start()
    time.sleep(3)
    a0 = sum(answers)
    out["cpu_ms_per_create_with_polls"] = creates("b")
    out["answers_during_creates"] = sum(answers) - a0
    c0 = ctl.cpu(); time.sleep(10)
    out["cpu_s_at_rest_10s_with_polls"] = round(ctl.cpu() - c0, 3)
finally:
    stop.set()
    ctl.stop()
out["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                               cwd=Path(__import__("fathom").__file__).parent).stdout.strip()
out["at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
print(json.dumps(out))
