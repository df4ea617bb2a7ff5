"""A controller at rest whose nodes are all unreachable (registered, no OVSDB at their address):
its CPU and its log lines over three windows of 5 s, after 5 s to settle.

    PYTHONPATH=<tree> .venv/bin/python docs/benchmarks/scale/unreachable/rest.py [NODES] >> results.jsonl
"""
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fathom.bench.scale import Controller

NODES = int(sys.argv[1]) if len(sys.argv) > 1 else 100
run_dir = Path(tempfile.mkdtemp(prefix="unreachable-", dir="/run"))
ctl = Controller(run_dir, f"sqlite:///{run_dir}/fathom.db").start()
log = run_dir / "controller.log"
try:
    for i in range(NODES):   # lab addresses nothing listens on
        ctl.api.post("/nodes", json={"name": f"n{i:03d}", "management_ip": f"198.18.{i // 200}.{i % 200 + 1}",
                                     "tunnel_ip": f"198.19.{i // 200}.{i % 200 + 1}"})
    time.sleep(5)
    cpu, lines = [], []
    for _ in range(3):
        c0, n0 = ctl.cpu(), sum(1 for _ in log.open())
        time.sleep(5)
        cpu.append(round(ctl.cpu() - c0, 2))
        lines.append(sum(1 for _ in log.open()) - n0)
finally:
    ctl.stop()
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                        cwd=Path(__import__("fathom").__file__).parent).stdout.strip()
print(json.dumps({"nodes": NODES, "commit": commit, "controller_cpu_s_per_5s": cpu, "log_lines_per_5s": lines,
                  "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
