"""`fathom bench tenant`: data-plane and control-plane figures of tenant networking, in one run.

Data plane: iperf3 TCP and UDP throughput and ping RTT for L2 same node, L2 cross node (VXLAN) and
L3 cross subnet cross node, interleaved over repeats and reported as ratios to same-node L2.
Control plane: API call → first packet through for a new port (p50/p99), and the rate at which flows
land on one bridge while many ports are created.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from fathom.client import Client
from fathom.host.exec import argv
from fathom.host.iperf import iperf3

from fathom.bench.report import dist, environment
from fathom.lab.lab import Lab
from fathom.lab.topology import load

TOPOLOGY = Path(__file__).parent / "topologies" / "tenant.yaml"
PATHS = {"l2_same_node": ("a1", "a2"), "l2_cross_node": ("a1", "b1"), "l3_cross_node": ("a1", "g1")}



class TenantBench:
    def __init__(self, lab_name: str = "bt", seconds: int = 5, repeats: int = 3, udp_mbps: int = 2000,
                 ports: int = 100, bulk_ports: int = 10000, progress=lambda msg, frac=None: None):
        self.lab = Lab(lab_name)
        self.seconds, self.repeats, self.udp_mbps = seconds, repeats, udp_mbps
        self.n_ports, self.bulk_ports = ports, bulk_ports
        self.progress = progress
        self.topo = load(TOPOLOGY)
        self.ip = {vm.name: str(vm.ip.ip) for _, vm in self.topo.vms()}

    # ------------------------------------------------------------------ helpers
    def sh(self, target: str, *cmd: str, timeout: float = 120) -> str:
        return self.lab.run(target, *cmd, check=True, timeout=timeout).stdout

    def iperf(self, client: str, server: str, udp: bool) -> dict:
        r = iperf3(self.lab.ns(client), self.lab.ns(server), self.ip[server], seconds=self.seconds, omit=1,
                   **({"udp_mbps": self.udp_mbps, "length": 1400} if udp else {}))
        if udp:  # what the receiver got, at an offered load above what the path carries
            return {"gbps": r.gbps, "loss_percent": r.loss_percent}
        return {"gbps": r.gbps, "retransmits": r.retransmits}

    def rtt_us(self, client: str, server: str, count: int = 200) -> list[float]:
        out = self.sh(client, "ping", "-c", str(count), "-i", "0.005", "-W", "1", self.ip[server])
        return [float(t) * 1000 for t in re.findall(r"time=([\d.]+) ms", out)]

    # ------------------------------------------------------------------ data plane
    def data_plane(self) -> dict:
        samples = {p: {"tcp_gbps": [], "udp_gbps": [], "udp_loss_percent": [], "rtt_us": []} for p in PATHS}
        steps = self.repeats * len(PATHS)
        for r in range(self.repeats):
            for i, (path, (src, dst)) in enumerate(PATHS.items()):  # interleaved: drift hits every path
                self.progress(f"data plane {path} (repeat {r + 1}/{self.repeats})", (r * len(PATHS) + i) / steps)
                samples[path]["tcp_gbps"].append(self.iperf(src, dst, udp=False)["gbps"])
                udp = self.iperf(src, dst, udp=True)
                samples[path]["udp_gbps"].append(udp["gbps"])
                samples[path]["udp_loss_percent"].append(udp["loss_percent"])
                samples[path]["rtt_us"] += self.rtt_us(src, dst)
        out = {p: {k: dist(v) for k, v in s.items()} for p, s in samples.items()}
        base = out["l2_same_node"]
        for p, d in out.items():
            d["ratio_to_l2_same_node"] = {
                "tcp": d["tcp_gbps"]["mean"] / base["tcp_gbps"]["mean"],
                "udp": d["udp_gbps"]["mean"] / base["udp_gbps"]["mean"],
                "rtt_p50": d["rtt_us"]["p50"] / base["rtt_us"]["p50"]}
        out["l3_over_l2_cross_node"] = {
            "tcp": out["l3_cross_node"]["tcp_gbps"]["mean"] / out["l2_cross_node"]["tcp_gbps"]["mean"],
            "udp": out["l3_cross_node"]["udp_gbps"]["mean"] / out["l2_cross_node"]["udp_gbps"]["mean"],
            "target": 0.95}
        return out

    # ------------------------------------------------------------------ control plane
    def _new_vm(self, name: str, mac: str, ip: str) -> None:
        ns, node_ns = self.lab.ns(name), self.lab.ns("compute1")
        for cmd in (["ip", "netns", "add", ns],
                    ["ip", "link", "add", name, "netns", node_ns, "type", "veth", "peer", "name", "eth0", "netns", ns],
                    ["ip", "-n", ns, "link", "set", "eth0", "address", mac],
                    ["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"],
                    ["ip", "-n", ns, "link", "set", "eth0", "up"], ["ip", "-n", node_ns, "link", "set", name, "up"],
                    argv(["ethtool", "-K", "eth0", "tx", "off"], ns),
                    argv(["ethtool", "-K", name, "tx", "off"], node_ns),
                    # static neighbours: the figure is the switch's, not ARP's retry timer
                    ["ip", "-n", ns, "neigh", "replace", self.ip["b1"], "lladdr", "02:be:00:00:00:03", "dev", "eth0"],
                    ["ip", "-n", self.lab.ns("b1"), "neigh", "replace", ip, "lladdr", mac, "dev", "eth0"]):
            subprocess.run(cmd, check=True, capture_output=True)
        self.lab.ovs("compute1").vsctl("add-port", "br-int", name)

    def port_to_traffic(self, api: Client, net_id: int) -> dict:
        """API call → first echo reply from a VM on another node, and → status active."""
        to_traffic, to_active = [], []
        for i in range(self.n_ports):
            self.progress(f"control plane: new port {i + 1}/{self.n_ports}", i / self.n_ports)
            name, mac, ip = f"p{i}", f"02:be:00:01:{i >> 8:02x}:{i & 0xff:02x}", f"198.19.11.{100 + i % 150}"
            if i >= 150:
                raise ValueError("at most 150 ports in this measurement")
            self._new_vm(name, mac, ip)
            probe = subprocess.Popen(argv(["ping", "-D", "-i", "0.002", "-w", "10", "-W", "0.05", self.ip["b1"]],
                                           self.lab.ns(name)), stdout=subprocess.PIPE, text=True)
            time.sleep(0.2)
            t0 = time.time()
            port = api.post("/ports", json={"network_id": net_id, "name": name, "mac_address": mac,
                                            "fixed_ips": [{"ip_address": ip}], "node": "compute1",
                                            "interface_name": name, "project_id": "bench"})
            while api.get(f"/ports/{port['id']}")["status"] != "active":
                if time.time() - t0 > 10:
                    break
                time.sleep(0.005)
            to_active.append((time.time() - t0) * 1000)
            first = None
            for line in probe.stdout:
                m = re.match(r"\[([\d.]+)\].*time=", line)
                if m:
                    first = float(m.group(1))
                    break
            probe.kill()
            probe.wait()
            if first is not None:
                to_traffic.append((first - t0) * 1000)
        return {"api_to_first_packet_ms": dist(to_traffic), "api_to_status_active_ms": dist(to_active),
                "ports": self.n_ports, "ports_without_traffic": self.n_ports - len(to_traffic)}

    def flow_install_rate(self, api: Client, net_id: int) -> dict:
        """Create many ports bound to compute2 and watch compute1's br-int fill with their flows."""
        ovs = self.lab.ovs("compute1")

        def flow_count() -> int:
            return int(re.search(r"flow_count=(\d+)", ovs.ofctl("dump-aggregate", "br-int")).group(1))

        start_flows = flow_count()
        t0 = time.monotonic()
        timeline = [(0.0, start_flows)]
        for i in range(self.bulk_ports):
            api.post("/ports", json={"network_id": net_id, "name": f"bulk{i}", "node": "compute2",
                                     "interface_name": f"bulk{i}", "fixed_ips": [],
                                     "mac_address": f"02:bf:{i >> 16 & 0xff:02x}:{i >> 8 & 0xff:02x}:{i & 0xff:02x}:01",
                                     "project_id": "bench"})
            if i % 250 == 0:
                self.progress(f"control plane: bulk port {i}/{self.bulk_ports}", i / self.bulk_ports)
                timeline.append((time.monotonic() - t0, flow_count()))
        api_done = time.monotonic() - t0
        last, stable_since = flow_count(), time.monotonic()
        while time.monotonic() - stable_since < 8:   # settled: no change for 8 s
            time.sleep(0.5)
            n = flow_count()
            timeline.append((time.monotonic() - t0, n))
            if n != last:
                last, stable_since = n, time.monotonic()
        end = max(t for t, n in timeline if n == last)
        added = last - start_flows
        # the switch alone: wipe br-int and time one reconcile pass putting every flow back
        self.progress("control plane: full reinstall", None)
        ovs.ofctl("del-flows", "br-int")
        t1 = time.monotonic()
        api.post("/sync", timeout=600)
        reinstall = time.monotonic() - t1
        return {"ports": self.bulk_ports, "flows_added": added, "seconds": end,
                "flows_per_second": added / end if end else None, "api_ports_per_second": self.bulk_ports / api_done,
                "reinstall_flows": flow_count(), "reinstall_seconds": reinstall,
                "reinstall_flows_per_second": flow_count() / reinstall, "timeline": timeline}

    # ------------------------------------------------------------------ run
    def run(self, control_plane: bool = True) -> dict:
        """The whole benchmark in one lab; `control_plane=False` measures the data plane only."""
        self.lab.down()
        try:
            self.progress("bringing up the lab", 0)
            state = self.lab.up(self.topo, str(TOPOLOGY))
            api = Client.for_lab(state, timeout=60)
            net_id = next(n["id"] for n in api.get("/networks") if n["name"] == "blue")
            doc = {"benchmark": "tenant", "environment": environment(),
                   "parameters": {"seconds": self.seconds, "repeats": self.repeats, "udp_offered_mbps": self.udp_mbps,
                                  "new_ports": self.n_ports, "bulk_ports": self.bulk_ports},
                   "data_plane": self.data_plane()}
            if control_plane:
                doc["control_plane"] = {"new_port": self.port_to_traffic(api, net_id)}
                if self.bulk_ports:
                    doc["control_plane"]["bulk"] = self.flow_install_rate(api, net_id)
            return doc
        finally:
            self.lab.down()


def markdown(doc: dict) -> str:
    dp = doc["data_plane"]
    lines = ["| path | TCP Gb/s (mean) | ratio | UDP Gb/s | ratio | UDP loss % | RTT p50 µs | RTT p99 µs |",
             "|---|---|---|---|---|---|---|---|"]
    for p in PATHS:
        d = dp[p]
        lines.append(f"| {p} | {d['tcp_gbps']['mean']:.3f} | {d['ratio_to_l2_same_node']['tcp']:.2f} | "
                     f"{d['udp_gbps']['mean']:.3f} | {d['ratio_to_l2_same_node']['udp']:.2f} | "
                     f"{d['udp_loss_percent']['mean']:.2f} | {d['rtt_us']['p50']:.0f} | {d['rtt_us']['p99']:.0f} |")
    r = dp["l3_over_l2_cross_node"]
    lines.append(f"\nL3 cross node / L2 cross node: TCP {r['tcp']:.3f}, UDP {r['udp']:.3f} (target ≥ {r['target']})")
    cp = doc.get("control_plane", {})
    if "new_port" in cp:
        a, b = cp["new_port"]["api_to_first_packet_ms"], cp["new_port"]["api_to_status_active_ms"]
        lines.append(f"\nNew port, API call → first packet through: p50 {a['p50']:.0f} ms, p99 {a['p99']:.0f} ms "
                     f"(n={a['n']}); → status active: p50 {b['p50']:.0f} ms, p99 {b['p99']:.0f} ms")
    if "bulk" in cp:
        b = cp["bulk"]
        lines.append(f"\n{b['ports']} ports created through the API: {b['flows_added']} flows landed on compute1's "
                     f"br-int in {b['seconds']:.1f} s = {b['flows_per_second']:.0f} flows/s "
                     f"(API accepted {b['api_ports_per_second']:.0f} ports/s). Reinstalling all "
                     f"{b['reinstall_flows']} flows of the wiped bridge in one pass: {b['reinstall_seconds']:.1f} s "
                     f"= {b['reinstall_flows_per_second']:.0f} flows/s")
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dp = doc["data_plane"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    for ax, key, label in zip(axes, ("tcp_gbps", "udp_gbps", "rtt_us"), ("TCP Gb/s", "UDP Gb/s", "RTT µs (p50, p99)")):
        names = list(PATHS)
        vals = [dp[p][key]["p50" if key == "rtt_us" else "mean"] for p in names]
        ax.bar(names, vals, color=["#4c72b0", "#55a868", "#c44e52"])
        if key == "rtt_us":
            ax.scatter(names, [dp[p][key]["p99"] for p in names], color="k", marker="_", s=200, label="p99")
            ax.legend()
        ax.set_title(label)
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
