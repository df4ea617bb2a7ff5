"""`fathom bench secgroups`: what a security group of 100 rules costs against none, side by side.

One lab (two compute nodes, one VXLAN network): VM src on c1 sends to dst1 on c1 (same node) and to dst2 on
c2 (across the tunnel). Two modes, interleaved over repeats on the same lab and ports:

- `none`: the three ports without port security (no conntrack, no rules);
- `sg100`: the three ports in one group of 100 rules — egress to anywhere, ingress TCP 5201 (iperf3)
  and TCP 7000 (the connection test), and 97 ingress rules that match none of this traffic (other
  ports, other prefixes) — every packet through conntrack and the conjunctive rule matches.

Per mode and path: iperf3 TCP throughput, and new TCP connections per second (clients in src connect
to a listener in dst and close at once, with RST so no TIME_WAIT piles up; every connection is a new
conntrack entry in two zones). The figures are ratios sg100 / none (target ≥ 0.9).
"""
from __future__ import annotations

import subprocess
import time

from fathom.bench.report import dist
from fathom.client import Client
from fathom.host.iperf import iperf3
from fathom.lab.lab import Lab
from fathom.lab.ovs import wait_for
from fathom.lab.topology import parse

TOPOLOGY = """
networks:
  - {name: bench, type: vxlan, segmentation_id: 1401, cidr: 198.19.41.0/24, project: bench}
nodes:
  - name: c1
    vms:
      - {name: src, mac: "02:fe:00:00:41:0b", ip: 198.19.41.11/24, network: bench}
      - {name: dst1, mac: "02:fe:00:00:41:0c", ip: 198.19.41.12/24, network: bench}
  - name: c2
    vms:
      - {name: dst2, mac: "02:fe:00:00:41:15", ip: 198.19.41.21/24, network: bench}
"""
IPS = {"src": "198.19.41.11", "dst1": "198.19.41.12", "dst2": "198.19.41.21"}
PATHS = {"same_node": ("src", "dst1"), "cross_node": ("src", "dst2")}
MODES = ("none", "sg100")
CONN_PORT = 7000
RULES = 100
TARGET = 0.9

SERVER = f"""
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {CONN_PORT}))
s.listen(4096)
while True:
    c, _ = s.accept()
    c.close()
"""
CLIENT = """
import socket, struct, sys, time
ip, seconds = sys.argv[1], float(sys.argv[2])
linger = struct.pack("ii", 1, 0)
done = failed = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
    s.settimeout(1.0)
    try:
        s.connect((ip, %d))
        done += 1
    except OSError:
        failed += 1
    s.close()
print(done, failed)
""" % CONN_PORT


class SecgroupsBench:
    def __init__(self, lab_name: str = "sgb", seconds: int = 5, repeats: int = 3, clients: int = 2,
                 progress=lambda msg: None):
        self.lab = Lab(lab_name)
        self.seconds, self.repeats, self.clients = seconds, repeats, clients
        self.progress = progress
        self.topo = parse(TOPOLOGY, "<bench secgroups>")

    # ------------------------------------------------------------------ modes
    def setup(self, api: Client) -> None:
        self.api = api
        self.ports = {p["name"]: p["id"] for p in api.get("/ports") if p["name"] in IPS}
        group = api.post("/security-groups", json={"name": "bench100", "project_id": "bench"})
        rules = [{"direction": "egress"},
                 {"direction": "ingress", "protocol": "tcp", "port_range_min": 5201},
                 {"direction": "ingress", "protocol": "tcp", "port_range_min": CONN_PORT}]
        rules += [{"direction": "ingress", "protocol": "tcp" if i % 2 else "udp", "port_range_min": 20000 + i,
                   "remote_ip_prefix": f"10.{i}.0.0/16"} for i in range(RULES - len(rules))]
        for r in rules:
            api.post("/security-group-rules", json={"security_group_id": group["id"], **r})
        self.group = group["id"]

    def mode(self, name: str) -> None:
        """Put the three ports in mode `name` and wait until both br-ints show it."""
        body = ({"port_security": False, "security_groups": []} if name == "none"
                else {"port_security": True, "security_groups": [self.group]})
        for pid in self.ports.values():
            self.api.patch(f"/ports/{pid}", json=body)

        def shown() -> bool:
            for node in ("c1", "c2"):
                flows = self.lab.ovs(node).ofctl("dump-flows", "br-int", "table=32")
                want = {f"reg5={pid:#x} " for name, pid in self.ports.items()
                        if self.lab_node(name) == node}
                present = all(w in flows for w in want)
                if present != (name == "sg100"):
                    return False
            return True
        wait_for(shown, timeout=60, what=f"mode {name} on the switches")
        time.sleep(1.0)

    def lab_node(self, vm: str) -> str:
        return next(n.name for n, v in self.topo.vms() if v.name == vm)

    # ------------------------------------------------------------------ measurements
    def throughput(self, src: str, dst: str) -> float:
        r = iperf3(self.lab.ns(src), self.lab.ns(dst), IPS[dst], seconds=self.seconds, omit=1)
        return r.gbps

    def connections(self, src: str, dst: str) -> dict:
        server = subprocess.Popen(["ip", "netns", "exec", self.lab.ns(dst), "python3", "-c", SERVER],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            clients = [subprocess.Popen(["ip", "netns", "exec", self.lab.ns(src), "python3", "-c", CLIENT,
                                         IPS[dst], str(self.seconds)], stdout=subprocess.PIPE, text=True)
                       for _ in range(self.clients)]
            done = failed = 0
            for c in clients:
                out = c.communicate(timeout=self.seconds + 60)[0].split()
                done, failed = done + int(out[0]), failed + int(out[1])
        finally:
            server.kill()
            server.wait()
        return {"per_second": done / self.seconds, "failed": failed}

    # ------------------------------------------------------------------ run
    def run(self) -> dict:
        self.lab.down()
        try:
            self.progress("bringing up the lab")
            state = self.lab.up(self.topo, "<bench secgroups>")
            self.setup(Client.for_lab(state, timeout=60))
            samples = {m: {p: {"tcp_gbps": [], "connections_per_second": [], "connections_failed": []}
                           for p in PATHS} for m in MODES}
            for r in range(self.repeats):
                for m in (MODES if r % 2 == 0 else MODES[::-1]):     # interleaved, order alternating
                    self.mode(m)
                    for path, (src, dst) in PATHS.items():
                        self.progress(f"repeat {r + 1}/{self.repeats}: {m} {path}")
                        samples[m][path]["tcp_gbps"].append(self.throughput(src, dst))
                        c = self.connections(src, dst)
                        samples[m][path]["connections_per_second"].append(c["per_second"])
                        samples[m][path]["connections_failed"].append(c["failed"])
            out = {m: {p: {k: dist(v) for k, v in s.items()} for p, s in by.items()} for m, by in samples.items()}
            ratios = {p: {k: out["sg100"][p][k]["p50"] / out["none"][p][k]["p50"]
                          for k in ("tcp_gbps", "connections_per_second")} for p in PATHS}
            return {"benchmark": "secgroups", "rules": RULES, "target_ratio": TARGET,
                    "parameters": {"seconds": self.seconds, "repeats": self.repeats, "clients": self.clients},
                    "results": out, "ratio_sg100_over_none": ratios,
                    "meets_target": all(v >= TARGET for r in ratios.values() for v in r.values())}
        finally:
            self.lab.down()


def markdown(doc: dict) -> str:
    lines = ["| path | TCP Gb/s none | TCP Gb/s sg100 | ratio | conn/s none | conn/s sg100 | ratio |",
             "|---|---|---|---|---|---|---|"]
    res, rat = doc["results"], doc["ratio_sg100_over_none"]
    for p in PATHS:
        n, s = res["none"][p], res["sg100"][p]
        lines.append(f"| {p} | {n['tcp_gbps']['p50']:.2f} | {s['tcp_gbps']['p50']:.2f} | {rat[p]['tcp_gbps']:.2f} | "
                     f"{n['connections_per_second']['p50']:.0f} | {s['connections_per_second']['p50']:.0f} | "
                     f"{rat[p]['connections_per_second']:.2f} |")
    lines.append(f"\nmedians of {doc['parameters']['repeats']} interleaved repeats; target ratio ≥ {doc['target_ratio']}: "
                 f"{'met' if doc['meets_target'] else 'NOT met'}")
    return "\n".join(lines) + "\n"
