"""`fathom bench external`: what the floating-IP and SNAT paths cost against the internal path.

Paths (fathom/bench/topologies/external.yaml; docs/external.md):
  internal      vb (c2) -> va (c1), one tenant network over the tunnel: no router, no NAT
  fip_remote    up -> va's floating IP: the gateway node's DNAT, then the tunnel to c1 (the
                centralised design: every floating-IP packet crosses the gateway node)
  fip_local     up -> vg's floating IP, vg on the gateway node itself: the same NAT without the
                tunnel hop, i.e. what a distributed floating IP (NAT on the VM's own node) would cost
  snat          vb (c2) -> up, through the router's SNAT on the gateway node
For each: iperf3 TCP throughput (the first second omitted) and ping RTT, repeats interleaved.
Ratios: every path / internal, and fip_remote / fip_local (the price of centralising).
"""
from __future__ import annotations

import re
from pathlib import Path

from fathom.bench.report import dist, environment
from fathom.client import Client
from fathom.host import iperf
from fathom.lab.lab import Lab
from fathom.lab.topology import load

TOPOLOGY = Path(__file__).parent / "topologies" / "external.yaml"
UPSTREAM = "203.0.113.1"


class ExternalBench:
    def __init__(self, lab_name: str = "exbench", seconds: int = 5, repeats: int = 3,
                 progress=lambda msg, frac=None: None):
        self.lab = Lab(lab_name)
        self.seconds, self.repeats, self.progress = seconds, repeats, progress
        self.topo = load(TOPOLOGY)
        self.ip = {vm.name: str(vm.ip.ip) for _, vm in self.topo.vms()}

    def paths(self, api: Client) -> dict[str, tuple[str, str, str]]:
        """path -> (client, server, address the client sends to)."""
        fip = {f["port_id"]: f["floating_ip_address"] for f in api.get("/floatingips")}
        port = {p["name"]: p["id"] for p in api.get("/ports")}
        return {"internal": ("vb", "va", self.ip["va"]),
                "fip_remote": ("up", "va", fip[port["va"]]),
                "fip_local": ("up", "vg", fip[port["vg"]]),
                "snat": ("vb", "up", UPSTREAM)}

    def tcp_gbps(self, client: str, server: str, address: str) -> float:
        bind = UPSTREAM if server == "up" else self.ip[server]
        args = iperf.client_args(address, seconds=self.seconds, omit=1)
        with iperf.server(self.lab.ns(server), bind):
            out = self.lab.run(client, *args, check=True, timeout=self.seconds + 30).stdout
        return iperf.parse(out, False).gbps

    def rtt_us(self, client: str, address: str, count: int = 200) -> list[float]:
        out = self.lab.run(client, "ping", "-c", str(count), "-i", "0.005", "-W", "1", address, check=True).stdout
        return [float(t) * 1000 for t in re.findall(r"time=([\d.]+) ms", out)]

    def run(self) -> dict:
        self.lab.down()
        try:
            self.progress("bringing up the lab", 0)
            state = self.lab.up(self.topo, str(TOPOLOGY))
            api = Client.for_lab(state, timeout=60)
            paths = self.paths(api)
            for client, _server, address in paths.values():   # ARP and neighbours warm before measuring
                self.lab.run(client, "ping", "-c", "3", "-i", "0.2", "-W", "1", address)
            samples = {p: {"tcp_gbps": [], "rtt_us": []} for p in paths}
            steps = self.repeats * len(paths)
            for r in range(self.repeats):
                for i, (p, (client, server, address)) in enumerate(paths.items()):
                    self.progress(f"{p} (repeat {r + 1}/{self.repeats})", (r * len(paths) + i) / steps)
                    samples[p]["tcp_gbps"].append(self.tcp_gbps(client, server, address))
                    samples[p]["rtt_us"] += self.rtt_us(client, address)
            out = {p: {k: dist(v) for k, v in s.items()} for p, s in samples.items()}
            ratio = lambda a, b, k, stat: out[a][k][stat] / out[b][k][stat]  # noqa: E731
            out["ratios"] = {
                **{f"{p}_vs_internal": {"tcp": ratio(p, "internal", "tcp_gbps", "mean"),
                                        "rtt_p50": ratio(p, "internal", "rtt_us", "p50")}
                   for p in paths if p != "internal"},
                "fip_remote_vs_fip_local": {"tcp": ratio("fip_remote", "fip_local", "tcp_gbps", "mean"),
                                            "rtt_p50": ratio("fip_remote", "fip_local", "rtt_us", "p50")}}
            return {"benchmark": "external", "environment": environment(),
                    "parameters": {"seconds": self.seconds, "repeats": self.repeats, "topology": str(TOPOLOGY),
                                   "paths": {p: {"client": c, "server": s, "to": a} for p, (c, s, a) in paths.items()}},
                    "data_plane": out}
        finally:
            self.lab.down()


def markdown(doc: dict) -> str:
    dp = doc["data_plane"]
    lines = ["| path | TCP Gb/s (mean ± sd) | RTT p50 µs | RTT p99 µs | TCP vs internal | RTT p50 vs internal |",
             "|---|---|---|---|---|---|"]
    for p in ("internal", "fip_remote", "fip_local", "snat"):
        d, r = dp[p], dp["ratios"].get(f"{p}_vs_internal", {"tcp": 1.0, "rtt_p50": 1.0})
        lines.append(f"| {p} | {d['tcp_gbps']['mean']:.2f} ± {d['tcp_gbps']['stdev']:.2f} | "
                     f"{d['rtt_us']['p50']:.0f} | {d['rtt_us']['p99']:.0f} | {r['tcp']:.2f} | {r['rtt_p50']:.2f} |")
    c = dp["ratios"]["fip_remote_vs_fip_local"]
    lines.append(f"\nCentralised vs on the VM's node (fip_remote / fip_local): TCP {c['tcp']:.2f}, "
                 f"RTT p50 {c['rtt_p50']:.2f}.")
    return "\n".join(lines) + "\n"
