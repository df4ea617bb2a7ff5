"""The controller's CPU per API request: one client, one kept-alive connection, calls one after
another (`show`: GET /v1/ports/<id>; `health`: GET /v1/health; `create`: POST /v1/ports, whose
passes are counted too). SQLite store; 1,000 calls each after 50 to warm up.

    PYTHONPATH=<tree> .venv/bin/python docs/benchmarks/scale/http-parser/reqcost.py [CALLS]

The "httptools" side was a worktree whose controller served with uvicorn's httptools protocol
(`http="httptools", proxy_headers=False` in fathom/controller/server.py), the "h11" side main.
"""
import json
import sys
import tempfile
import time
from pathlib import Path

from fathom.bench.scale import Controller

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
run_dir = Path(tempfile.mkdtemp(prefix="reqcost-", dir="/run"))
ctl = Controller(run_dir, f"sqlite:///{run_dir}/fathom.db").start()
out = {}
try:
    api = ctl.api
    net = api.post("/networks", json={"name": "rc-net", "type": "vxlan"})
    api.post("/subnets", json={"network_id": net["id"], "cidr": "10.100.0.0/16"})
    port = api.post("/ports", json={"network_id": net["id"], "name": "rc-p"})
    time.sleep(1)
    for name, call in (("show", lambda i: api.get(f"/ports/{port['id']}")),
                       ("health", lambda i: api.get("/health")),
                       ("create", lambda i: api.post("/ports", json={"network_id": net["id"], "name": f"rc{i}"}))):
        for i in range(50):
            call(-i - 1)
        time.sleep(0.5)
        c0, t0 = ctl.cpu(), time.perf_counter()
        for i in range(N):
            call(i)
        wall = time.perf_counter() - t0
        time.sleep(0.3)
        out[name] = {"cpu_ms": round(1000 * (ctl.cpu() - c0) / N, 3), "wall_ms": round(1000 * wall / N, 3)}
finally:
    ctl.stop()
print(json.dumps(out))
