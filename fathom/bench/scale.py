"""`fathom bench scale`: the controller at scale, against simulated switches and a real store.

Three measurements, each against a real `fathom controller` process (plain TCP on loopback):

- **API create rate**: 8 concurrent writers create ports through the REST API, on SQLite and on
  PostgreSQL (a private server with its default durability); ports/s and p50/p99 per call.
- **Fabric scale**: N simulated nodes (fathom.bench.ofswitch: a switch in memory speaking OpenFlow 1.4
  to the controller over TCP, with a real `ovsdb-server` per node for the bootstrap and port numbers)
  at 10, 1,000 and 10,000 ports: port-up latency (API call → `active` through Client.wait_status),
  the controller's CPU time per change, and a full resync of every wiped switch.
- (The full resync of a real OVS bridge is measured by `fathom bench tenant`'s bulk section and by
  `resync_real` here, with a lab.)

Progress goes to `progress(msg)`; every figure comes back as one JSON-able document.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fathom.bench.report import dist
from fathom.client import ApiError, Client

RUN_ROOT = Path("/run/fathom-bench")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its threads so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def free_port(host: str = "127.0.0.1") -> int:
    import socket
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Controller:
    """A `fathom controller` process of this benchmark: its store, state and log in `run_dir`."""
    run_dir: Path
    db_url: str
    of_host: str = "127.0.0.1"
    interval: float = 5.0
    proc: subprocess.Popen | None = None
    api: Client | None = None

    def start(self) -> "Controller":
        from fathom.auth.client import read_token_file
        from fathom.auth.tokens import ADMIN_TOKEN_FILE
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.api_port, self.of_port = free_port(), free_port(self.of_host)
        fathom = Path(sys.executable).with_name("fathom")
        cmd = [str(fathom), "controller", "--db", self.db_url, "--api-port", str(self.api_port),
               "--of-host", self.of_host, "--of-port", str(self.of_port), "--interval", str(self.interval),
               "--state-dir", str(self.run_dir), "--insecure"]
        log = open(self.run_dir / "controller.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.api_port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the controller exited ({self.proc.returncode}); see {self.run_dir}/controller.log")
            try:
                self.token = read_token_file(self.run_dir / ADMIN_TOKEN_FILE)
                probe = Client(self.url, token=self.token, timeout=2)
                probe.health()
                self.api = probe
                return self
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the controller did not answer on {self.url} within 60 s")

    def client(self, timeout: float = 60) -> Client:
        return Client(self.url, token=self.token, timeout=timeout)

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.api is not None:
            self.api.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---------------------------------------------------------------------------------------------- API rate


def api_rate(ctl: Controller, writers: int = 8, ports: int = 2000, shared_network: bool = True,
             progress=lambda msg: None) -> dict:
    """`writers` threads, each with its own connection, create `ports` ports in all (bound to a node,
    one address allocated from the subnet each); ports/s over the wall time and per-call latency.

    `shared_network`: every writer creates in one network (the worst case: allocations in one
    network are serialised); otherwise each writer has its own network (tenants side by side).
    """
    api = ctl.api
    tag = f"w{int(time.time() * 1000) % 10**8}"
    node = api.post("/nodes", json={"name": f"{tag}-node", "management_ip": "127.0.0.1", "tunnel_ip": "127.0.0.1"})
    nets = []
    for i in range(1 if shared_network else writers):
        net = api.post("/networks", json={"name": f"{tag}-net{i}", "type": "vxlan"})
        api.post("/subnets", json={"network_id": net["id"], "cidr": f"10.{100 + i}.0.0/16"})
        nets.append(net["id"])
    per_writer = ports // writers
    latencies: list[list[float]] = [[] for _ in range(writers)]
    errors: list[str] = []
    start = threading.Barrier(writers + 1)

    def writer(w: int) -> None:
        client = ctl.client()
        net = nets[w % len(nets)]
        try:
            start.wait()
            for i in range(per_writer):
                t0 = time.perf_counter()
                try:
                    client.post("/ports", json={"network_id": net, "name": f"{tag}-{w}-{i}", "node": node["name"],
                                                "interface_name": f"if{w}x{i}"})
                except ApiError as e:
                    errors.append(str(e))
                latencies[w].append((time.perf_counter() - t0) * 1000)
        finally:
            client.close()

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(writers)]
    for t in threads:
        t.start()
    cpu0 = ctl.cpu()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu = ctl.cpu() - cpu0
    done = writers * per_writer - len(errors)
    every = [x for lat in latencies for x in lat]
    progress(f"api: {done} ports in {wall:.1f} s = {done / wall:.0f}/s")
    return {"writers": writers, "ports": done, "errors": errors[:10], "n_errors": len(errors),
            "shared_network": shared_network, "seconds": wall, "ports_per_second": done / wall,
            "per_call_ms": dist(every), "controller_cpu_s": cpu,
            "controller_cpu_ms_per_port": 1000 * cpu / done if done else None}
