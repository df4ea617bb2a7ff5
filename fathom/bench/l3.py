"""`fathom bench l3`: the analogue of the fabric paper's Figs. 5-9 on the lab, in one run.

Paths (VMs on two different compute nodes, as in the paper):
  l2             va -> vc, same VLAN network, switched by the fabric switch
  l3 <mode>      va -> vd, two VLAN subnets of one router, the router in mode distributed, fabric
                 or network-node (moved between runs through the API: PATCH /v1/routers/{id} {mode})
For each: iperf3 TCP and UDP throughput, ping RTT, and the CPU time and memory of every node (all
processes of the node's namespace: its ovs-vswitchd does the packet work of the userspace
datapath, kernel forwarding in a router namespace is charged to whoever transmits into it) and of
the fabric switch, while the traffic runs. Repeats are interleaved so drift hits every path alike.

Ratios reported: each L3 mode / network-node (the paper's software baseline), L3 / L2.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

from fathom.client import Client
from fathom.host import iperf
from fathom.host.exec import argv

from fathom.bench import procs
from fathom.bench.report import dist, environment
from fathom.lab.lab import Lab
from fathom.lab.topology import load

TOPOLOGY = Path(__file__).parent / "topologies" / "l3.yaml"
MODES = ("distributed", "fabric", "network-node")
PATHS = {"l2": ("va", "vc", None), **{f"l3_{m}": ("va", "vd", m) for m in MODES}}
NODES = ("c1", "c2", "gw", "fabric")
CLK_TCK = os.sysconf("SC_CLK_TCK")   # /proc/stat unit



class L3Bench:
    def __init__(self, lab_name: str = "tfl3", seconds: int = 5, repeats: int = 3, udp_mbps: int = 1000,
                 progress=lambda msg, frac=None: None):
        self.lab = Lab(lab_name)
        self.seconds, self.repeats, self.udp_mbps = seconds, repeats, udp_mbps
        self.progress = progress
        self.topo = load(TOPOLOGY)
        self.ip = {vm.name: str(vm.ip.ip) for _, vm in self.topo.vms()}

    # ------------------------------------------------------------------ helpers
    def sh(self, target: str, *cmd: str, timeout: float = 120) -> str:
        return self.lab.run(target, *cmd, check=True, timeout=timeout).stdout

    def pids(self, node: str) -> list[int]:
        """Processes of a node: those in its namespace (and in its router namespaces, if any)."""
        out = []
        for ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split():
            if ns == self.lab.ns(node) or ns.startswith(self.lab.ns(node) + "-r"):
                out += [int(p) for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                                       text=True).stdout.split()]
        return out

    @staticmethod
    def cpu_ns(pids: list[int]) -> int:
        """CPU time of the processes, all threads, in ns (schedstat: finer than utime/stime ticks)."""
        return sum(procs.schedstat_ns(pid) for pid in pids)

    @staticmethod
    def rss_mb(pids: list[int]) -> float:
        total = 0
        for pid in pids:
            try:
                m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
                total += int(m.group(1)) if m else 0
            except OSError:
                pass
        return total / 1024

    @staticmethod
    def softirq_ticks() -> int:
        return int(Path("/proc/stat").read_text().splitlines()[0].split()[7])

    def measured(self, fn):
        """Run fn() and return (its result, {node: cpu %, rss MB}) for the time it took."""
        node_pids = {n: self.pids(n) for n in NODES}
        before = {n: self.cpu_ns(p) for n, p in node_pids.items()}
        soft = self.softirq_ticks()
        t0 = time.monotonic()
        result = fn()
        wall = time.monotonic() - t0
        usage = {n: {"cpu_percent": 100 * (self.cpu_ns(p) - before[n]) / 1e9 / wall,
                     "rss_mb": self.rss_mb(p)} for n, p in node_pids.items()}
        usage["softirq_all_cpus_percent"] = 100 * (self.softirq_ticks() - soft) / CLK_TCK / wall
        return result, usage

    def iperf(self, client: str, server: str, udp: bool) -> tuple[dict, dict]:
        # TCP: the first second (slow start) omitted; UDP: no omit (it skews iperf3's loss count)
        args = iperf.client_args(self.ip[server], seconds=self.seconds,
                                 **({"udp_mbps": self.udp_mbps, "length": 1400} if udp else {"omit": 1}))
        with iperf.server(self.lab.ns(server), self.ip[server]):
            raw, usage = self.measured(lambda: self.sh(client, *args, timeout=self.seconds + 30))
        r = iperf.parse(raw, udp)
        if udp:   # what arrived, as the receiver counted it
            return {"gbps": r.gbps, "loss_percent": r.loss_percent}, usage
        return {"gbps": r.gbps, "retransmits": r.retransmits}, usage

    def rtt_us(self, client: str, server: str, count: int = 200) -> list[float]:
        out = self.sh(client, "ping", "-c", str(count), "-i", "0.005", "-W", "1", self.ip[server])
        return [float(t) * 1000 for t in re.findall(r"time=([\d.]+) ms", out)]

    def set_mode(self, api: Client, router_id: int, mode: str) -> None:
        api.patch(f"/routers/{router_id}", json={"mode": mode})
        for _ in range(2):
            api.sync()
        deadline = time.monotonic() + 15
        while api.get(f"/routers/{router_id}")["status"] != "active":
            if time.monotonic() > deadline:
                raise RuntimeError(f"router not active in mode {mode}")
            time.sleep(0.1)
        # traffic follows: wait for a routed echo before measuring
        for _ in range(50):
            if subprocess.run(argv(["ping", "-c", "1", "-W", "1", self.ip["vd"]], self.lab.ns("va")),
                              capture_output=True).returncode == 0:
                return
        raise RuntimeError(f"no routed traffic in mode {mode}")

    # ------------------------------------------------------------------ run
    def data_plane(self, api: Client, router_id: int) -> dict:
        keys = ("tcp_gbps", "tcp_retransmits", "udp_gbps", "udp_loss_percent", "rtt_us")
        samples = {p: {k: [] for k in keys} for p in PATHS}
        usage = {p: {"tcp": [], "udp": []} for p in PATHS}
        steps = self.repeats * len(PATHS)
        for r in range(self.repeats):
            for i, (path, (src, dst, mode)) in enumerate(PATHS.items()):
                self.progress(f"{path} (repeat {r + 1}/{self.repeats})", (r * len(PATHS) + i) / steps)
                if mode:
                    self.set_mode(api, router_id, mode)
                tcp, u_tcp = self.iperf(src, dst, udp=False)
                udp, u_udp = self.iperf(src, dst, udp=True)
                samples[path]["tcp_gbps"].append(tcp["gbps"])
                samples[path]["tcp_retransmits"].append(tcp["retransmits"] or 0)
                samples[path]["udp_gbps"].append(udp["gbps"])
                samples[path]["udp_loss_percent"].append(udp["loss_percent"])
                samples[path]["rtt_us"] += self.rtt_us(src, dst)
                usage[path]["tcp"].append(u_tcp)
                usage[path]["udp"].append(u_udp)
        out = {}
        for p in PATHS:
            d = {k: dist(v) for k, v in samples[p].items()}
            d["resources"] = {}
            for kind in ("tcp", "udp"):
                runs = usage[p][kind]
                d["resources"][kind] = {
                    n: {"cpu_percent": statistics.fmean(u[n]["cpu_percent"] for u in runs),
                        "rss_mb": statistics.fmean(u[n]["rss_mb"] for u in runs)} for n in NODES}
                d["resources"][kind]["nodes_cpu_percent"] = sum(d["resources"][kind][n]["cpu_percent"]
                                                                 for n in ("c1", "c2", "gw"))
                d["resources"][kind]["nodes_rss_mb"] = sum(d["resources"][kind][n]["rss_mb"]
                                                           for n in ("c1", "c2", "gw"))
                d["resources"][kind]["softirq_all_cpus_percent"] = statistics.fmean(
                    u["softirq_all_cpus_percent"] for u in runs)
            out[p] = d
        base, l2 = out["l3_network-node"], out["l2"]
        mean = lambda p, k: out[p][k]["mean"]  # noqa: E731
        out["ratios"] = {
            m: {"tcp_vs_network_node": mean(f"l3_{m}", "tcp_gbps") / base["tcp_gbps"]["mean"],
                "udp_vs_network_node": mean(f"l3_{m}", "udp_gbps") / base["udp_gbps"]["mean"],
                "rtt_p50_vs_network_node": out[f"l3_{m}"]["rtt_us"]["p50"] / base["rtt_us"]["p50"],
                "tcp_vs_l2": mean(f"l3_{m}", "tcp_gbps") / l2["tcp_gbps"]["mean"],
                "udp_vs_l2": mean(f"l3_{m}", "udp_gbps") / l2["udp_gbps"]["mean"],
                "nodes_cpu_per_gbps_vs_network_node":
                    (out[f"l3_{m}"]["resources"]["tcp"]["nodes_cpu_percent"] / mean(f"l3_{m}", "tcp_gbps"))
                    / (base["resources"]["tcp"]["nodes_cpu_percent"] / base["tcp_gbps"]["mean"])}
            for m in MODES}
        out["targets"] = {"fabric_and_distributed_tcp_vs_network_node": 1.5, "l3_vs_l2": 0.95}
        return out

    def run(self) -> dict:
        self.lab.down()
        try:
            self.progress("bringing up the lab", 0)
            state = self.lab.up(self.topo, str(TOPOLOGY))
            api = Client.for_lab(state, timeout=60)
            router_id = api.find("routers", "r1")["id"]
            doc = {"benchmark": "l3", "environment": environment(),
                   "parameters": {"seconds": self.seconds, "repeats": self.repeats, "udp_offered_mbps": self.udp_mbps,
                                  "topology": str(TOPOLOGY)},
                   "data_plane": self.data_plane(api, router_id)}
            return doc
        finally:
            self.lab.down()


def markdown(doc: dict) -> str:
    dp = doc["data_plane"]
    lines = ["| path | TCP Gb/s mean (sd) | UDP Gb/s mean | UDP loss % | RTT p50 / p99 µs | nodes CPU % (TCP) "
             "| Fabric switch CPU % (TCP) | gw CPU % (TCP) | nodes RSS MB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in PATHS:
        d = dp[p]
        res = d["resources"]["tcp"]
        lines.append(f"| {p} | {d['tcp_gbps']['mean']:.3f} ({d['tcp_gbps']['stdev']:.3f}) | {d['udp_gbps']['mean']:.3f} "
                     f"| {d['udp_loss_percent']['mean']:.1f} | {d['rtt_us']['p50']:.0f} / {d['rtt_us']['p99']:.0f} "
                     f"| {res['nodes_cpu_percent']:.0f} | {res['fabric']['cpu_percent']:.0f} "
                     f"| {res['gw']['cpu_percent']:.0f} | {res['nodes_rss_mb']:.0f} |")
    lines += ["", "| L3 mode | TCP / network-node | UDP / network-node | RTT p50 / network-node | TCP / L2 | UDP / L2 "
              "| nodes CPU per Gb/s / network-node |", "|---|---|---|---|---|---|---|"]
    for m, r in dp["ratios"].items():
        lines.append(f"| {m} | {r['tcp_vs_network_node']:.2f} | {r['udp_vs_network_node']:.2f} "
                     f"| {r['rtt_p50_vs_network_node']:.2f} | {r['tcp_vs_l2']:.2f} | {r['udp_vs_l2']:.2f} "
                     f"| {r['nodes_cpu_per_gbps_vs_network_node']:.2f} |")
    t = dp["targets"]
    lines.append(f"\nTargets: fabric and distributed TCP ≥ {t['fabric_and_distributed_tcp_vs_network_node']}× "
                 f"network-node; L3 ≥ {t['l3_vs_l2']} of L2.")
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dp = doc["data_plane"]
    names = list(PATHS)
    colors = ["#8172b2", "#4c72b0", "#55a868", "#c44e52"]
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.6))
    for ax, key, label in zip(axes[:3], ("tcp_gbps", "udp_gbps", "rtt_us"),
                              ("TCP Gb/s (Fig. 5)", "UDP Gb/s (Fig. 6)", "RTT µs p50, p99 (Fig. 7)")):
        vals = [dp[p][key]["p50" if key == "rtt_us" else "mean"] for p in names]
        ax.bar(names, vals, color=colors)
        if key == "rtt_us":
            ax.scatter(names, [dp[p][key]["p99"] for p in names], color="k", marker="_", s=200, label="p99")
            ax.set_yscale("log")
            ax.legend()
        else:
            ax.errorbar(names, vals, yerr=[dp[p][key]["stdev"] for p in names], fmt="none", ecolor="k")
        ax.set_title(label)
        ax.tick_params(axis="x", labelsize=7, rotation=20)
    ax = axes[3]
    bottom = [0.0] * len(names)
    for node, c in zip(("c1", "c2", "gw", "fabric"), ("#4c72b0", "#55a868", "#c44e52", "#999999")):
        vals = [dp[p]["resources"]["tcp"][node]["cpu_percent"] for p in names]
        ax.bar(names, vals, bottom=bottom, color=c, label=node if node != "fabric" else "fabric switch")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_title("CPU % during TCP (Fig. 8)")
    ax.legend(fontsize=7)
    ax.tick_params(axis="x", labelsize=7, rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
